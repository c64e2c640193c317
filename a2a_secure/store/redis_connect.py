"""redis-py clients for :class:`~a2a_secure.store.redis.RedisStore` from one URL.

Three deployments, three URL forms:

* one Redis: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS),
  ``unix:///path/to/socket`` (redis-py's own forms);
* Redis Cluster: ``redis+cluster://[[user]:password@]host:port[,host:port…]`` or
  ``rediss+cluster://…`` (TLS). The nodes listed are only where the client starts: it reads
  the cluster's slot map from the first that answers. No database number (a cluster has
  only database 0);
* Sentinel (failover of one primary): ``redis+sentinel://[[user]:password@]host:port[,host:port…]/service_name[/db]``
  or ``rediss+sentinel://…`` (TLS to the primary). The hosts are the sentinels; the
  password, if any, is the primary's (``?sentinel_password=…`` for the sentinels').

Behind Sentinel, redis-py asks the sentinels for the primary only when it opens a
connection: a pooled connection stays with the server it was opened to. A primary that was
frozen (or cut off) while Sentinel promoted its replica still believes it is the primary
when it comes back, until the sentinels demote it (about 10 s later), and a worker that was
idle meanwhile would go on using it: a request the new primary answered would be new there,
and run again. So the primary's address is asked again before a connection is used when
:data:`SENTINEL_CHECK_INTERVAL` has passed since the last time, and a connection to another
server than the one named is closed and opened again to the one named.

Every client is built WITHOUT command retries: re-sending a script after a timeout whose
first attempt did run would turn a new request into a retry of itself (see
:mod:`a2a_secure.store.redis`). On a cluster, redirections (``MOVED``, ``ASK``) and
``TRYAGAIN`` are still followed by redis-py: a node that answers with one of them did not
run the command.
"""

from __future__ import annotations

import enum
import logging
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from a2a_secure.system import mono_now

__all__ = [
    "SENTINEL_CHECK_INTERVAL",
    "Deployment",
    "client_from_url",
    "close_client",
    "deployment_of",
    "shown_url",
]

_log = logging.getLogger("a2a_secure.store.redis")

# Seconds: behind Sentinel, how long a pooled connection is used before the sentinels are
# asked again which server is the primary (see the module documentation).
SENTINEL_CHECK_INTERVAL = 1.0


class Deployment(enum.Enum):
    """How the Redis behind a URL or a client is deployed."""

    SINGLE = "single"  # one server (or a proxy that looks like one)
    CLUSTER = "cluster"  # Redis Cluster: keys are spread over slots
    SENTINEL = "sentinel"  # one primary found through Sentinel


_CLUSTER_MAX_CONNECTIONS = 1024

_SCHEMES = {
    "redis": (Deployment.SINGLE, False),
    "rediss": (Deployment.SINGLE, True),
    "unix": (Deployment.SINGLE, False),
    "redis+cluster": (Deployment.CLUSTER, False),
    "rediss+cluster": (Deployment.CLUSTER, True),
    "redis+sentinel": (Deployment.SENTINEL, False),
    "rediss+sentinel": (Deployment.SENTINEL, True),
}


def shown_url(url: str) -> str:
    """``url`` with its password (and its query, which may hold one) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "(not a URL)"
    rest = rest.split("?", 1)[0]
    userinfo, at, hosts = rest.rpartition("@")
    if at:
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:***@{hosts}" if ":" in userinfo else f"***@{hosts}"
    return f"{scheme}://{rest}"


def deployment_of(url: str) -> Deployment:
    """The deployment a URL names; ValueError for a scheme that is none of the forms."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in _SCHEMES:
        forms = ", ".join(f"{s}://" for s in _SCHEMES)
        raise ValueError(f"unsupported Redis URL scheme {scheme!r} (one of {forms})")
    return _SCHEMES[scheme][0]


def _number(text: str, what: str) -> int:
    """``text`` as a non-negative integer; the error never quotes it (it may hold a password
    fragment: an unencoded "/" in a password ends the host part of the URL early)."""
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"the Redis URL has a {what} that is not a number") from None
    return int(text)


def _hosts(netloc: str, default_port: int) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """(username, password, [(host, port), …]) of ``[[user]:password@]h:p[,h:p…]``."""
    user: str | None = None
    password: str | None = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        if ":" in auth:
            name, pw = auth.split(":", 1)
            user, password = (unquote(name) or None), unquote(pw)
        else:
            user = unquote(auth) or None
    hosts: list[tuple[str, int]] = []
    for raw in netloc.split(","):
        part = raw.strip()
        if not part:
            continue
        if part.startswith("["):  # [ipv6]:port
            host, _, rest = part[1:].partition("]")
            port = _number(rest[1:], "port") if rest.startswith(":") else default_port
        elif ":" in part:
            host, port_text = part.rsplit(":", 1)
            port = _number(port_text, "port")
        else:
            host, port = part, default_port
        hosts.append((unquote(host), port))
    if not hosts:
        raise ValueError("the Redis URL names no host")
    return user, password, hosts


