"""The model catalogue's routes in-process (no worker): deploy, show, patch, retire; what
is refused (400 invalid_model_spec, 409 model_exists, 403 without the admin role) writes
nothing; a deployed model takes jobs at once, with its generation defaults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from tokenq.api.app import create_app
from tokenq.shared import keys
from tokenq.shared.catalogue import CATALOGUE
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings

BASE = "fake-base"
ADMIN = {"Authorization": "Bearer adm"}
USER = {"Authorization": "Bearer usr"}


def fake_settings(redis_server: EmbeddedRedis, tmp: Path, models: list[str]) -> Settings:
    """The fake engine's models, on the tests' db 15 (the `r` fixture flushes it)."""
    models_file = tmp / "models.json"
    models_file.write_text(json.dumps({m: {"backend": "fake"} for m in models}))
    return Settings(redis_url=redis_server.url.rsplit("/", 1)[0] + "/15", state_dir=tmp,
                    models_file=models_file, served_models=models)


@pytest.fixture
def c(r: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(fake_settings(redis_server, tmp_path, [BASE]),
                     api_keys="adm:ops:admin,usr:acme")
    with TestClient(app) as client:
        deadline = time.monotonic() + 10
        while r.hget(CATALOGUE, BASE) is None:  # the registry is seeded in the background
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield client


def gguf(tmp_path: Path, name: str = "m.gguf") -> str:
    path = tmp_path / name
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return str(path)


def spec_of(r: redis.Redis, job_id: str) -> dict[str, object]:
    params: dict[str, object] = json.loads(r.hget(keys.job(job_id), "spec"))["params"]
    return params


def test_deploy_show_patch_and_jobs_with_the_model_defaults(
        c: TestClient, r: redis.Redis) -> None:
    resp = c.post("/v1/models", headers=ADMIN, json={
        "name": "fake-new", "backend": "fake", "temperature": 0.125, "max_tokens": 9,
        "keep_alive_s": 7})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert (body["state"], body["version"], body["workers"]) == ("idle", 1, [])
    assert body["spec"]["temperature"] == 0.125 and body["keep_alive_s"] == 7
    # served at once, listed for everyone, with its own defaults where a request is silent
    assert "fake-new" in {m["id"] for m in c.get("/v1/models", headers=USER).json()["data"]}
    job = c.post("/v1/jobs", headers=USER, json={"model": "fake-new", "prompt": "hi"})
    assert job.status_code == 202, job.text
    params = spec_of(r, job.json()["id"])
    assert (params["temperature"], params["max_tokens"]) == (0.125, 9)
    given = c.post("/v1/jobs", headers=USER, json={"model": "fake-new", "prompt": "hi",
                                                   "temperature": 0.5}).json()
    assert spec_of(r, given["id"])["temperature"] == 0.5
    # a non-admin sees what /v1/models shows, nothing of the catalogue
    plain = c.get("/v1/models/fake-new", headers=USER).json()
    assert plain["id"] == "fake-new" and "state" not in plain and "spec" not in plain
    shown = c.get("/v1/models/fake-new", headers=ADMIN).json()
    assert shown["state"] == "idle" and shown["request"]["temperature"] == 0.125

    patched = c.patch("/v1/models/fake-new", headers=ADMIN, json={"temperature": 0.25})
    assert patched.status_code == 200, patched.text
    assert patched.json()["version"] == 2 and patched.json()["spec"]["max_tokens"] == 9
    job = c.post("/v1/jobs", headers=USER, json={"model": "fake-new", "prompt": "hi"}).json()
    assert spec_of(r, job["id"])["temperature"] == 0.25
    # the seeded registry model is in the catalogue too
    assert c.get(f"/v1/models/{BASE}", headers=ADMIN).json()["origin"] == "seed"


def test_refusals_write_nothing(c: TestClient, r: redis.Redis, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file")
    r.hset(keys.ADAPTERS, "an-adapter", "{}")
    bad = [
        {"name": "m1", "model_path": gguf(tmp_path), "n_parralel": 2},
        {"name": "m1", "model_path": gguf(tmp_path), "backend": "tgi"},
        {"name": "m1", "model_path": gguf(tmp_path), "backend": "llama", "max_num_seqs": 2},
        {"name": "m1", "model_path": str(tmp_path / "missing.gguf")},
        {"name": "m1", "model_path": str(junk)},
        {"name": "an-adapter", "model_path": gguf(tmp_path)},
        {"model_path": gguf(tmp_path)},
        # sizes no job could run with (a negative n_ctx was once a 201, then every job a
        # 400 "does not fit this model's context of -1")
        {"name": "m1", "model_path": gguf(tmp_path), "n_ctx": -5},
        {"name": "m1", "model_path": gguf(tmp_path), "n_ctx": 0},
        {"name": "m1", "model_path": gguf(tmp_path), "n_parallel": 0},
        {"name": "m1", "model_path": gguf(tmp_path), "n_threads": -2},
        {"name": "m1", "model_path": gguf(tmp_path), "n_ctx": 32, "n_parallel": 4},
        {"name": "m1", "backend": "fake", "max_num_seqs": 0},
        {"name": "m1", "backend": "fake", "max_tokens": -1},
    ]
    before = r.hgetall(CATALOGUE)
    for body in bad:
        resp = c.post("/v1/models", headers=ADMIN, json=body)
        assert resp.status_code == 400, (body, resp.text)
        assert resp.json()["error"]["code"] == "invalid_model_spec", resp.text
    malformed = c.post("/v1/models", headers={**ADMIN, "Content-Type": "application/json"},
                       content=b"{not json")
    assert malformed.status_code == 400
    # a seeded model is the models file's: its workers would not follow a new version
    seed_patch = c.patch(f"/v1/models/{BASE}", headers=ADMIN, json={"n_parallel": 2})
    assert seed_patch.status_code == 409, seed_patch.text
    assert seed_patch.json()["error"]["code"] == "model_not_managed"
    assert r.hgetall(CATALOGUE) == before
    # the weights only on the workers' filesystem: accepted when the request says so
    ok = c.post("/v1/models", headers=ADMIN, json={
        "name": "m1", "model_path": "/elsewhere/m.gguf", "check_path": False})
    assert ok.status_code == 201, ok.text
    again = c.post("/v1/models", headers=ADMIN, json={"name": "m1",
                                                      "model_path": gguf(tmp_path)})
    assert again.status_code == 409 and again.json()["error"]["code"] == "model_exists"
    seeded = c.post("/v1/models", headers=ADMIN, json={"name": BASE,
                                                       "model_path": gguf(tmp_path)})
    assert seeded.status_code == 409
    for method, path in (("POST", "/v1/models"), ("PATCH", "/v1/models/m1"),
                         ("DELETE", "/v1/models/m1")):
        resp = c.request(method, path, headers=USER, json={"name": "m2", "backend": "fake"})
        assert resp.status_code == 403, (method, resp.text)
    assert json.loads(r.hget(CATALOGUE, "m1"))["version"] == 1
    assert r.hget(CATALOGUE, "m2") is None


def test_retire_fails_or_finishes_the_queued_jobs(c: TestClient) -> None:
    for name in ("fake-a", "fake-b"):
        assert c.post("/v1/models", headers=ADMIN,
                      json={"name": name, "backend": "fake"}).status_code == 201
    a = c.post("/v1/jobs", headers=USER, json={"model": "fake-a", "prompt": "x"}).json()
    b = c.post("/v1/jobs", headers=USER, json={"model": "fake-b", "prompt": "x"}).json()
    gone = c.delete("/v1/models/fake-a", headers=ADMIN, params={"queued": "fail"})
    assert gone.status_code == 200 and gone.json()["queued_failed"] == 1
    assert gone.json()["state"] == "retired"
    rec = c.get(f"/v1/jobs/{a['id']}", headers=USER).json()
    assert rec["status"] == "failed" and rec["error"]["code"] == "model_retired"
    assert c.post("/v1/jobs", headers=USER,
                  json={"model": "fake-a", "prompt": "x"}).status_code == 404
    assert "fake-a" not in {m["id"] for m in c.get("/v1/models", headers=USER).json()["data"]}
    # finish: the queued job stays queued (the autoscaler retires the model once empty)
    draining = c.delete("/v1/models/fake-b", headers=ADMIN)
    assert draining.json()["state"] == "draining"
    assert c.get(f"/v1/jobs/{b['id']}", headers=USER).json()["status"] == "queued"
    assert c.post("/v1/jobs", headers=USER,
                  json={"model": "fake-b", "prompt": "x"}).status_code == 404
    # a retired name may be deployed again: a new version
    back = c.post("/v1/models", headers=ADMIN, json={"name": "fake-a", "backend": "fake"})
    assert back.status_code == 201 and back.json()["version"] == 2


def test_a_restart_seeds_without_overwriting_what_was_deployed(
        r: redis.Redis, redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    settings = fake_settings(redis_server, tmp_path, [BASE, "fake-both"])
    with TestClient(create_app(settings, api_keys="adm:ops:admin")) as c:
        deadline = time.monotonic() + 10
        while r.hget(CATALOGUE, "fake-both") is None:  # seeded in the background
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r.hdel(CATALOGUE, "fake-both")  # as if deployed over the API before the file had it
        assert c.post("/v1/models", headers=ADMIN, json={
            "name": "fake-both", "backend": "fake", "temperature": 0.375}).status_code == 201
    with TestClient(create_app(settings, api_keys="adm:ops:admin")) as c:
        deadline = time.monotonic() + 10
        while c.get(f"/v1/models/{BASE}", headers=ADMIN).json().get("origin") != "seed":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        entry = c.get("/v1/models/fake-both", headers=ADMIN).json()
        assert entry["origin"] == "api" and entry["spec"]["temperature"] == 0.375
