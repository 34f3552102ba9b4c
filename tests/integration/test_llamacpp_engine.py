"""The llama.cpp engine on a real model: batching must not change what a job generates."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.base import EngineRequest, Finished, StepOutput
from tokenq.workers.engines.llamacpp import LlamaCppEngine

PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


class Collector:
    def __init__(self) -> None:
        self.text: dict[str, list[tuple[int, str]]] = {}
        self.ids: dict[str, list[int]] = {}
        self.finished: dict[str, Finished] = {}
        self.cond = threading.Condition()

    def sink(self, step: StepOutput) -> None:
        step.flushed.set()  # delivered (the publisher sets it once the step is in Redis)
        with self.cond:
            for t in step.tokens:
                self.text.setdefault(t.job_id, []).append((t.index, t.text))
                self.ids.setdefault(t.job_id, []).append(t.token_id)
            for f in step.finished:
                self.finished[f.job_id] = f
            self.cond.notify_all()

    def wait(self, ids: list[str], timeout: float = 120) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: all(i in self.finished for i in ids), timeout)

    def output(self, job_id: str) -> str:
        pieces = self.text.get(job_id, [])
        assert [i for i, _ in pieces] == list(range(len(pieces)))
        return "".join(t for _, t in pieces)


def start_engine(tmp: Path, **overrides: object) -> tuple[LlamaCppEngine, Collector]:
    settings = Settings(state_dir=tmp)
    cfg = settings.models()["smollm2-135m-instruct"].model_copy(
        update={"n_parallel": 4, **overrides})
    eng = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    col = Collector()
    eng.start(col.sink)
    return eng, col


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaCppEngine, Collector]]:
    # Batching alone must not change a job's text. Prefix reuse is tested on its own: reused
    # KV meets other batch shapes, and float kernels then differ in the last bits (as with
    # llama-server's cache_prompt), which can flip a greedy choice.
    eng, col = start_engine(tmp_path_factory.mktemp("engine"), prefix_cache=False)
    yield eng, col
    eng.close()


def request(job_id: str, prompt: str, max_tokens: int = 24) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0,
                            repetition_penalty=1.0)
    return EngineRequest(job_id=job_id, attempt=1, params=params,
                         messages=[{"role": "user", "content": prompt}])


def test_batched_text_equals_text_alone(engine: tuple[LlamaCppEngine, Collector]) -> None:
    eng, col = engine
    alone = []
    for i, p in enumerate(PROMPTS):
        eng.submit(request(f"alone-{i}", p))
        col.wait([f"alone-{i}"])
        alone.append(col.output(f"alone-{i}"))
    ids = [f"batch-{i}" for i in range(len(PROMPTS))]  # 8 jobs on 4 slots: slots are reused
    for job_id, p in zip(ids, PROMPTS, strict=True):
        eng.submit(request(job_id, p))
    col.wait(ids)
    assert [col.output(j) for j in ids] == alone
    assert all(col.finished[j].reason in ("stop", "length") for j in ids)
    assert eng.stats().running == 0


def test_an_empty_prompt_ends_at_once_and_alone(engine: tuple[LlamaCppEngine, Collector]) -> None:
    """`prompt: ""` is no token on SmolLM2 (no BOS). It used to sit in its slot until it was
    the only job left, then llama_decode got an empty batch (-1) and the engine failed every
    job it held. Now it ends at admission with `bad_request`; the job beside it is exact."""
    eng, col = engine
    eng.submit(request("ref-e", PROMPTS[0], max_tokens=40))
    col.wait(["ref-e"])
    eng.submit(request("long-e", PROMPTS[0], max_tokens=40))
    eng.submit(EngineRequest(job_id="empty", attempt=1, prompt="",
                             params=request("empty", "").params))
    col.wait(["empty"], timeout=30)
    assert "long-e" not in col.finished  # it ended first, while the other still ran
    assert (col.finished["empty"].reason, col.finished["empty"].error_code) == ("error",
                                                                                "bad_request")
    col.wait(["long-e"])
    assert col.finished["long-e"].reason == "length"
    assert col.output("long-e") == col.output("ref-e")
    assert eng.stats().running == 0


def test_cancel_one_leaves_the_others_exact(engine: tuple[LlamaCppEngine, Collector]) -> None:
    eng, col = engine
    expected = {}
    for i in range(4):
        eng.submit(request(f"ref-{i}", PROMPTS[i], max_tokens=40))
        col.wait([f"ref-{i}"])
        expected[i] = col.output(f"ref-{i}")
    for i in range(4):
        eng.submit(request(f"mix-{i}", PROMPTS[i], max_tokens=40))
    eng.cancel("mix-2")
    col.wait([f"mix-{i}" for i in range(4)])
    assert col.finished["mix-2"].reason == "cancelled"
    for i in (0, 1, 3):
        assert col.output(f"mix-{i}") == expected[i]
    assert eng.stats().running == 0


def test_prefix_reuse_skips_the_shared_template(tmp_path: Path) -> None:
    eng, col = start_engine(tmp_path, prefix_cache=True)
    try:
        template = ("You summarise customer-service calls. Write the issue, the actions, the "
                    "outcome and the follow-up, one line each, in plain English. ") * 4
        first = request("tpl-0", "")
        first.messages = [{"role": "system", "content": template},
                          {"role": "user", "content": "Call: the customer wants a refund."}]
        eng.submit(first)
        col.wait(["tpl-0"])
        before = eng.prefix_reused_tokens
        ids = []
        for i in range(1, 4):
            req = request(f"tpl-{i}", "")
            req.messages = [{"role": "system", "content": template},
                            {"role": "user", "content": f"Call {i}: the parcel is late."}]
            eng.submit(req)
            col.wait([req.job_id])  # one at a time: each finds the previous job's slot
            ids.append(req.job_id)
        reused = eng.prefix_reused_tokens - before
        prompt_len = col.finished["tpl-1"].prompt_tokens
        assert reused >= 3 * (prompt_len - 20), (reused, prompt_len)  # the template each time
        assert eng.stats().prefix_hit_ratio > 0.5
        for job_id in ids:
            assert col.finished[job_id].reason in ("stop", "length")
            assert col.output(job_id)
    finally:
        eng.close()


def test_a_fresh_engine_starts_with_the_template_opening_in_every_slot(tmp_path: Path) -> None:
    """The first burst after start (one chat job per slot, nothing run before) keeps the
    chat template's opening (SmolLM2's default system prompt) in every slot."""
    eng, col = start_engine(tmp_path, prefix_cache=True)
    try:
        assert eng.prefix_reused_tokens == 0
        ids = [f"cold-{i}" for i in range(eng.slots)]
        for i, job_id in enumerate(ids):
            eng.submit(request(job_id, f"Say something about the number {i}.", 8))
        col.wait(ids)
        assert all(col.finished[j].reason in ("stop", "length") for j in ids)
        assert eng.prefix_reused_tokens >= eng.slots * 20, eng.prefix_reused_tokens
    finally:
        eng.close()


@pytest.mark.parametrize("ram_mb", [512, 0])
def test_a_reused_slots_cells_come_back_from_host_memory(tmp_path: Path, ram_mb: int) -> None:
    """One slot: job B overwrites job A's cells, which were first copied to host memory;
    A's input again gets them copied back, not prefilled, and its greedy text is the same
    as with the cells still in the slot (the very cells: not a recomputation). With the
    RAM cache off, A is prefilled again."""
    eng, col = start_engine(tmp_path, n_parallel=1, prompt_cache_ram_mb=ram_mb)
    long = " ".join(PROMPTS) * 2  # ~200 tokens
    try:
        def run(job_id: str, prompt: str) -> int:
            before = eng.prefix_reused_tokens
            eng.submit(request(job_id, prompt, max_tokens=16))
            col.wait([job_id])
            return eng.prefix_reused_tokens - before

        run("a1", long)
        prompt_len = col.finished["a1"].prompt_tokens
        assert run("a2", long) == prompt_len - 1  # still in the slot
        assert run("b", PROMPTS[0]) < 64  # the chat template's few tokens at most
        reused = run("a3", long)
    finally:
        eng.close()
    if ram_mb:
        assert reused == prompt_len - 1
        assert col.output("a3") == col.output("a2")
    else:
        assert reused < 64


SCHEMA = {"type": "object", "properties": {
    "colour": {"type": "string", "maxLength": 20},
    "count": {"type": "integer"}}, "required": ["colour", "count"],
    "additionalProperties": False}


def test_json_schema_output_and_resume_mid_json(
        engine: tuple[LlamaCppEngine, Collector]) -> None:
    """Grammar-constrained output parses; a takeover that resumes halfway through the JSON
    continues that same object: the grammar state is replayed from the streamed tokens.
    (Not asserted: the same digits. The resumed prefix is prefilled in one batch instead
    of token by token, and float kernels may then flip a near-tie greedy choice.)"""
    eng, col = engine
    req = request("json-full", "Describe an apple in JSON.", max_tokens=60)
    req.params.json_schema = SCHEMA
    req.params.repetition_penalty = 1.1  # the penalty window is replayed on resume too
    eng.submit(req)
    col.wait(["json-full"])
    ids = col.ids["json-full"]
    full = col.output("json-full")
    assert col.finished["json-full"].reason == "stop"
    doc = json.loads(full)
    assert set(doc) == {"colour", "count"} and isinstance(doc["count"], int)
    half = len(ids) // 2
    resumed = request("json-resumed", "Describe an apple in JSON.", max_tokens=60)
    resumed.params = req.params
    resumed.resume_token_ids = ids[:half]
    eng.submit(resumed)
    col.wait(["json-resumed"])
    pieces = col.text["json-resumed"]
    assert pieces[0][0] == half  # numbering continues after the streamed tokens
    head = "".join(t for _, t in col.text["json-full"][:half])
    assert col.finished["json-resumed"].reason == "stop"
    doc2 = json.loads(head + "".join(t for _, t in pieces))  # without replay: a 2nd "{"
    assert set(doc2) == {"colour", "count"}


def test_step_after_a_first_token_waits_for_its_flush(tmp_path: Path) -> None:
    """The engine does not start the next step until the step carrying a job's first token
    is flushed (in Redis, for the publisher), so that write does not compete with the next
    llama_decode for the cores; the wait is bounded by first_token_flush_ms."""
    settings = Settings(state_dir=tmp_path)
    cfg = settings.models()["smollm2-135m-instruct"].model_copy(
        update={"n_parallel": 2, "first_token_flush_ms": 10_000})
    eng = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    arrived: list[tuple[float, StepOutput]] = []
    flushed_at: list[float] = []
    done = threading.Event()

    def flush_later(step: StepOutput) -> None:
        time.sleep(0.5)
        flushed_at.append(time.monotonic())
        step.flushed.set()

    def sink(step: StepOutput) -> None:
        arrived.append((time.monotonic(), step))
        if step.first_token:
            threading.Thread(target=flush_later, args=(step,)).start()
        else:
            step.flushed.set()
        if step.finished:
            done.set()

    eng.start(sink)
    try:
        eng.submit(request("flush-1", PROMPTS[0], max_tokens=4))
        assert done.wait(60)
        firsts = [i for i, (_, st) in enumerate(arrived) if st.first_token]
        assert len(firsts) == 1 and arrived[firsts[0]][1].tokens[0].index == 0
        # the next step came only after the flush (0.5 s later), not one decode (~10 ms) later
        assert arrived[firsts[0] + 1][0] >= flushed_at[0]
        # Bounded: a sink that never flushes (Redis down) delays a job's next step by at
        # most first_token_flush_ms, it does not stop the engine.
        eng.cfg = cfg.model_copy(update={"first_token_flush_ms": 200})
        arrived.clear()
        done.clear()

        def never(step: StepOutput) -> None:
            arrived.append((time.monotonic(), step))
            if step.finished:
                done.set()

        eng._sink = never
        eng.submit(request("flush-2", PROMPTS[1], max_tokens=4))
        assert done.wait(60)
        first = next(i for i, (_, st) in enumerate(arrived) if st.first_token)
        gap = arrived[first + 1][0] - arrived[first][0]
        assert 0.15 < gap < 5, gap
    finally:
        eng.close()


def test_n_siblings_share_one_prefill(engine: tuple[LlamaCppEngine, Collector]) -> None:
    """Jobs with the same input (a request's n choices): one prefill; the others copy its KV
    (seq_cp) and sample from its last row, or, arriving after its prefill, decode only the
    prompt's last token. The text is unchanged."""
    eng, col = engine
    prompt = "Describe the refund policy for a duplicate charge in two sentences."
    eng.submit(request("sib-alone", prompt, 12))
    col.wait(["sib-alone"])
    before = eng.prefix_reused_tokens
    ids = [f"sib-{i}" for i in range(3)]
    for job_id in ids:
        eng.submit(request(job_id, prompt, 12))
    col.wait(ids)
    n_prompt = col.finished["sib-0"].prompt_tokens
    # two copies of one prefill (a late sibling re-decodes the prompt's last token)
    assert eng.prefix_reused_tokens - before >= 2 * (n_prompt - 1)
    assert {col.output(i) for i in ids} == {col.output("sib-alone")}
    # A sibling that arrives while the first is already generating copies its KV too.
    eng.submit(request("late-0", prompt, 40))
    with col.cond:
        assert col.cond.wait_for(lambda: "late-0" in col.text, 60)
    before = eng.prefix_reused_tokens
    eng.submit(request("late-1", prompt, 12))
    col.wait(["late-0", "late-1"])
    assert eng.prefix_reused_tokens - before == n_prompt - 1
    assert col.output("late-1") == col.output("sib-alone")


def test_cache_prompt_false_prefills_afresh(tmp_path: Path) -> None:
    """llama-server's `cache_prompt: false`: no cached prefix and no sibling's KV is reused,
    so a greedy job's text is that of a fresh prefill whatever ran before it."""
    eng, col = start_engine(tmp_path, prefix_cache=True)
    try:
        prompt = "List the steps to reset a router, numbered, one line each."
        eng.submit(request("fresh-0", prompt, 16))
        col.wait(["fresh-0"])  # a fresh prefill: nothing cached yet
        before = eng.prefix_reused_tokens
        again = [request(f"fresh-{i}", prompt, 16) for i in (1, 2)]
        for req in again:
            req.params.cache_prompt = False
            eng.submit(req)
        col.wait([r.job_id for r in again])
        assert eng.prefix_reused_tokens == before  # neither the cache nor a sibling's KV
        assert {col.output(r.job_id) for r in again} == {col.output("fresh-0")}
        eng.submit(request("cached-0", prompt, 16))  # the default reuses the cached prompt
        col.wait(["cached-0"])
        assert eng.prefix_reused_tokens > before
    finally:
        eng.close()
