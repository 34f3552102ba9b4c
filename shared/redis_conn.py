"""Every Redis client tokenq opens, built in one place: through Redis Sentinel when
``TOKENQ_REDIS_SENTINELS`` is set, else straight to ``TOKENQ_REDIS_URL``.

Through Sentinel a client asks the sentinels for the current master of
``TOKENQ_REDIS_MASTER_NAME`` whenever it opens a connection (redis-py's
SentinelConnectionPool). After a failover the dead master's connections fail, and a
connection still open to the demoted master is answered READONLY, which redis-py turns into
a connection error: the next attempt (the callers' Retry, the publisher's own retry loop)
connects to the promoted replica. No caller ever rebuilds a client.

The Redis password, user and db still come from ``TOKENQ_REDIS_URL`` (its host and port are
not used with sentinels); the sentinels' own password is ``TOKENQ_REDIS_SENTINEL_PASSWORD``.
Celery's broker gets the same deployment as kombu's ``sentinel://`` URL (`celery_broker`).

A primary under ``min-replicas-to-write`` that has too few replicas in reach (cut off from
them, or just promoted while Sentinel re-points the others) answers writes NOREPLICAS.
Importing this module makes every client read that as `NoReplicasError` (still a
ResponseError: pipelines and callers handle it as before) and makes kombu count it as a
connection error, so Celery's consumer reconnects and goes on instead of stopping the
worker ("Unrecoverable error", seen in the Sentinel cluster runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as asentinel
import redis.sentinel

from tokenq.shared.parsing import parse_address

hiredis: Any
try:
    import hiredis  # its stub types pack_command's argument as a 1-tuple
except ImportError:  # a dependency (redis[hiredis]); without it redis-py's own code runs
    hiredis = None
if not hasattr(hiredis, "pack_command"):  # hiredis < 2 (redis 5.0's extra allows 1.x)
    hiredis = None

if TYPE_CHECKING:
    from tokenq.shared.settings import Settings

class NoReplicasError(redis.exceptions.ResponseError):
    """NOREPLICAS: the primary refused a write for want of replicas (nothing was written:
    a script stops at its first write). Retryable, like a Redis that is away."""


def _noreplicas_is_recoverable() -> None:
    from kombu.transport import redis as kombu_redis
    from redis._parsers.base import BaseParser  # every parser: sync, asyncio, hiredis

    BaseParser.EXCEPTION_CLASSES.setdefault("NOREPLICAS", NoReplicasError)
    for transport in (kombu_redis.Transport, kombu_redis.SentinelTransport):
        errors = transport.connection_errors
        if NoReplicasError not in errors:
            transport.connection_errors = (*errors, NoReplicasError)


_noreplicas_is_recoverable()

# A sentinel that does not answer within this is skipped for the next one.
SENTINEL_TIMEOUT_S = 2.0
def _addresses(settings: Settings) -> list[tuple[str, int]]:
    return [parse_address(s) for s in settings.redis_sentinels]


def _master_kwargs(url: str) -> dict[str, Any]:
    """The URL's credentials, db, TLS and query options, for connections to whichever
    node is master (its host and port are not used)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"TOKENQ_REDIS_URL with sentinels must be redis:// or rediss://, "
                         f"not {parts.scheme}://")
    got: dict[str, Any] = redis.connection.parse_url(url)  # type: ignore[no-untyped-call]
    out = {k: v for k, v in got.items() if k not in ("host", "port", "connection_class")}
    if parts.scheme == "rediss":
        out["ssl"] = True  # SentinelManagedSSLConnection
    return out


def _sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    kw: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT_S,
                          "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    if settings.redis_sentinel_password:
        kw["password"] = settings.redis_sentinel_password
    return kw


def _timeouts(settings: Settings, url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the deployment's socket timeouts and TCP keepalive where neither the
    caller nor the URL's query set them: a client cut off from its primary (a partition,
    a dead node that sent no FIN) fails its command within redis_socket_timeout_s and
    reconnects, instead of waiting for the kernel's TCP timeout."""
    given = set(kwargs) | set(redis.connection.parse_url(url))  # type: ignore[no-untyped-call]
    out = dict(kwargs)
    # Redis WAIT (durable acceptance) holds a command up to its timeout.
    wait_s = settings.api.durable_timeout_ms / 1000
    defaults = {"socket_timeout": max(settings.redis_socket_timeout_s, wait_s + 1),
                "socket_connect_timeout": settings.redis_connect_timeout_s,
                "socket_keepalive": True}
    if url.startswith("unix:"):  # no TCP: no keepalive (and no such option)
        del defaults["socket_keepalive"]
    out.update({k: v for k, v in defaults.items() if k not in given})
    return out


