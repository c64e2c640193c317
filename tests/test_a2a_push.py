"""Push-notification URLs of a2a-sdk agents behind the DID session (server-side request forgery).

``PushUrlPolicy`` is the ``push_url_validator`` the SDK calls when a config is created and
before each notification. Names are resolved by an injected resolver here (no network); the
end-to-end test in test_a2a_binding.py runs it inside the SDK's request handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a.auth.user import UnauthenticatedUser
from a2a.server.context import ServerCallContext
from a2a.server.tasks import BasePushNotificationSender, InMemoryPushNotificationConfigStore
from a2a.types import TaskPushNotificationConfig, TaskState, TaskStatus, TaskStatusUpdateEvent
from http_helpers import Rebinding
from test_a2a_sealed import read_body

from a2a_secure.a2a_binding import PushUrlPolicy
from a2a_secure.testing import serve_app

DNS = {
    "hooks.example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "rebound.example.com": ["93.184.216.34", "10.0.0.7"],  # one private answer is enough to refuse
    "metadata.example.com": ["169.254.169.254"],
    "mapped.example.com": ["::ffff:127.0.0.1"],
    "scoped.example.com": ["fe80::1%eth0"],
    "empty.example.com": [],
}


async def fake_resolve(host: str, port: int) -> list[str]:
    if host == "slow.example.com":
        await asyncio.sleep(10)
    if host not in DNS:
        raise OSError("name does not resolve")
    return DNS[host]


POLICY = PushUrlPolicy(resolve=fake_resolve, timeout=0.2)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/a2a",
        "https://hooks.example.com:8443/a2a?x=1",
        "https://93.184.216.34/hook",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
    ],
)
async def test_public_https_urls_are_accepted(url: str) -> None:
    assert await POLICY(url) is True


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/a2a",  # not https
        "ftp://hooks.example.com/",
        "https://user:pw@hooks.example.com/",  # user info
        "https://127.0.0.1/x",
        "https://[::1]/x",
        "https://10.1.2.3/x",
        "https://169.254.169.254/latest/meta-data/",
        "https://[::ffff:169.254.169.254]/",
        "https://localhost/x",
        "https://api.localhost/x",
        "https://intranet/x",  # no dot: completed with search domains
        "https://metadata.google.internal/",
        "https://printer.local/",
        "https://rebound.example.com/",
        "https://metadata.example.com/",
        "https://mapped.example.com/",
        "https://scoped.example.com/",
        "https://empty.example.com/",
        "https://unknown.example.com/",  # does not resolve: refused, not guessed
        "https://slow.example.com/",  # resolution past the timeout
        "https://[fe80::1%25eth0]/",
        "https://hooks.example.com:99999/",  # port out of range
        "not a url",
        "",
    ],
)
async def test_unsafe_urls_are_refused(url: str) -> None:
    assert await POLICY(url) is False


async def test_allow_listed_hosts_and_http_are_opt_in() -> None:
    internal = PushUrlPolicy(resolve=fake_resolve, allow_hosts=["Receiver.Internal"], allow_http=True)
    assert await internal("http://receiver.internal:8080/hook") is True
    assert await internal("https://receiver.internal/hook") is True
    assert await internal("http://hooks.example.com/a2a") is True
    assert await internal("http://other.internal/hook") is False
    assert await internal("http://127.0.0.1/hook") is False


# -- DNS rebinding: the sender dials the address that was checked ----------------------------------
class DialByName(httpx.AsyncBaseTransport):
    """What a plain HTTP client does: resolve the name again when it connects (here with the
    same rebinding resolver, standing in for the system's), then dial what it got."""

    def __init__(self, resolve: Rebinding) -> None:
        self.resolve = resolve
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        (address, *_) = await self.resolve(request.url.host, request.url.port or 80)
        request.url = request.url.copy_with(host=address)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[int, list[tuple[str, bytes]]]]:
    """A real HTTP server on loopback, keeping each request's Host header and body."""
    got: list[tuple[str, bytes]] = []

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        got.append((dict(scope["headers"]).get(b"host", b"").decode(), body))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serve_app(app) as url:
        yield int(url.rsplit(":", 1)[1]), got


