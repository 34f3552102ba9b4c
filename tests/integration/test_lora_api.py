"""LoRA adapters end to end on the llama.cpp worker, as a user does it: the admin routes
load, unload and roll back; the openai SDK selects the adapter by `model`; the worker is
never restarted. Prints the load/unload/rollback times the admin routes measured
(registry write -> every live worker of the base model serving the change)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import SMOL
from tests.lora_fixtures import write_gguf_lora
from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path

CHAT = [{"role": "user", "content": "Name three colours."}]
NAME = "smol-support"


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=600) as c:
        yield c


@pytest.fixture
def versions(tmp_path: Path, stack_settings: Settings) -> list[Path]:
    base = gguf_path(stack_settings.models()[SMOL], stack_settings.state_dir)
    return [write_gguf_lora(base, tmp_path / f"v{i}.gguf", seed=10 + i) for i in (1, 2)]


def chat(oai: openai.OpenAI, model: str) -> str:
    """Greedy, on a fresh prefill (`cache_prompt: false`): the texts compared below must not
    depend on which slot held this prompt before (a prefix-cache hit can change the last
    bits of the logits, as llama-server documents)."""
    out = oai.chat.completions.create(model=model, messages=CHAT,  # type: ignore[arg-type]
                                      max_tokens=6, temperature=0,
                                      extra_body={"cache_prompt": False})
    assert out.model == model
    return out.choices[0].message.content or ""


def admin(client: httpx.Client, method: str, path: str, **kw: object) -> dict[str, object]:
    resp = client.request(method, path, timeout=120, **kw)  # type: ignore[arg-type]
    assert resp.status_code == 200, resp.text
    body: dict[str, object] = resp.json()
    assert body["pending_workers"] == [], body  # the live SmolLM2 worker confirmed it
    return body


def test_load_request_unload_rollback_with_openai_sdk(
        oai: openai.OpenAI, client: httpx.Client, versions: list[Path]) -> None:
    times: dict[str, float] = {}
    base = chat(oai, SMOL)
    loaded = admin(client, "POST", "/v1/adapters",
                   json={"name": NAME, "model": SMOL, "path": str(versions[0])})
    times["load v1"] = float(loaded["seconds"])  # type: ignore[arg-type]
    listed = {m.id: m for m in oai.models.list()}
    assert (listed[NAME].model_extra or {}).get("parent") == SMOL
    v1 = chat(oai, NAME)
    assert v1 != base  # the adapter changes the greedy text

    body = admin(client, "POST", "/v1/adapters",
                 json={"name": NAME, "model": SMOL, "path": str(versions[1])})
    times["load v2"] = float(body["seconds"])  # type: ignore[arg-type]
    v2 = chat(oai, NAME)
    assert v2 not in (v1, base)

    body = admin(client, "POST", f"/v1/adapters/{NAME}/rollback")
    times["rollback v2->v1"] = float(body["seconds"])  # type: ignore[arg-type]
    assert body["version"] == loaded["version"]
    assert chat(oai, NAME) == v1  # the previous version's text exactly

    # A job submitted before the unload finishes on the version it started with.
    job = client.post("/v1/jobs", json={"model": NAME, "messages": CHAT, "max_tokens": 6,
                                        "temperature": 0}).json()
    body = admin(client, "DELETE", f"/v1/adapters/{NAME}")
    times["unload"] = float(body["seconds"])  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        chat(oai, NAME)
    assert NAME not in {m.id for m in oai.models.list()}
    assert chat(oai, SMOL) == base  # the base model's text exactly, after the adapter ran
    deadline = time.time() + 600
    while (rec := client.get(f"/v1/jobs/{job['id']}").json())["status"] != "succeeded":
        assert time.time() < deadline and rec["status"] in ("queued", "running"), rec
        time.sleep(0.2)
    assert rec["output"] == v1 and rec["adapter"] == NAME and rec["model"] == SMOL

    body = admin(client, "POST", f"/v1/adapters/{NAME}/rollback")  # undo the unload
    times["rollback unload"] = float(body["seconds"])  # type: ignore[arg-type]
    assert body["status"] == "loaded"
    assert chat(oai, NAME) == v1
    print("llama.cpp LoRA admin times (s):",
          {k: round(v, 3) for k, v in times.items()})
    print("llama.cpp LoRA swap times (s):", swap_times(client, NAME, SMOL, versions))
    assert chat(oai, NAME) == v1  # five rounds later: still v1, no restart


def test_bad_adapter_is_refused_and_nothing_changes(
        client: httpx.Client, versions: list[Path], tmp_path: Path) -> None:
    admin(client, "POST", "/v1/adapters",
          json={"name": "smol-bad", "model": SMOL, "path": str(versions[0])})
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    resp = client.post("/v1/adapters", json={"name": "smol-bad", "model": SMOL,
                                             "path": str(junk)}, timeout=120)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "adapter_load_failed"
    rec = client.get("/v1/adapters/smol-bad").json()
    assert rec["status"] == "loaded" and rec["path"] == str(versions[0])
    assert [v["path"] for v in rec["versions"]] == [str(versions[0])]
    assert client.post("/v1/adapters", json={"name": SMOL, "model": SMOL,
                                             "path": str(junk)}).status_code == 400
    assert client.post("/v1/adapters", json={"name": "x", "model": "nope",
                                             "path": str(junk)}).status_code == 404
    admin(client, "DELETE", "/v1/adapters/smol-bad")


def swap_times(client: httpx.Client, name: str, model: str, paths: list[Path],
               rounds: int = 5) -> dict[str, str]:
    """Admin-call seconds (call -> every live worker acked) over `rounds` cycles of
    load v2 / rollback / unload / rollback, and the worker's own engine time for loads:
    median and max, for docs/benchmarks.md."""
    api: dict[str, list[float]] = {}
    engine: list[float] = []
    calls = [("load", "POST", "/v1/adapters", {"name": name, "model": model,
                                                 "path": str(paths[1])}),
             ("rollback", "POST", f"/v1/adapters/{name}/rollback", None),
             ("unload", "DELETE", f"/v1/adapters/{name}", None),
             ("rollback (undo unload)", "POST", f"/v1/adapters/{name}/rollback", None)]
    for _ in range(rounds):
        for op, method, path, body in calls:
            out = admin(client, method, path, **({"json": body} if body else {}))
            api.setdefault(op, []).append(float(out["seconds"]))  # type: ignore[arg-type]
            if op == "load":
                engine += [float(w["seconds"]) for w in out["workers"].values()]  # type: ignore[attr-defined]
    api["engine load (worker)"] = engine
    return {op: f"median {statistics.median(v):.3f} max {max(v):.3f}" for op, v in api.items()}
