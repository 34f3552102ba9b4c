"""Adapter admin routes on the secure fake stack: admin only, registry semantics, and
routing (the fake engine prefixes a job's first token with `[name@version]`), all in
seconds. The engines' own LoRA behaviour is tested in tests/integration and tests/vllm."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.faults.conftest import auth
from tests.faults.harness import FAKE
from tokenq.cli.stack import Stack


def wait_output(client: httpx.Client, job_id: str) -> str:
    deadline = time.time() + 30
    while (rec := client.get(f"/v1/jobs/{job_id}").json())["status"] != "succeeded":
        assert time.time() < deadline and rec["status"] in ("queued", "running"), rec
        time.sleep(0.05)
    return str(rec["output"])


def run(client: httpx.Client, model: str) -> str:
    resp = client.post("/v1/jobs", json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 202, resp.text
    return wait_output(client, resp.json()["id"])


def test_adapter_routes_admin_only_and_rollback(secure_stack: Stack, alpha: httpx.Client,
                                                tmp_path: Path) -> None:
    paths = [tmp_path / f"v{i}" for i in (1, 2)]
    for p in paths:
        p.write_text("x")
    body = {"name": "fake-ad", "model": FAKE, "path": str(paths[0]), "owner": "alpha"}
    assert alpha.post("/v1/adapters", json=body).status_code == 403
    assert alpha.get("/v1/adapters").status_code == 403
    assert alpha.post("/v1/adapters/fake-ad/rollback").status_code == 403
    assert alpha.delete("/v1/adapters/fake-ad").status_code == 403
    with httpx.Client(base_url=secure_stack.url, timeout=60, headers=auth("admin")) as adm:
        v1 = adm.post("/v1/adapters", json=body).json()
        assert v1["status"] == "loaded" and v1["pending_workers"] == [], v1
        assert len(v1["workers"]) == 1 and v1["seconds"] < 5
        ids = {m["id"]: m for m in alpha.get("/v1/models").json()["data"]}
        assert ids["fake-ad"]["parent"] == FAKE
        assert run(alpha, "fake-ad").startswith(f"[fake-ad@{v1['version']}]")
        v2 = adm.post("/v1/adapters", json={**body, "path": str(paths[1])}).json()
        assert run(alpha, "fake-ad").startswith(f"[fake-ad@{v2['version']}]")
        # a job's version is pinned at submit: queued behind nothing, it still says v2
        back = adm.post("/v1/adapters/fake-ad/rollback").json()
        assert back["version"] == v1["version"] and back["pending_workers"] == []
        assert run(alpha, "fake-ad").startswith(f"[fake-ad@{v1['version']}]")
        gone = adm.delete("/v1/adapters/fake-ad").json()
        assert gone["status"] == "unloaded" and gone["pending_workers"] == []
        resp = alpha.post("/v1/jobs", json={"model": "fake-ad", "prompt": "hi"})
        assert resp.status_code == 404
        assert adm.delete("/v1/adapters/fake-ad").status_code == 409
        again = adm.post("/v1/adapters/fake-ad/rollback").json()  # undo the unload
        assert again["status"] == "loaded" and again["version"] == v1["version"]
        assert run(alpha, "fake-ad").startswith(f"[fake-ad@{v1['version']}]")
        # a path no worker can load: refused with the worker's error, nothing changes
        bad = adm.post("/v1/adapters", json={**body, "path": str(tmp_path / "missing")})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "adapter_load_failed"
        assert adm.get("/v1/adapters/fake-ad").json()["version"] == v1["version"]
        assert run(alpha, "fake-ad").startswith(f"[fake-ad@{v1['version']}]")
        # rollback pops one change at a time, back to before the first load
        while adm.post("/v1/adapters/fake-ad/rollback").status_code == 200:
            pass
        final = adm.get("/v1/adapters/fake-ad").json()
        assert final["status"] == "unloaded" and not final["can_rollback"]
        assert run(alpha, FAKE) == "t0 t1 "  # the base model: no adapter


def test_batch_lines_select_adapters(secure_stack: Stack, alpha: httpx.Client,
                                     tmp_path: Path) -> None:
    path = tmp_path / "v"
    path.write_text("x")
    with httpx.Client(base_url=secure_stack.url, timeout=60, headers=auth("admin")) as adm:
        v = adm.post("/v1/adapters", json={"name": "fake-batch", "model": FAKE,
                                           "path": str(path), "shared": True}).json()
        assert v["pending_workers"] == [], v
        lines = [{"custom_id": m, "method": "POST", "url": "/v1/completions",
                  "body": {"model": m, "prompt": "hi", "max_tokens": 2}}
                 for m in ("fake-batch", FAKE)]
        resp = alpha.post("/v1/files", data={"purpose": "batch"}, files={
            "file": ("in.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")})
        assert resp.status_code == 200, resp.text
        batch = alpha.post("/v1/batches", json={"input_file_id": resp.json()["id"],
                                                "endpoint": "/v1/completions",
                                                "completion_window": "24h"}).json()
        deadline = time.time() + 60
        while (b := alpha.get(f"/v1/batches/{batch['id']}").json())["status"] != "completed":
            assert time.time() < deadline and b["status"] not in ("failed", "expired"), b
            time.sleep(0.1)
        raw = alpha.get(f"/v1/files/{b['output_file_id']}/content").text
        out = {x["custom_id"]: x["response"]["body"] for x in map(json.loads, raw.splitlines())}
        assert out["fake-batch"]["model"] == "fake-batch"
        assert out["fake-batch"]["choices"][0]["text"].startswith(f"[fake-batch@{v['version']}]")
        assert out[FAKE]["choices"][0]["text"] == "t0 t1 "
        adm.delete("/v1/adapters/fake-batch")
