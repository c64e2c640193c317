"""Delegation chains (PROTOCOL.md §12.7): acting on behalf of someone, narrowed at every hop.

Pure, no I/O: decisions on tokens, resolved keys and a clock value passed in. A value layer
below the protocol core, like :mod:`a2a_secure.policy` (an ``Identity`` issues tokens with
it, the stores name revoked tokens with it). The server's
adapter (:mod:`a2a_secure.protocol.server.delegation`) resolves each issuer's DID and checks
the deny list; the client's side lives in :mod:`a2a_secure.client.http`.

A *link* is a compact JWS (``typ`` ``a2a-delegation+jws``) by ``iss`` granting ``aud`` a
scope on behalf of ``sub`` (the principal, the root link's issuer) from ``nbf`` to ``exp``.
A *chain* is a list of links, root first: each next link is signed by the previous link's
audience, names the hash of the previous link's token as ``parent``, and only narrows the
scope (goals, highest priority, targets) and the window. A chain is named by the hash of its
leaf's token, which commits to every link above it through the ``parent`` hashes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from a2a_secure.checks import ErrorType, require_did, require_int, require_str
from a2a_secure.errors import A2AError, AuthenticationFailed, InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.did import split_key_id
from a2a_secure.identity.jws import Decoded, Signer, jws_decode_unverified, jws_sign, jws_verify

__all__ = [
    "CHAIN_UNKNOWN",
    "CHAIN_UNKNOWN_MEMBER",
    "DELEGATION",
    "MAX_CHAIN_CHARS",
    "MAX_DEPTH",
    "MAX_LINK_CHARS",
    "MAX_TTL",
    "REVOCATION_PREFIX",
    "TYP",
    "Chain",
    "DelegationRefused",
    "DelegationRules",
    "Link",
    "check_bounds",
    "check_member",
    "check_revocation_target",
    "issue",
    "load_chain",
    "parse_chain",
    "reference_of",
    "verify_signatures",
]

DELEGATION: Final = "delegation"
"""The extension's name in the card's ``a2a_secure_extensions``, and the ``intent`` member."""
TYP: Final = "a2a-delegation+jws"
MAX_DEPTH: Final = 5
# Checked on the undecoded strings, before any base64 or JSON work (a size bomb costs nothing).
MAX_LINK_CHARS: Final = 4096
MAX_CHAIN_CHARS: Final = 16384
MAX_TTL: Final = 30 * 86_400  # the longest window one link may grant (seconds)
MAX_GOALS: Final = 64
MAX_TARGETS: Final = 16
# A link may come into force this much before its nbf (clock skew, as for §9 timestamps);
# it is never accepted at or after its exp.
NBF_SKEW: Final = 300
CHAIN_UNKNOWN: Final = "is unknown on this session; send it in full"
"""The end of the refusal of a chain named by a hash the answering server does not hold."""
CHAIN_UNKNOWN_MEMBER: Final = "chain_unknown"
"""The member of that refusal's signed ``data``: the name the client sent (send it in full)."""
REVOCATION_PREFIX: Final = "delegation:"
"""A deny-list target ``delegation:<jti>`` revokes the one link with that token id."""
# The priorities of §12.3 (a2a_secure.protocol.priority, above this layer).
MIN_PRIORITY: Final = 1
MAX_PRIORITY: Final = 5
DEFAULT_PRIORITY: Final = 3

_REQUIRED: Final = frozenset(("iss", "aud", "sub", "jti", "nbf", "exp", "goals", "max_priority"))
_OPTIONAL: Final = frozenset(("targets", "parent"))
_B64U: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class DelegationRefused(PolicyViolation):
    """A delegation chain does not let this caller do this here and now (-32042)."""

    default_message = "delegation refused"


def _refuse(message: str, at: int | None = None) -> DelegationRefused:
    where = "" if at is None else f" link {at}:"
    return DelegationRefused(f"delegation refused:{where} {message}"[:400])


def _check_jti(value: Any, error: ErrorType) -> str:
    if not isinstance(value, str) or not 22 <= len(value) <= 64 or not _B64U.issuperset(value):
        raise error("jti must be 22-64 base64url characters")
    return value


def check_revocation_target(target: str) -> str:
    """``target`` if it is ``delegation:<jti>`` with a well-formed token id, else ``InvalidParams``."""
    if not target.startswith(REVOCATION_PREFIX):
        raise InvalidParams("a delegation token id is written delegation:<jti>")
    jti = target[len(REVOCATION_PREFIX) :]
    if not isinstance(jti, str) or not 22 <= len(jti) <= 64 or not _B64U.issuperset(jti):
        raise InvalidParams("a delegation token id is 22-64 base64url characters")
    return target