def _no_retry() -> Any:
    from redis.asyncio.retry import Retry  # noqa: PLC0415 - optional extra
    from redis.backoff import NoBackoff  # noqa: PLC0415

    return Retry(NoBackoff(), 0)


def _maint_off() -> dict[str, Any]:
    try:  # redis-py >= 7: with maintenance notifications on ("auto"), the pool skips its
        # check of idle connections, and a connection that Redis closed while idle (a
        # restart) fails the next command instead of being replaced.
        from redis.maint_notifications import MaintNotificationsConfig  # noqa: PLC0415
    except ImportError:  # pragma: no cover - older redis-py
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def _checked_sentinel_pool() -> type:
    """A ``SentinelConnectionPool`` that does not keep using a primary the sentinels left."""
    from redis.asyncio.sentinel import SentinelConnectionPool  # noqa: PLC0415 - optional extra

    class CheckedSentinelPool(SentinelConnectionPool):
        _next_check = 0.0

        async def ensure_connection(self, connection: Any) -> None:
            now = mono_now()
            if now >= self._next_check:
                self._next_check = now + SENTINEL_CHECK_INTERVAL
                try:
                    # Asks the sentinels; when the primary moved, the idle connections are
                    # closed (redis-py's own get_master_address does that).
                    await self.get_master_address()  # type: ignore[no-untyped-call]
                except Exception as exc:  # no sentinel answers: keep the connection in hand
                    _log.warning("no sentinel named the primary: %s: %s", type(exc).__name__, str(exc)[:200])
            address = self.master_address
            if (
                connection.is_connected
                and address is not None
                and (connection.host, connection.port) != tuple(address)
            ):
                # Opened to the old primary (in use when the address changed): opened again,
                # to the primary the sentinels name now.
                await connection.disconnect()
            await super().ensure_connection(connection)

    return CheckedSentinelPool


def client_from_url(url: str, *, socket_timeout: float) -> tuple[Any, Deployment]:
    """A redis-py asyncio client for ``url`` (bytes replies, no command retries)."""
    deployment = deployment_of(url)
    tls = _SCHEMES[url.split("://", 1)[0].lower()][1]
    timeouts: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "decode_responses": False,
    }
    if deployment is Deployment.SINGLE:
        import redis.asyncio as redis_asyncio  # noqa: PLC0415 - optional extra

        try:
            if not url.lower().startswith("unix:"):
                # redis-py reads "/s3cr3t" as database 0 and "/1/2" as 12: a password
                # fragment after an unencoded "/" would select a database silently.
                db_path = urlsplit(url).path
                if db_path not in ("", "/"):
                    _number(db_path[1:], "database number")
            client = redis_asyncio.Redis.from_url(url, retry=_no_retry(), **timeouts, **_maint_off())
        except ValueError:
            # redis-py's message quotes the part it could not read ("Port could not be cast to
            # integer value as 's3cr3t'"): an unencoded "/" in a password puts the password
            # there, and startup errors are printed and logged. Ours names only the part.
            raise ValueError(
                "the Redis URL cannot be read (host, port, database or an option); percent-encode"
                " a password that holds '/', '?', '#' or '@'"
            ) from None
        return client, deployment

    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if deployment is Deployment.CLUSTER:
        from redis.asyncio.cluster import ClusterNode, RedisCluster  # noqa: PLC0415

        user, password, hosts = _hosts(parts.netloc, 6379)
        if parts.path not in ("", "/", "/0"):
            raise ValueError("a Redis Cluster URL has no database number (a cluster has only db 0)")
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in hosts],
            username=user,
            password=password,
            ssl=tls,
            retry=_no_retry(),
            # Per node. redis-py's cluster pool does not wait for a free connection: past
            # this many commands in flight to one node, a call fails (503) at once.
            max_connections=_CLUSTER_MAX_CONNECTIONS,
            **timeouts,
            **_maint_off(),
        )
        return cluster, deployment

    from redis.asyncio.sentinel import Sentinel  # noqa: PLC0415 - optional extra

    user, password, hosts = _hosts(parts.netloc, 26379)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("a Sentinel URL needs the service name: redis+sentinel://host:port/service_name")
    service = unquote(path[0])
    if len(path) > 2:
        raise ValueError("a Sentinel URL has at most a service name and a database number")
    db = _number(path[1], "database number") if len(path) > 1 else 0
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
    }
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **timeouts)  # type: ignore[no-untyped-call]
    primary = sentinel.master_for(
        service,
        username=user,
        password=password,
        db=db,
        ssl=tls,
        retry=_no_retry(),
        connection_pool_class=_checked_sentinel_pool(),
        **timeouts,
    )
    return primary, deployment


async def close_client(client: Any, deployment: Deployment) -> None:
    """Close a client made by :func:`client_from_url` (with Sentinel, the sentinels' too)."""
    await client.aclose()
    if deployment is Deployment.SENTINEL:
        for sentinel in client.connection_pool.sentinel_manager.sentinels:
            await sentinel.aclose()
