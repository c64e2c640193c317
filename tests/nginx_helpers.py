"""nginx for the tests: a TLS-terminating reverse proxy run by the test itself, and a tap.

Tests that need nginx SKIP with a clear reason when its binary is missing, and FAIL instead
when ``A2A_SECURE_REQUIRE_NGINX=1`` (CI sets it after installing nginx, so a missing nginx
cannot pass silently), as Redis tests do (tests/redis_helpers.py).

* :func:`nginx_proxy`: ``nginx -g 'daemon off;'`` with a config and a prefix directory of
  its own under a temporary directory (never the system service), listening with TLS on a
  free loopback port and forwarding, in plain HTTP/1.1, to an upstream address;
* :class:`Tap`: a TCP relay between nginx and the server that records the bytes of that
  inner hop, both ways: what any TLS-terminating gateway sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_ENV = "A2A_SECURE_REQUIRE_NGINX"
_CANDIDATES = ("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it when ``A2A_SECURE_REQUIRE_NGINX=1``."""
    if os.environ.get(REQUIRE_ENV, "") == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(f"{reason} (set {REQUIRE_ENV}=1 to make this a failure)")


def nginx_binary() -> str:
    """The nginx binary, or skip/fail with the reason."""
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    skip_or_fail("nginx is not installed (Debian: apt-get install nginx-light)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tap:
    """A loopback TCP relay to ``upstream`` that records every byte it forwards."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.to_server = bytearray()
        self.to_proxy = bytearray()
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def holds(self, needle: str) -> bool:
        """Whether ``needle`` crossed the inner hop, either way."""
        data = needle.encode()
        return data in self.to_server or data in self.to_proxy

    async def __aenter__(self) -> Tap:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, log: bytearray) -> None:
            try:
                while chunk := await src.read(65536):
                    log.extend(chunk)
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer, self.to_server), pipe(up_reader, writer, self.to_proxy))


_CONF = """
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    client_max_body_size 2m;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {prefix}/cert.pem;
        ssl_certificate_key {prefix}/key.pem;
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 30s;
        }}
    }}
}}
"""


@contextlib.asynccontextmanager
async def nginx_proxy(
    prefix: Path, cert_pem: bytes, key_pem: bytes, upstream_port: int
) -> AsyncIterator[str]:
    """Run nginx terminating TLS on a free port in front of ``upstream_port``; yield its URL."""
    binary = nginx_binary()
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi", "logs"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    (prefix / "cert.pem").write_bytes(cert_pem)
    (prefix / "key.pem").write_bytes(key_pem)
    port = free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(_CONF.format(prefix=prefix, port=port, upstream=upstream_port))
    # Not the system service: its own prefix and config, in the foreground, stopped below.
    proc = await asyncio.create_subprocess_exec(
        *[binary, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        for _ in range(200):
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
                pytest.fail(f"nginx did not start: {err[-500:]}", pytrace=False)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            await asyncio.sleep(0.025)
        else:
            pytest.fail("nginx did not listen within 5 s", pytrace=False)
        yield f"https://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