def block_limit_s(r: redis.Redis, cap: float) -> float:
    """The longest one blocking command (BLPOP, XREAD BLOCK) on `r` may wait: `cap`, and
    at most half the client's socket timeout. A wait past that timeout ends in a client
    error, and redis-py sends the command again: a BLPOP longer than the timeout never
    returns by itself."""
    timeout = r.connection_pool.connection_kwargs.get("socket_timeout")
    return cap if not timeout else min(cap, float(timeout) / 2)


def sync_client(settings: Settings, *, url: str | None = None, **kwargs: Any) -> redis.Redis:
    """A blocking client on the deployment's master. `url` replaces TOKENQ_REDIS_URL (an
    embedded Redis); `kwargs` are redis.Redis options (decode_responses, retry, ...); the
    socket timeouts default to the settings' (`_timeouts`)."""
    url = url or settings.require_redis_url()
    kwargs = _timeouts(settings, url, kwargs)
    if not settings.redis_sentinels:
        return redis.Redis.from_url(url, **kwargs)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        _addresses(settings), sentinel_kwargs=_sentinel_kwargs(settings))
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        settings.redis_master_name, **_master_kwargs(url), **kwargs)
    return client


def async_client(settings: Settings, *, url: str | None = None,
                 **kwargs: Any) -> aioredis.Redis:
    """`sync_client` for asyncio (the API), its commands packed in C (`CPacked`)."""
    url = url or settings.require_redis_url()
    kwargs = _timeouts(settings, url, kwargs)
    if not settings.redis_sentinels:
        client: aioredis.Redis = aioredis.Redis.from_url(url, **kwargs)
    else:
        sentinel = asentinel.Sentinel(  # type: ignore[no-untyped-call]
            _addresses(settings), sentinel_kwargs=_sentinel_kwargs(settings))
        client = sentinel.master_for(settings.redis_master_name, **_master_kwargs(url),
                                     **kwargs)
    pool = client.connection_pool
    if hiredis is not None and not issubclass(pool.connection_class, CPacked):
        pool.connection_class = c_packed(pool.connection_class)
    return client


class CPacked(aioredis.connection.AbstractConnection):
    """redis-py packs a command in Python on its asyncio connections (its blocking ones
    use hiredis). The API's shared XREAD names every watched stream and its cursor: at
    1,000 streams that is 2,006 arguments, 4.4 ms a call in Python and 0.4 ms in hiredis
    (the slow 2-core VM). Same bytes, same errors (DataError for what Redis cannot take)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a bytearray, which hiredis does not take, or a bad argument
            pass
        try:
            return [hiredis.pack_command(tuple(
                bytes(a) if isinstance(a, bytearray) else a for a in args))]
        except TypeError as exc:
            raise redis.exceptions.DataError(str(exc)) from exc


_C_PACKED: dict[type[Any], type[Any]] = {}


def c_packed(cls: type[Any]) -> type[Any]:
    """`cls` (a connection class: plain, TLS, unix socket, Sentinel-managed) with
    `CPacked`'s packing."""
    if cls not in _C_PACKED:
        _C_PACKED[cls] = type(f"CPacked{cls.__name__}", (CPacked, cls), {})
    return _C_PACKED[cls]


def celery_broker(settings: Settings) -> tuple[str, dict[str, Any]]:
    """Celery's broker URL and the transport options it needs beside tokenq's own: with
    sentinels, kombu's `sentinel://[:password@]host:port/db;sentinel://...` and
    `master_name` / `sentinel_kwargs`; else TOKENQ_REDIS_URL as it is."""
    url = settings.require_redis_url()
    # kombu's BRPOP waits 1 s (brpop_timeout) at a time, well inside the socket timeout.
    timeouts = {"socket_timeout": settings.redis_socket_timeout_s,
                "socket_connect_timeout": settings.redis_connect_timeout_s,
                "socket_keepalive": True}
    if not settings.redis_sentinels:
        return url, timeouts
    master = _master_kwargs(url)
    if master.get("ssl"):
        raise ValueError("TOKENQ_REDIS_URL: rediss:// with sentinels is not supported for "
                         "Celery's broker (kombu's sentinel transport); use redis://")
    auth = ""
    if master.get("password") is not None:
        auth = f"{quote(master.get('username') or '', safe='')}:" \
               f"{quote(str(master['password']), safe='')}@"
    db = master.get("db", 0)
    hosts = [f"[{h}]" if ":" in h else h for h, _ in _addresses(settings)]
    broker = ";".join(f"sentinel://{auth}{h}:{p}/{db}"
                      for h, (_, p) in zip(hosts, _addresses(settings), strict=True))
    options: dict[str, Any] = {"master_name": settings.redis_master_name,
                               "sentinel_kwargs": _sentinel_kwargs(settings), **timeouts}
    return broker, options