async def notify(policy: PushUrlPolicy, http: httpx.AsyncClient, url: str) -> None:
    """The SDK's own sender posting a task's status to a config naming ``url``."""
    store = InMemoryPushNotificationConfigStore()
    context = ServerCallContext(user=UnauthenticatedUser())
    await store.set_info(
        "task-1", TaskPushNotificationConfig(task_id="task-1", id="c", url=url, token="tok"), context
    )
    sender = BasePushNotificationSender(http, store, push_url_validator=policy)
    status = TaskStatusUpdateEvent(
        task_id="task-1", context_id="ctx", status=TaskStatus(state=TaskState.TASK_STATE_WORKING)
    )
    await sender.send_notification("task-1", status)


async def test_a_name_that_rebinds_to_loopback_after_the_check_gets_nothing() -> None:
    async with receiver() as (port, got):
        url = f"http://hooks.example.com:{port}/hook"
        # The setup documented before: the policy checks, a plain client dials the name again.
        dns = Rebinding(["93.184.216.34"], ["127.0.0.1"])
        policy = PushUrlPolicy(resolve=dns, allow_http=True)
        async with httpx.AsyncClient(transport=DialByName(dns)) as plain:
            await notify(policy, plain, url)
        assert dns.asked == 2 and len(got) == 1  # the task reached loopback
        got.clear()
        # The policy's own client resolves once more, checks that answer, and dials it.
        dns = Rebinding(["93.184.216.34"], ["127.0.0.1"])
        policy = PushUrlPolicy(resolve=dns, allow_http=True)
        async with policy.client() as pinned:
            await notify(policy, pinned, url)
        assert dns.asked == 2 and got == []


async def test_the_policy_client_dials_the_checked_address_with_the_name_as_host() -> None:
    async with receiver() as (port, got):
        # An allow-listed internal receiver: any address, but the one resolved, not another.
        dns = Rebinding(["127.0.0.1"], ["127.0.0.1"])
        policy = PushUrlPolicy(resolve=dns, allow_http=True, allow_hosts=["hooks.example.com"])
        async with policy.client() as pinned:
            await notify(policy, pinned, f"http://hooks.example.com:{port}/hook")
        ((host, body),) = got  # hooks.example.com resolves nowhere else: the pinned dial reached it
        assert host == f"hooks.example.com:{port}" and b"TASK_STATE_WORKING" in body


async def test_every_address_of_the_answer_is_checked_at_the_dial() -> None:
    async with receiver() as (port, got):
        mixed = ["93.184.216.34", "127.0.0.1"]  # a public answer beside the loopback one
        dns = Rebinding(mixed, mixed)
        policy = PushUrlPolicy(resolve=dns, allow_http=True)
        async with policy.client() as pinned:
            with pytest.raises(httpx.ConnectError, match="may not be dialled"):
                await pinned.post(f"http://hooks.example.com:{port}/hook", json={})
            with pytest.raises(httpx.ConnectError, match="may not be dialled"):
                await pinned.post(f"http://127.0.0.1:{port}/hook", json={})  # a literal too
        assert got == []


async def test_the_pinned_dial_verifies_tls_for_the_name_not_the_address() -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hooks.example.com").configure_cert(server_ssl)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    got: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        got.append(await read_body(receive))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serve_app(app, ssl_context=server_ssl) as url:
        port = int(url.rsplit(":", 1)[1])
        dns = Rebinding(["127.0.0.1"], ["127.0.0.1"])
        for name, reached in (("hooks.example.com", True), ("other.example.com", False)):
            policy = PushUrlPolicy(resolve=dns, allow_hosts=[name])
            async with policy.client(verify=trusting) as pinned:
                if reached:
                    assert (await pinned.post(f"https://{name}:{port}/hook", json={})).status_code == 204
                else:  # the certificate names another host: refused, though the address is the same
                    with pytest.raises(httpx.ConnectError):
                        await pinned.post(f"https://{name}:{port}/hook", json={})
    assert len(got) == 1
