"""Uploads end: expired ones are swept from disk and Redis (their quota with them), parallel
uploads cannot overshoot a tenant's quota, and an upload that dies midway leaves nothing
that lives longer than its lease."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tokenq.api.app import create_app
from tokenq.api.openai import file_store, files
from tokenq.shared import keys
from tokenq.shared.redis_server import EmbeddedRedis

MODEL = "fake-files"


@pytest.fixture(autouse=True)
def quick_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SWEEP_S", 0.1)


def wait_until(what: str, ok: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.05)


def upload(c: TestClient, data: bytes, name: str = "in.jsonl") -> dict[str, object]:
    resp = c.post("/v1/files", files={"file": (name, data)}, data={"purpose": "user_data"})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


UPLOAD_KEYS = ("tokenq:file:*", keys.UPLOADS, "tokenq:tenant:*:files",
               "tokenq:tenant:*:upload_bytes")


def upload_keys(r: redis.Redis) -> list[str]:
    """Every key an upload can leave behind (the sweeper's lease aside; other parts of the
    API keep keys of their own, the model catalogue's)."""
    return sorted({str(k) for match in UPLOAD_KEYS for k in r.scan_iter(match)})


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    return tmp_path / "files"


def test_expired_uploads_leave_disk_and_redis_and_free_the_quota(
        redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path, files_dir: Path) -> None:
    settings = fake_settings(redis_server, tmp_path, [MODEL], files_dir=files_dir,
                             file_ttl_s=2, tenant_max_file_bytes=30_000)
    with TestClient(create_app(settings)) as c:
        before = time.time()
        made = [upload(c, b"x" * 10_000, f"{n}.jsonl") for n in range(3)]
        for f in made:  # expiry counts from the first byte
            assert int(before) + 2 <= int(str(f["expires_at"])) <= int(time.time()) + 2
        assert len(list(files_dir.iterdir())) == 3
        resp = c.post("/v1/files", files={"file": ("more.jsonl", b"y")},
                      data={"purpose": "user_data"})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "quota_exceeded"
        wait_until("the expired uploads are swept",
                   lambda: not any(files_dir.iterdir()) and not upload_keys(r))
        assert c.get("/v1/files").json()["data"] == []
        assert c.get(f"/v1/files/{made[0]['id']}").status_code == 404
        upload(c, b"z" * 30_000)  # the whole quota is free again


def test_parallel_uploads_never_exceed_the_quota(
        redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path, files_dir: Path) -> None:
    size, quota = 300_000, 1_000_000
    settings = fake_settings(redis_server, tmp_path, [MODEL], files_dir=files_dir,
                             tenant_max_file_bytes=quota)
    with TestClient(create_app(settings)) as c, ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(
            lambda n: c.post("/v1/files", files={"file": (f"{n}.jsonl", b"q" * size)},
                             data={"purpose": "user_data"}), range(20)))
        codes = sorted(a.status_code for a in answers)
        assert codes == [200] * (quota // size) + [403] * (20 - quota // size), codes
        assert {a.json()["error"]["code"] for a in answers if a.status_code == 403} == {
            "quota_exceeded"}
        on_disk = [p.stat().st_size for p in files_dir.iterdir()]
        assert len(on_disk) == quota // size and sum(on_disk) <= quota
        held: list[tuple[str, float]] = r.zrange(  # type: ignore[assignment]
            keys.tenant_upload_bytes("default"), 0, -1, withscores=True)
        assert sum(n for _, n in held) <= quota


class Died(Exception):
    """The process went away here: no cleanup of its runs."""


@pytest.mark.parametrize("where", ["redis", "disk"])
def test_an_upload_that_dies_midway_leaves_nothing_without_a_ttl(
        where: str, redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path,
        files_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "UPLOAD_LEASE_S", 2.0)

    async def nothing(*_: object) -> None:
        return None

    monkeypatch.setattr(files, "_abandon", nothing)  # a dead process cleans nothing up
    writes: list[int] = []

    def count_or_die() -> None:
        writes.append(1)
        if len(writes) == 2:
            raise Died

    if where == "disk":
        append_to_disk = files._append

        def to_disk(path: Path, data: bytes) -> None:
            count_or_die()
            append_to_disk(path, data)

        monkeypatch.setattr(files, "_append", to_disk)
    else:
        append_to_redis = file_store.FileStore.append

        async def to_redis(self: file_store.FileStore, file_id: str, piece: bytes) -> None:
            count_or_die()
            await append_to_redis(self, file_id, piece)

        monkeypatch.setattr(file_store.FileStore, "append", to_redis)
    settings = fake_settings(redis_server, tmp_path, [MODEL],
                             files_dir=files_dir if where == "disk" else None)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        resp = c.post("/v1/files", files={"file": ("big.jsonl", b"d" * (files.PIECE * 3))},
                      data={"purpose": "batch"})
        assert resp.status_code == 500 and len(writes) == 2
        left = upload_keys(r)
        assert left, "the first piece left nothing to check"
        indexes = {keys.UPLOADS, keys.tenant_upload_bytes("default")}
        for key in left:
            # the upload's own keys expire by themselves; the indexes hold it until a
            # deadline the sweeper keeps
            assert key in indexes or r.ttl(key) > 0, (key, r.ttl(key))
        index: list[tuple[str, float]] = r.zrange(  # type: ignore[assignment]
            keys.UPLOADS, 0, -1, withscores=True)
        [(member, deadline)] = index
        assert deadline <= time.time() + 2 + 1, member
        if where == "disk":
            assert len(list(files_dir.iterdir())) == 1
        wait_until("the dead upload is swept",
                   lambda: not upload_keys(r) and not any(files_dir.glob("*")))


@pytest.mark.parametrize("where", ["redis", "disk"])
def test_content_comes_back_byte_for_byte(where: str, redis_server: EmbeddedRedis,
                                          r: redis.Redis, tmp_path: Path,
                                          files_dir: Path) -> None:
    data = bytes(range(256)) * (files.PIECE // 256) + "é\n".encode() * 1000  # > 1 piece
    settings = fake_settings(redis_server, tmp_path, [MODEL],
                             files_dir=files_dir if where == "disk" else None)
    with TestClient(create_app(settings)) as c:
        made = upload(c, data)
        assert made["bytes"] == len(data)
        assert c.get(f"/v1/files/{made['id']}/content").content == data
        assert c.delete(f"/v1/files/{made['id']}").json()["deleted"] is True
        assert not upload_keys(r) and not any(files_dir.glob("*"))
