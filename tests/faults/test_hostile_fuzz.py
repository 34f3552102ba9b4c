"""Hostile tenant, fuzz pass (issue 17): thousands of random JSON shapes and sizes under
the body limit, over every request model, from one key: no answer is a 5xx and no
worker dies. Seeded (TOKENQ_FUZZ_SEED, default 17) and bounded (TOKENQ_FUZZ_N requests,
default 2,400), so a failure replays exactly."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.faults.harness import FAKE, FAKE_IDLE
from tests.faults.hostile import client, hostile, logs_of
from tokenq.cli.stack import Stack

__all__ = ["hostile"]  # fixture, used by name

SEED = int(os.environ.get("TOKENQ_FUZZ_SEED", "17"))
N = int(os.environ.get("TOKENQ_FUZZ_N", "2400"))
BODY_LIMIT = 200_000  # the hostile stack's TOKENQ_API__MAX_BODY_BYTES
NO_TOKENIZER = 1503  # a 503 `no_tokenizer`: the fake model has no tokenizer (not a fault)
MSG = [{"role": "user", "content": "hi"}]
# A valid body per JSON route (model FAKE, a few tokens): the fuzzer mutates these.
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": FAKE, "max_tokens": 2, "messages": MSG},
    "/v1/completions": {"model": FAKE, "max_tokens": 2, "prompt": "hi"},
    "/v1/embeddings": {"model": FAKE, "input": ["hi"]},
    "/v1/jobs": {"model": FAKE, "max_tokens": 2, "prompt": "hi"},
    "/v1/batches": {"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
                    "completion_window": "24h"},
    "/tokenize": {"model": FAKE, "prompt": "hi"},
    "/detokenize": {"model": FAKE, "tokens": [1, 2]},
    "/v1/adapters": {"name": "x", "model": FAKE, "path": "/tmp/x"},
}
FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "n",
          "seed", "stop", "stream", "logit_bias", "logprobs", "top_logprobs", "metadata",
          "priority", "response_format", "input", "tokens", "deadline", "cache_prompt",
          "stream_options", "min_p", "presence_penalty", "frequency_penalty", "tools",
          "max_completion_tokens", "encoding_format", "dimensions", "user", "echo",
          "input_file_id", "endpoint", "completion_window", "name", "path", "shared",
          "owner", "role", "content", "suffix", "best_of", "repetition_penalty"]


_ODD = random.Random(0)
ODD_KEYS = ["".join(_ODD.choice("abcxyz_-$é") for _ in range(_ODD.randint(1, 70)))
            for _ in range(40)]
SCALARS: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -(2**64), 10**30, 2**70 + 1, 0.5,
    -0.0, 1e308, -1e-308, 3.7e19, "", "x", FAKE, FAKE_IDLE, "high", "low", "json_schema",
    "user", "system", "\u0000", "\ud7ff\ue000", "\ud800", "x\udfff", "\ud83d\ude00",
    "é" * 50, "a" * 64, "a" * 65, "a" * 512,
    "a" * 513, "a" * 5000, "1_0-0", "file-x", "/v1/chat/completions", "24h"]


def scalar(rng: random.Random) -> Any:
    return rng.choice(SCALARS)


def value(rng: random.Random, budget: list[int] | None = None) -> Any:
    """A random JSON value of at most ~100 nodes (a shared budget bounds the tree), or now
    and then a narrow chain nested up to 300 deep."""
    budget = budget if budget is not None else [rng.choice([4, 16, 80])]
    budget[0] -= 1
    roll = rng.random()
    if roll < 0.03:
        chain: Any = scalar(rng)
        for _ in range(rng.choice([10, 40, 300])):
            chain = [chain] if rng.random() < 0.5 else {"type": "object", "a": chain}
        return chain
    if budget[0] <= 0 or roll < 0.45:
        return scalar(rng)
    if roll < 0.7:
        n = min(rng.choice([0, 1, 2, 3, 17, 100]), budget[0])
        return [value(rng, budget) for _ in range(n)]
    keys = rng.sample(FIELDS, k=rng.randint(0, 4)) + rng.sample(
        ODD_KEYS, k=min(rng.choice([0, 1, 17]), max(budget[0], 0)))
    return {k: value(rng, budget) for k in keys}


def mutate(rng: random.Random, base: dict[str, Any]) -> dict[str, Any] | list[Any] | Any:
    body = dict(base)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.4:
            body[rng.choice(FIELDS)] = value(rng)
        elif op < 0.6 and body:
            body.pop(rng.choice(list(body)))
        elif op < 0.8:
            body[rng.choice(list(base) or FIELDS)] = value(rng)
        elif op < 0.9:
            return value(rng)  # not an object at all
        else:
            body["messages"] = [{"role": value(rng), "content": value(rng)}
                                for _ in range(rng.randint(0, 5))]
    if body.get("model") == FAKE and rng.random() < 0.5:
        body["stream"] = False  # non-streaming answers come back whole
    return body


def request(rng: random.Random) -> tuple[str, str, bytes]:
    route = rng.choice([*BASES, "/v1/files", "raw"])
    if route == "raw":  # bytes that are not JSON, or JSON nested past any parser's depth
        depth = rng.choice([10, 1000, 50_000])
        raw = rng.choice([b"[" * depth + b"]" * depth, bytes(rng.randbytes(300)),
                          b'{"model": "' + FAKE.encode() + b'", "prompt": ' + b"[" * depth])
        return "POST", rng.choice(list(BASES)), raw[:BODY_LIMIT]
    if route == "/v1/files":
        return "FILE", route, bytes(rng.randbytes(rng.randint(0, 3000)))
    body = json.dumps(mutate(rng, BASES[route]), ensure_ascii=rng.random() < 0.5,
                      allow_nan=True).encode("utf-8", "surrogatepass")
    return "POST", route, body[:BODY_LIMIT] if len(body) > BODY_LIMIT else body


def send(c: httpx.Client, item: tuple[str, str, bytes]) -> int:
    """The answer's status; a 5xx other than the fake model's documented `no_tokenizer`
    503 (/tokenize on a model without a tokenizer here) counts as 500."""
    kind, route, body = item
    if kind == "FILE":
        resp = c.post(route, data={"purpose": "user_data" if body else "nope"},
                      files={"file": ("f.jsonl", body)})
        if resp.status_code == 200:
            c.delete(f"{route}/{resp.json()['id']}")
        return resp.status_code
    resp = c.post(route, content=body, headers={"content-type": "application/json"})
    if resp.status_code == 202 and route == "/v1/jobs":  # do not keep the queue busy
        c.delete(f"/v1/jobs/{resp.json()['id']}")
    if resp.status_code == 503 and resp.json()["error"]["code"] == "no_tokenizer":
        return NO_TOKENIZER
    return resp.status_code


def test_fuzz_every_request_model(hostile: Stack) -> None:
    rng = random.Random(SEED)
    items = [request(rng) for _ in range(N)]
    statuses: Counter[int] = Counter()
    failures: list[tuple[int, str, bytes]] = []
    with client(hostile, "alpha", timeout=60) as c, ThreadPoolExecutor(4) as pool:
        for item, status in zip(items, pool.map(lambda it: send(c, it), items), strict=True):
            statuses[status] += 1
            if 500 <= status < 600:
                failures.append((status, item[1], item[2][:300]))
    dead = [p.pid for _, p in hostile.worker_procs if p.poll() is not None]
    api_log = logs_of(hostile).get("api.log", "")
    print(f"\n[hostile] fuzz seed {SEED}: {N} requests, statuses {dict(sorted(statuses.items()))}"
          f", {len(failures)} >= 500, {len(dead)} dead workers")
    assert not failures, failures[:5]
    assert not dead
    assert hostile.api is not None and hostile.api.poll() is None
    assert "unhandled error" not in api_log, api_log[-3000:]


SURROGATE = "x\\ud800"  # as JSON spells it: a lone high surrogate


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", f'{{"model": "{FAKE}", "messages": [{{"role": "user", '
     f'"content": "hi"}}], "stop": "{SURROGATE}"}}', "stop"),
    ("/v1/completions", f'{{"model": "{FAKE}", "prompt": "hi", "stop": ["a", '
     f'"{SURROGATE}"]}}', "stop.1"),
    ("/v1/jobs", f'{{"model": "{FAKE}", "prompt": "hi", "metadata": {{"{SURROGATE}": "v"}}}}',
     "metadata"),
    ("/v1/jobs", f'{{"model": "{FAKE}", "prompt": "hi", "response_format": {{"type": '
     f'"json_schema", "json_schema": {{"name": "x", "schema": {{"enum": ["{SURROGATE}"]}}}}}}}}',
     "response_format.json_schema.schema.enum.0"),
    ("/tokenize", f'{{"model": "{FAKE}", "prompt": "a{SURROGATE}"}}', "prompt"),
])
def test_a_lone_surrogate_is_a_400_naming_where(hostile: Stack, route: str, body: str,
                                                param: str) -> None:
    """Each was a 500: nothing downstream (pydantic's serializer, Redis's writer, the
    tokenizer) can hold a lone surrogate, so the API refuses it before they run. A pair
    spelled the same way is an emoji and passes."""
    with client(hostile, "alpha") as c:
        resp = c.post(route, content=body.encode(), headers={"content-type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_text"
        assert resp.json()["error"]["param"] == param
        paired = body.replace("\\ud800", "\\ud83d\\ude00").encode()
        ok = c.post(route, content=paired, headers={"content-type": "application/json"})
        assert "invalid_text" not in ok.text and ok.status_code != 500, ok.text
