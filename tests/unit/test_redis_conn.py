"""Sentinel settings and the client factory (shared/redis_conn.py), without a server: bad
settings are one clear line at start; the clients and Celery's broker are built for the
deployment named. The failover itself: tests/faults/test_sentinel.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as asentinel
import redis.sentinel

from tokenq.api.streams import HUB_TIMEOUT_MARGIN_S, hub_client
from tokenq.cli.stack import Stack
from tokenq.shared.celery_app import create_celery
from tokenq.shared.redis_conn import (
    CPacked,
    async_client,
    celery_broker,
    parse_address,
    sync_client,
)
from tokenq.shared.settings import Settings, SettingsProblem
from tokenq.shared.settings_load import load_settings
from tokenq.shared.settings_roles import ApiSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in [v for v in os.environ if v.upper().startswith("TOKENQ_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)


def sentinel_env(monkeypatch: pytest.MonkeyPatch, sentinels: str,
                 url: str = "redis://:pw@mymaster/3") -> None:
    monkeypatch.setenv("TOKENQ_REDIS_URL", url)
    monkeypatch.setenv("TOKENQ_REDIS_SENTINELS", sentinels)


@pytest.mark.parametrize("text, want", [
    ("s1:26379", ("s1", 26379)), (" 10.0.0.5:1 ", ("10.0.0.5", 1)),
    ("[::1]:26379", ("::1", 26379)), ("redis-sentinel.ns.svc:65535",
                                      ("redis-sentinel.ns.svc", 65535)),
])
def test_sentinel_addresses(text: str, want: tuple[str, int]) -> None:
    assert parse_address(text) == want


@pytest.mark.parametrize("bad", [
    "s1", "s1:", ":26379", "s1:0", "s1:65536", "s1:26379x", "s1:-1", "s 1:26379",
    "sentinel://s1:26379", "s1:\uff12\uff16\uff13\uff17\uff19", "[zz]:1", "a/b:1",
    "s1:26379;rm -rf",
])
def test_a_bad_sentinel_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    sentinel_env(monkeypatch, f"ok:26379,{bad}")
    with pytest.raises(SettingsProblem) as exc:
        load_settings()
    msg = str(exc.value)
    assert msg.startswith("TOKENQ_REDIS_SENTINELS="), msg
    assert repr(bad.strip()) in msg and "host:port" in msg and "\n" not in msg, msg


def test_a_huge_sentinel_entry_is_cut_in_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel_env(monkeypatch, "s1:" + "9" * 5000)
    with pytest.raises(SettingsProblem) as exc:
        load_settings()
    assert "not host:port" in str(exc.value) and "..." in str(exc.value)


def test_sentinels_need_a_url_with_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_REDIS_SENTINELS", "s1:26379")
    with pytest.raises(SettingsProblem, match="needs TOKENQ_REDIS_URL"):
        load_settings()
    sentinel_env(monkeypatch, "s1:26379", url="redis://mymaster/0")
    with pytest.raises(SettingsProblem, match="password-protected"):
        load_settings()
    sentinel_env(monkeypatch, "s1:26379", url="unix:///run/redis.sock?password=x")
    with pytest.raises(SettingsProblem, match="unix socket"):
        load_settings()
    # Sentinels on this machine, in dev: no password needed, as for a loopback Redis.
    sentinel_env(monkeypatch, "127.0.0.1:26379", url="redis://127.0.0.1:6379/0")
    assert load_settings().redis_sentinels == ["127.0.0.1:26379"]
    monkeypatch.setenv("TOKENQ_REDIS_MASTER_NAME", "my master")
    with pytest.raises(SettingsProblem, match="TOKENQ_REDIS_MASTER_NAME"):
        load_settings()


def test_without_sentinels_clients_are_plain() -> None:
    s = Settings(redis_url="redis://127.0.0.1:1/4")
    c = sync_client(s, decode_responses=True)
    assert type(c.connection_pool) is redis.ConnectionPool
    assert c.connection_pool.connection_kwargs["db"] == 4
    kw = c.connection_pool.connection_kwargs
    assert (kw["socket_timeout"], kw["socket_connect_timeout"], kw["socket_keepalive"]) == (
        s.redis_socket_timeout_s, s.redis_connect_timeout_s, True)
    assert celery_broker(s) == ("redis://127.0.0.1:1/4", {
        "socket_timeout": s.redis_socket_timeout_s,
        "socket_connect_timeout": s.redis_connect_timeout_s, "socket_keepalive": True})
    own = sync_client(s, url="redis://127.0.0.1:1/0?socket_timeout=9", socket_keepalive=False)
    assert own.connection_pool.connection_kwargs["socket_timeout"] == 9  # the URL's
    assert own.connection_pool.connection_kwargs["socket_keepalive"] is False  # the caller's
    assert sync_client(s, url="redis://127.0.0.1:2/0").connection_pool.connection_kwargs[
        "port"] == 2


def test_with_sentinels_clients_ask_them(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel_env(monkeypatch, "s1:26379,[::1]:26380")
    monkeypatch.setenv("TOKENQ_REDIS_MASTER_NAME", "prod")
    monkeypatch.setenv("TOKENQ_REDIS_SENTINEL_PASSWORD", "sp@ss")
    s = load_settings()
    c = sync_client(s, decode_responses=True, max_connections=7)
    pool = c.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "prod" and pool.max_connections == 7
    kw = pool.connection_kwargs
    assert (kw["password"], kw["db"], kw["decode_responses"]) == ("pw", 3, True)
    assert "host" not in kw  # the URL's host (mymaster) is not a node
    tls = sync_client(Settings(redis_url="rediss://:pw@m/1?socket_timeout=3",
                               redis_sentinels=["s1:1"]))
    assert tls.connection_pool.connection_kwargs["socket_timeout"] == 3
    assert tls.connection_pool.connection_class is redis.sentinel.SentinelManagedSSLConnection
    sentinels = pool.sentinel_manager.sentinels
    got = [(x.connection_pool.connection_kwargs["host"],
            x.connection_pool.connection_kwargs["port"],
            x.connection_pool.connection_kwargs["password"]) for x in sentinels]
    assert got == [("s1", 26379, "sp@ss"), ("::1", 26380, "sp@ss")]
    a = async_client(s)
    assert isinstance(a.connection_pool, asentinel.SentinelConnectionPool)
    assert a.connection_pool.connection_kwargs["password"] == "pw"
    assert a.connection_pool.connection_kwargs["socket_timeout"] == s.redis_socket_timeout_s


def test_celery_broker_through_sentinel(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel_env(monkeypatch, "s1:26379,s2:26380", url="redis://:p%40ss@mymaster/2")
    monkeypatch.setenv("TOKENQ_REDIS_SENTINEL_PASSWORD", "sp")
    s = load_settings()
    url, options = celery_broker(s)
    assert url == "sentinel://:p%40ss@s1:26379/2;sentinel://:p%40ss@s2:26380/2"
    assert options["master_name"] == "mymaster"
    assert options["sentinel_kwargs"]["password"] == "sp"
    assert options["socket_timeout"] == s.redis_socket_timeout_s
    app = create_celery(s)
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    assert app.conf.broker_transport_options["queue_order_strategy"] == "priority"
    conn = app.connection_for_write()
    assert conn.transport_cls == "sentinel" and conn.hostname == "s1"
    assert conn.password == "p@ss" and conn.virtual_host in ("2", 2)
    assert [a.split("@")[1] for a in conn.alt] == ["s1:26379/2", "s2:26380/2"]


def test_stack_hands_the_sentinels_to_its_children(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel_env(monkeypatch, "s1:26379")
    monkeypatch.setenv("TOKENQ_REDIS_SENTINEL_PASSWORD", "sp")
    s = load_settings()
    for var in ("TOKENQ_REDIS_SENTINELS", "TOKENQ_REDIS_SENTINEL_PASSWORD"):
        monkeypatch.delenv(var)  # given as arguments only: the children still get them
    env = Stack(s, redis_url="redis://:pw@mymaster/3")._env()
    assert (env["TOKENQ_REDIS_SENTINELS"], env["TOKENQ_REDIS_MASTER_NAME"],
            env["TOKENQ_REDIS_SENTINEL_PASSWORD"]) == ("s1:26379", "mymaster", "sp")
    assert "TOKENQ_REDIS_SENTINELS" not in Stack(Settings())._env()


ARGS = [("SET", "k", 0.1), ("SET", "k", -3), ("SET", "k", 2**70), ("SET", "k", 1e20),
        ("SET", "k", b"\x00\xff"), ("SET", "k", "é"), ("SET", "k", memoryview(b"ab")),
        ("SET", "k", bytearray(b"cd")), ("CONFIG GET", "maxmemory"),
        (b"CONFIG GET", "maxmemory"), ("XREAD", "COUNT", 500, "BLOCK", 5000, "STREAMS",
                                       *(f"s{i}" for i in range(300)), *["0-0"] * 300)]


@pytest.mark.parametrize("args", ARGS, ids=range(len(ARGS)))
def test_async_clients_pack_in_c_the_same_bytes(args: tuple[Any, ...]) -> None:
    """The API's asyncio connections pack with hiredis (redis-py packs those in Python):
    byte for byte what redis-py would send, for plain and Sentinel-managed clients."""
    plain = async_client(Settings(redis_url="redis://127.0.0.1:1/0"))
    cls = plain.connection_pool.connection_class
    assert issubclass(cls, CPacked) and issubclass(cls, aioredis.Connection)
    tls = async_client(Settings(redis_url="rediss://:pw@m/1", redis_sentinels=["s1:1"]))
    assert issubclass(tls.connection_pool.connection_class,
                      asentinel.SentinelManagedConnection)
    assert issubclass(tls.connection_pool.connection_class, CPacked)
    python = aioredis.Connection()
    assert b"".join(cls().pack_command(*args)) == b"".join(python.pack_command(*args))


@pytest.mark.parametrize("bad", [True, None, object()])
def test_c_packing_refuses_what_redis_py_refuses(bad: Any) -> None:
    cls = async_client(Settings(redis_url="redis://127.0.0.1:1/0")).connection_pool.\
        connection_class
    with pytest.raises(redis.exceptions.DataError):
        aioredis.Connection().pack_command("SET", "k", bad)
    with pytest.raises(redis.exceptions.DataError):
        cls().pack_command("SET", "k", bad)


def test_without_hiredis_async_clients_pack_as_redis_py_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenq.shared.redis_conn as redis_conn

    monkeypatch.setattr(redis_conn, "hiredis", None)
    c = async_client(Settings(redis_url="redis://127.0.0.1:1/0"))
    assert c.connection_pool.connection_class is aioredis.Connection


def test_the_stream_hub_leaves_a_silent_primary_within_the_socket_timeout() -> None:
    """With stream announcements the hub's XREADs never BLOCK: it has every client's socket
    timeout, so streams move to a promoted primary within it (the partition scenario of the
    cluster suite); without them, BLOCK plus a margin (an idle XREAD is no timeout)."""
    s = Settings(redis_url="redis://127.0.0.1:1/0")
    kw = hub_client(s, 5000).connection_pool.connection_kwargs
    assert kw["socket_timeout"] == s.redis_socket_timeout_s
    assert kw["socket_connect_timeout"] == s.redis_connect_timeout_s
    blocking = Settings(redis_url="redis://127.0.0.1:1/0", api=ApiSettings(stream_notify=False))
    kw = hub_client(blocking, 5000).connection_pool.connection_kwargs
    assert kw["socket_timeout"] == 5.0 + HUB_TIMEOUT_MARGIN_S
