"""Push-notification URLs of a2a-sdk agents behind the DID session (server-side request forgery).

``PushUrlPolicy`` is the ``push_url_validator`` the SDK calls when a config is created and
before each notification. Names are resolved by an injected resolver here (no network); the
end-to-end test in test_a2a_binding.py runs it inside the SDK's request handler.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("a2a", reason="the a2a-sdk is an optional extra: pip install 'a2a-secure[a2a]'")

from a2a_secure.a2a_binding import PushUrlPolicy

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