def _str_list(value: Any, what: str, limit: int, error: ErrorType, *, dids: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= limit:
        raise error(f"{what} must be an array of 1 to {limit} strings")
    for item in value:
        if dids:
            require_did(item, what, error)
        else:
            require_str(item, what, min_len=1, max_len=128, error=error)
    if len(set(value)) != len(value):
        raise error(f"{what} must hold distinct strings")
    return tuple(value)


def check_member(value: Any, error: ErrorType = InvalidParams) -> tuple[str, ...] | str:
    """The ``intent.delegation`` member's form (§6.1 step 1): a chain or a chain's hash.

    Only the JSON types are checked here (-32602); the bounds of depth and size are a
    refusal of the chain (:func:`check_bounds`), signed like the others.
    """
    if isinstance(value, str):
        if not encoding.is_hash_string(value):
            raise error("delegation must be an array of tokens or a sha256 hash string")
        return value
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise error("delegation must be an array of tokens or a sha256 hash string")
    return tuple(value)


def check_bounds(tokens: Sequence[str], error: ErrorType = DelegationRefused) -> None:
    """1 to :data:`MAX_DEPTH` tokens of at most :data:`MAX_LINK_CHARS` characters and
    :data:`MAX_CHAIN_CHARS` in all: counted on the strings, before anything is decoded."""
    if not 1 <= len(tokens) <= MAX_DEPTH:
        raise error(f"delegation refused: a chain has 1 to {MAX_DEPTH} links")
    total = 0
    for token in tokens:
        if len(token) > MAX_LINK_CHARS:
            raise error(f"delegation refused: a link is at most {MAX_LINK_CHARS} characters")
        total += len(token)
    if total > MAX_CHAIN_CHARS:
        raise error(f"delegation refused: a chain is at most {MAX_CHAIN_CHARS} characters")


def reference_of(value: tuple[str, ...] | str) -> str:
    """The chain's name: the hash of its leaf token (a reference names itself).

    A token is ASCII (base64url and dots) once it has passed check 2; the name is taken before
    that, of whatever strings the member holds, so any other character is hashed as UTF-8
    (such a chain is then refused at check 2, signed, like any other malformed link).
    """
    if isinstance(value, str):
        return value
    return encoding.hash_bytes(value[-1].encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class Link:
    """One verified-in-form link (its signature is checked by :func:`verify_signatures`)."""

    token: str
    hash: str
    kid: str
    issuer: str
    audience: str
    principal: str
    jti: str
    nbf: int
    exp: int
    goals: tuple[str, ...]
    max_priority: int
    targets: tuple[str, ...] | None
    parent: str | None
    decoded: Decoded = field(compare=False, repr=False)

    def allows_goal(self, goal: str) -> bool:
        """``*`` allows every goal; otherwise the goal is listed."""
        return "*" in self.goals or goal in self.goals

    def hop(self) -> dict[str, Any]:
        """What a handler is told about this hop."""
        out: dict[str, Any] = {
            "issuer": self.issuer,
            "audience": self.audience,
            "goals": list(self.goals),
            "max_priority": self.max_priority,
            "nbf": self.nbf,
            "exp": self.exp,
        }
        if self.targets is not None:
            out["targets"] = list(self.targets)
        return out


def _parse_link(token: str, at: int) -> Link:
    try:
        decoded = jws_decode_unverified(token)
    except InvalidParams as exc:
        raise _refuse(f"not a compact JWS ({exc.message})", at) from None
    header, payload = decoded[0], decoded[1]
    if header.get("typ") != TYP:
        raise _refuse(f"JWS typ must be {TYP}", at)
    error = DelegationRefused
    try:
        if not _REQUIRED <= payload.keys() <= _REQUIRED | _OPTIONAL:
            extra = sorted(payload.keys() - _REQUIRED - _OPTIONAL)
            raise error(f"unexpected member {extra[0][:64]!r}" if extra else "missing a required member")
        issuer = require_did(payload["iss"], "iss", error)
        audience = require_did(payload["aud"], "aud", error)
        principal = require_did(payload["sub"], "sub", error)
        jti = _check_jti(payload["jti"], error)
        nbf = require_int(payload["nbf"], "nbf", error=error)
        exp = require_int(payload["exp"], "exp", error=error)
        goals = _str_list(payload["goals"], "goals", MAX_GOALS, error)
        max_priority = require_int(
            payload["max_priority"], "max_priority", minimum=MIN_PRIORITY, maximum=MAX_PRIORITY, error=error
        )
        targets = None
        if "targets" in payload:
            targets = _str_list(payload["targets"], "targets", MAX_TARGETS, error, dids=True)
        parent = payload.get("parent")
        if "parent" in payload and not encoding.is_hash_string(parent):
            raise error("parent must be a sha256 hash string")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise error("JWS kid must be a string")
        try:
            kid_did = split_key_id(kid)[0]
        except InvalidParams:
            raise error("JWS kid is not a key id") from None
    except DelegationRefused as exc:
        raise _refuse(exc.message, at) from None
    # The key comes from resolving iss, and only a key of iss's own document may sign.
    if kid_did != issuer:
        raise _refuse("JWS kid does not belong to the issuer's DID", at)
    if not nbf < exp or exp - nbf > MAX_TTL:
        raise _refuse(f"the window must have nbf < exp and last at most {MAX_TTL} s", at)
    if issuer == audience:
        raise _refuse("a link may not delegate to its own issuer", at)
    link_hash = encoding.hash_bytes(token.encode("ascii"))
    return Link(
        token, link_hash, kid, issuer, audience, principal, jti, nbf, exp,
        goals, max_priority, targets, parent, decoded,
    )  # fmt: skip


def _check_narrower(link: Link, parent: Link, at: int) -> None:
    """``link`` may only narrow ``parent``: the rules a compromised hop cannot break."""
    if link.parent is None or link.parent != parent.hash:
        raise _refuse("parent is not the hash of the previous link (a spliced chain)", at)
    if link.issuer != parent.audience:
        raise _refuse("issuer is not the previous link's audience", at)
    if link.principal != parent.principal:
        raise _refuse("sub differs from the chain's principal", at)
    if "*" not in parent.goals and not set(link.goals) <= set(parent.goals):
        raise _refuse("goals widen the previous link's", at)
    if link.max_priority > parent.max_priority:
        raise _refuse("max_priority widens the previous link's", at)
    if link.nbf < parent.nbf or link.exp > parent.exp:
        raise _refuse("the window is not inside the previous link's", at)
    if parent.targets is not None and (link.targets is None or not set(link.targets) <= set(parent.targets)):
        raise _refuse("targets widen the previous link's", at)


def parse_chain(tokens: Sequence[str]) -> Chain:
    """The chain of ``tokens`` (root first), checked in form and in the narrowing rules.

    Signatures are not checked here (:func:`verify_signatures`), nor time, audience,
    target or revocation (:meth:`Chain.check_use` and the adapter): those change with every use.
    Raises :class:`DelegationRefused` naming the first link that breaks a rule.
    """
    check_bounds(tokens)
    links: list[Link] = []
    seen: set[str] = set()
    for at, token in enumerate(tokens):
        link = _parse_link(token, at)
        if at == 0:
            if link.parent is not None:
                raise _refuse("the root link has no parent", at)
            if link.principal != link.issuer:
                raise _refuse("the root link's sub must be its issuer (the principal)", at)
        else:
            _check_narrower(link, links[-1], at)
        # A DID met twice is a loop (A → B → A); so is a repeated token id.
        if link.issuer in seen or link.jti in seen:
            raise _refuse("a DID or token id appears twice in the chain (a loop)", at)
        seen.update((link.issuer, link.jti))
        links.append(link)
    if links[-1].audience in seen:
        raise _refuse("a DID appears twice in the chain (a loop)", len(links) - 1)
    return Chain(tuple(links))


def verify_signatures(chain: Chain, key_for: Callable[[Link], bytes]) -> None:
    """Check each link's signature with the key ``key_for`` resolved from its issuer's DID.

    ``key_for`` raises :class:`DelegationRefused` when the DID does not list the ``kid``.
    """
    for at, link in enumerate(chain.links):
        try:
            jws_verify(link.token, key_for(link), typ=TYP, kid=link.kid, decoded=link.decoded)
        except AuthenticationFailed as exc:
            raise _refuse(exc.message, at) from None


@dataclass(frozen=True, slots=True)
class Chain:
    """A delegation chain, root first; its scope is its leaf's (each link only narrows)."""

    links: tuple[Link, ...]

    @property
    def leaf(self) -> Link:
        """The last link: its audience is the one who may use the chain."""
        return self.links[-1]

    @property
    def principal(self) -> str:
        """On whose behalf: the root issuer."""
        return self.links[0].issuer

    @property
    def audience(self) -> str:
        """The DID that may use the chain (the leaf's audience)."""
        return self.leaf.audience

    @property
    def hash(self) -> str:
        """The chain's name: the hash of the leaf's token."""
        return self.leaf.hash

    @property
    def tokens(self) -> list[str]:
        """The wire form: the tokens, root first."""
        return [link.token for link in self.links]

    @property
    def hops(self) -> list[dict[str, Any]]:
        """Issuer, audience and scope of each hop, root first."""
        return [link.hop() for link in self.links]

    @property
    def exp(self) -> int:
        """When the chain stops working (the leaf's window lies inside every other)."""
        return self.leaf.exp

    def refusal(
        self, *, now: float, client_did: str, server_did: str, goal: str, priority: int = DEFAULT_PRIORITY
    ) -> DelegationRefused | None:
        """Why this chain does not cover ``goal`` from ``client_did`` at ``server_did`` now, or None.

        Checked at every use: the time moves, and one chain serves many intents. The two
        halves: :meth:`refusal_now` (checks 6-7) and :meth:`refusal_for` (check 8).
        """
        return self.refusal_now(now=now, client_did=client_did, server_did=server_did) or self.refusal_for(
            goal, priority
        )

    def refusal_now(self, *, now: float, client_did: str, server_did: str) -> DelegationRefused | None:
        """Checks 6 and 7 (§12.7): whoever uses it, here, now; None when they pass."""
        if self.audience != client_did:
            return _refuse("the chain is delegated to another DID than this session's client")
        for at, link in enumerate(self.links):
            if now >= link.exp:
                return _refuse(f"expired at {link.exp}", at)
            if now < link.nbf - NBF_SKEW:
                return _refuse(f"not valid before {link.nbf}", at)
            if link.targets is not None and server_did not in link.targets:
                return _refuse("this agent is not among the link's targets", at)
        return None

    def refusal_for(self, goal: str, priority: int = DEFAULT_PRIORITY) -> DelegationRefused | None:
        """Check 8 (§12.7): ``goal`` at ``priority`` is within the chain's scope; None when it is.

        Made for every goal the intent runs, a goal run inside another included."""
        leaf = self.leaf
        if not leaf.allows_goal(goal):
            return _refuse(f"goal {goal[:64]!r} is outside the delegated goals")
        if priority > leaf.max_priority:
            return _refuse(f"priority {priority} is above the delegated {leaf.max_priority}")
        return None

    def check_use(
        self, *, now: float, client_did: str, server_did: str, goal: str, priority: int = DEFAULT_PRIORITY
    ) -> None:
        """:meth:`refusal`, raised."""
        refused = self.refusal(
            now=now, client_did=client_did, server_did=server_did, goal=goal, priority=priority
        )
        if refused is not None:
            raise refused

    def dumps(self) -> str:
        """The file form: a JSON array of the tokens."""
        return encoding.dumps(self.tokens).decode()

    def further(
        self,
        identity: Signer,
        *,
        to: str,
        goals: Iterable[str] | None = None,
        now: float,
        ttl: int | None = None,
        targets: Iterable[str] | None = None,
        max_priority: int | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> Chain:
        """This chain with one more link, by ``identity`` (the leaf's audience) to ``to``.

        Unnamed scope members are the leaf's; the window ends at the leaf's ``exp`` or after
        ``ttl``, whichever is first. Anything wider than the leaf raises before it is signed.
        """
        if identity.did != self.audience:
            raise InvalidParams("only the chain's audience may delegate it further")
        leaf = self.leaf
        exp = leaf.exp if ttl is None else min(leaf.exp, int(now) + ttl)
        token = _sign(
            identity,
            audience=to,
            principal=self.principal,
            goals=leaf.goals if goals is None else goals,
            nbf=max(leaf.nbf, int(now)),
            exp=exp,
            targets=leaf.targets if targets is None else targets,
            max_priority=leaf.max_priority if max_priority is None else max_priority,
            parent=leaf.hash,
            random_bytes=random_bytes,
        )
        return _checked([*self.tokens, token])


def _checked(tokens: list[str]) -> Chain:
    try:
        return parse_chain(tokens)
    except DelegationRefused as exc:
        raise InvalidParams(exc.message) from None


def _sign(
    identity: Signer,
    *,
    audience: str,
    principal: str,
    goals: Iterable[str],
    nbf: int,
    exp: int,
    targets: Iterable[str] | None,
    max_priority: int,
    parent: str | None,
    random_bytes: Callable[[int], bytes],
) -> str:
    payload: dict[str, Any] = {
        "iss": identity.did,
        "aud": audience,
        "sub": principal,
        "jti": encoding.b64u_encode(random_bytes(16)),
        "nbf": nbf,
        "exp": exp,
        "goals": list(goals),
        "max_priority": max_priority,
    }
    if targets is not None:
        payload["targets"] = list(targets)
    if parent is not None:
        payload["parent"] = parent
    return jws_sign(payload, identity, TYP)


def issue(
    identity: Signer,
    *,
    to: str,
    goals: Iterable[str],
    ttl: int,
    now: float,
    targets: Iterable[str] | None = None,
    max_priority: int = MAX_PRIORITY,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> Chain:
    """A one-link chain: ``identity`` (the principal) grants ``to`` ``goals`` for ``ttl`` s."""
    token = _sign(
        identity,
        audience=to,
        principal=identity.did,
        goals=goals,
        nbf=int(now),
        exp=int(now) + ttl,
        targets=targets,
        max_priority=max_priority,
        parent=None,
        random_bytes=random_bytes,
    )
    return _checked([token])


def load_chain(text: str | bytes) -> Chain:
    """A chain from its file form (a JSON array of tokens); ``InvalidParams`` if malformed."""
    value = encoding.loads(text.encode() if isinstance(text, str) else text, error=InvalidParams)
    form = check_member(value)
    if isinstance(form, str):
        raise InvalidParams("a delegation file holds the chain's tokens, not its hash")
    return _checked(list(form))


@dataclass(frozen=True, slots=True)
class DelegationRules:
    """A server's delegation configuration: the goals that need someone to act for.

    ``required_principals``: goal → the principals (DIDs) on whose behalf it may run; an
    intent for such a goal without a chain from one of them is refused (-32042), so an agent
    cannot act "on its own" for it. ``max_cached_chains``: verified chains kept per session.
    """

    required_principals: Mapping[str, frozenset[str]] = field(default_factory=dict)
    max_cached_chains: int = 8

    @classmethod
    def build(cls, required_principals: Mapping[str, Iterable[str]] | None = None) -> DelegationRules:
        """Rules from plain mappings (DIDs checked)."""
        req = {
            goal: frozenset(require_did(d, "principal") for d in dids)
            for goal, dids in (required_principals or {}).items()
        }
        return cls(required_principals=req)

    @classmethod
    def from_member(cls, value: Any, where: str = "delegation") -> DelegationRules:
        """The rules of a configuration's ``delegation`` member: ``{goal: [principal DIDs]}``.

        ``{}`` accepts delegation chains and reserves no goal. The one reading of the member,
        for a policy file (``a2a-secure serve --policy``) and an app's own settings alike;
        ``ValueError`` naming ``where`` and the fix for anything else.
        """
        shape = (
            f"{where} must be an object {{goal: [principal DIDs]}} ({{}} accepts chains, reserves no goal)"
        )
        if not isinstance(value, Mapping) or not all(
            isinstance(goal, str) and 1 <= len(goal) <= 128 for goal in value
        ):
            raise ValueError(shape)
        reserved: dict[str, frozenset[str]] = {}
        for goal, dids in value.items():
            if not isinstance(dids, list | tuple | frozenset | set) or not dids:
                raise ValueError(f"{where}[{goal!r}] must be a non-empty array of principal DIDs")
            try:
                reserved[goal] = frozenset(require_did(d, f"{where}[{goal!r}] entry {d!r}") for d in dids)
            except InvalidParams as exc:
                raise ValueError(exc.message) from None
        return cls(required_principals=reserved)

    def to_member(self) -> dict[str, list[str]]:
        """The ``delegation`` member these rules are read from (:meth:`from_member`)."""
        return {goal: sorted(dids) for goal, dids in sorted(self.required_principals.items())}

    def refusal(self, goal: str, chain: Chain | None) -> A2AError | None:
        """Why ``goal`` may not run with ``chain`` (None: no chain), or None."""
        return self.refusal_of(goal, None if chain is None else chain.principal)

    def refusal_of(self, goal: str, principal: str | None) -> A2AError | None:
        """Why ``goal`` may not run on behalf of ``principal`` (None: nobody's), or None.

        ``principal``: the principal of a chain that covers ``goal`` (a verified chain's root
        issuer, or the one stored with an action asked under such a chain), never a DID a
        request names.
        """
        allowed = self.required_principals.get(goal)
        if allowed is None:
            return None
        if principal is None:
            return _refuse(
                f"intent {goal[:64]!r} runs only on behalf of a principal: send a delegation chain"
            )
        if principal not in allowed:
            return _refuse(f"intent {goal[:64]!r} may not run on behalf of {principal[:128]}")
        return None
