"""A primary under min-replicas-to-write with no replica answers writes NOREPLICAS. Every
client reads that as tokenq.shared.redis_conn.NoReplicasError, a ResponseError that kombu counts
as a connection error, so Celery's consumer reconnects (with a plain ResponseError the
worker stopped: seen in the Sentinel cluster runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu.connection import Connection
from kombu.transport.redis import SentinelTransport, Transport

from tokenq.shared.redis_conn import NoReplicasError, async_client, sync_client
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings


@pytest.fixture
def lonely_primary(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    node = EmbeddedRedis(tmp_path / "n0", extra_args=("--min-replicas-to-write", "1")).start()
    try:
        yield node
    finally:
        node.kill()


def test_noreplicas_is_a_connection_error_for_every_client(
        lonely_primary: EmbeddedRedis) -> None:
    r = sync_client(Settings(redis_url=lonely_primary.url), decode_responses=True)
    try:
        assert r.get("k") is None  # reads are served
        with pytest.raises(NoReplicasError) as got:
            r.set("k", "v")
        assert isinstance(got.value, redis.ResponseError)
        for transport in (Transport, SentinelTransport):  # Celery's consumer reconnects
            assert isinstance(got.value, transport.connection_errors)
            conn = Connection(transport=transport)  # type: ignore[no-untyped-call]
            assert isinstance(got.value, conn.connection_errors)
        pipe = r.pipeline()
        pipe.set("k", "v")
        pipe.get("k")
        with pytest.raises(NoReplicasError):
            pipe.execute()
        assert r.ping()  # the connection is still usable
        if int(str(r.info("server")["redis_version"]).split(".")[0]) >= 7:
            # Redis 7 answers a script's refused write with the same code (6.2: "Error
            # running script ... -NOREPLICAS", a plain ResponseError).
            with pytest.raises(NoReplicasError):
                r.eval("return redis.call('SET', KEYS[1], 'v')", 1, "k")
        assert r.get("k") is None  # nothing was written
    finally:
        r.close()


def test_noreplicas_asyncio(lonely_primary: EmbeddedRedis) -> None:
    async def scenario() -> None:
        r = async_client(Settings(redis_url=lonely_primary.url), decode_responses=True)
        try:
            with pytest.raises(NoReplicasError):
                await r.set("k", "v")
        finally:
            await r.aclose()
    asyncio.run(scenario())
