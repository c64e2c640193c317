"""Keys held by a signing service: Ed25519 signatures that take milliseconds and are awaited.

A cloud KMS (AWS KMS ``ECC_NIST_EDWARDS25519``, Google Cloud KMS ``EC_SIGN_ED25519``), Vault's
transit engine (``ed25519``) or an HSM behind a network answers a signature in milliseconds.
A server that called such a key in place would stop its event loop for every answer, and
answer one request at a time. The protocol a holder of such a key follows:

* It is a :class:`~a2a_secure.identity.keys.KeyHolder` (``public_key``, ``sign``,
  ``derive_key``, ``export_seed``) with one more method, ``async def sign_async(message)``.
  :class:`~a2a_secure.identity.keys.Identity` sees it (``Identity.remote``).
* The server's runtime awaits ``sign_async`` for every signature made while serving: each
  answer, stream event, handshake step and signed refusal. The core never waits for it: where
  a token goes it writes a :class:`~a2a_secure.identity.jws.PendingJWS` (the signing input),
  and the runtime (:mod:`a2a_secure.runtime.signing`) awaits the signature and puts the token
  in its place before anything is sent or stored. Many signatures are in flight at once, so
  ``sign_async`` must allow concurrent calls; it bounds them itself if its service needs it.
* Every signature a remote holder returns is verified against its public key before it is
  used: a service that answers with another key, or garbage, fails closed
  (:class:`~a2a_secure.identity.keys.SignerFailed`, a 503 -32048 the client may retry;
  nothing goes out signed).
* ``sign`` (blocking) is used where nothing else waits: the command line, start-up (the
  agent card), issuing a delegation chain, a rotation statement, and the audit log's
  checkpoints (one per ``checkpoint_every`` records; see SECURITY.md).
* ``derive_key`` is an HMAC the service computes (AWS ``GenerateMac``, Google ``MacSign``,
  Vault ``/transit/hmac``), or a :class:`~a2a_secure.identity.keys.KeyFileError` naming
  what is missing; it is used for approval actions kept sealed at rest and a client's
  answer key of a sealed ``intent_id`` (called in place, like ``sign``).

:class:`ThreadedKey` makes a blocking holder (a client library without an async API, a
PKCS#11 token) follow the protocol by running each signature in a worker thread. Worked
adapters for the three services are in ``examples/remote_signers/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import MutableMapping
from typing import Any, Protocol, runtime_checkable

from a2a_secure.identity.jws import PendingJWS
from a2a_secure.identity.keys import KeyHolder

__all__ = ["RemoteKeyHolder", "ThreadedKey", "finish_tokens"]


async def finish_tokens(message: MutableMapping[str, Any]) -> None:
    """Sign, in place, each member of ``message`` that is a :class:`PendingJWS` (a handshake
    message the client core wrote with a remote key): what a caller of the sans-I/O client
    core does before it sends the message. Raises ``SignerFailed``."""
    for name, value in list(message.items()):
        if isinstance(value, PendingJWS):
            message[name] = await value.sign()


@runtime_checkable
class RemoteKeyHolder(KeyHolder, Protocol):
    """A :class:`~a2a_secure.identity.keys.KeyHolder` whose signatures are awaited."""

    async def sign_async(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``, from the service."""
        ...


class ThreadedKey:
    """A blocking :class:`~a2a_secure.identity.keys.KeyHolder` whose signatures run in worker
    threads: the event loop goes on while the service (or token) signs.

    ``max_workers`` bounds the signatures in flight at once (the service's own limit, or its
    client's connection pool). A holder that serialises its calls itself (one PKCS#11
    session) gains a free event loop, not parallel signatures.
    """

    __slots__ = ("_holder", "_pool")

    def __init__(self, holder: KeyHolder, *, max_workers: int = 16) -> None:
        if type(max_workers) is not int or max_workers < 1:
            raise ValueError("max_workers must be a positive int")
        self._holder = holder
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="a2a-sign")

    @property
    def public_key(self) -> bytes:
        return self._holder.public_key

    def sign(self, message: bytes) -> bytes:
        return self._holder.sign(message)

    async def sign_async(self, message: bytes) -> bytes:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._holder.sign, bytes(message))

    def derive_key(self, info: bytes) -> bytes:
        return self._holder.derive_key(info)

    def export_seed(self) -> bytes:
        return self._holder.export_seed()

    def close(self) -> None:
        """Stop the worker threads (signatures already started finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __repr__(self) -> str:
        return f"ThreadedKey({self._holder!r})"

    def __reduce__(self) -> Any:
        raise TypeError("ThreadedKey objects are not picklable (they hold a private key)")
