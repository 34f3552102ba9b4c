"""A batch's output file, rendered from its job records (api/openai/batch_files.py): each
line in OpenAI's format (a line with tools carries its calls, read back with the plan its
record keeps), without reading the records' requests (a line's tools alone may be 256 KB),
and a chunk of long outputs rendered on the CPU pool, not on the event loop that serves
every other stream of the replica. Read whole and rendered on the loop, 256 such lines
stood the loop still for ~0.6 s a chunk (on a loaded 2-core machine): a download of them
stalled every stream meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any, cast

import redis
import redis.asyncio as aredis

from tokenq.api.cpu import CpuPool
from tokenq.api.deps import AppState
from tokenq.api.openai import batch_files
from tokenq.api.openai.batch_lines import line_job_id
from tokenq.shared import keys

BATCH = "batch_0render"
LINES = 256
PROPS = {f"field_{i}": {"type": "string", "maxLength": 20, "description": "d" * 40}
         for i in range(40)}
# ~250 KB of tools a line, under MAX_TOOLS_CHARS: with tool_choice `none` none of it
# reaches the prompt, so a short prompt stores them all.
TOOLS = [{"type": "function", "function": {"name": f"tool_{n}", "description": "x" * 200,
                                           "parameters": {"type": "object",
                                                          "properties": PROPS}}}
         for n in range(55)]


def seed(r: redis.Redis, *, tools: bool) -> None:
    r.hset(keys.batch(BATCH), mapping={"id": BATCH, "owner": "alpha",
                                       "endpoint": "/v1/chat/completions"})
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 4}
    if tools:
        request |= {"tools": TOOLS, "tool_choice": "auto"}
    raw = json.dumps(request)
    # The generic format's reply with a call: long arguments (a long output, to parse)
    call = {"tool_calls": [{"name": "tool_1", "arguments": {"field_0": "a" * 8000}}]}
    pipe = r.pipeline(transaction=False)
    for n in range(1, LINES + 1):
        job_id = line_job_id(BATCH, n)
        h = {"id": job_id, "owner": "alpha", "model": "m", "state": "succeeded",
             "attempts": "1", "created_at": "1.0", "started_at": "2.0",
             "output": json.dumps(call) if tools else "Hello",
             "finish_reason": "stop", "custom_id": f"c{n}", "request": raw,
             "spec": json.dumps({"messages": request["messages"], "params": {}}),
             "usage": json.dumps({"prompt_tokens": 3, "completion_tokens": 1,
                                  "total_tokens": 4})}
        if tools:
            h["tool_format"] = "generic"
            h["tool_plan"] = json.dumps({"mode": "auto", "fmt": "generic", "parallel": True,
                                         "named": None})
        pipe.hset(keys.job(job_id), mapping=h)
        pipe.rpush(keys.batch_out(BATCH), job_id)
    pipe.execute()


async def render_watching_the_loop(port: int) -> tuple[list[dict[str, Any]], float, float]:
    """The output file's lines, the loop's worst lag while it rendered, and how long the
    render took."""
    client = aredis.Redis(port=port, db=15, decode_responses=True)
    pool = CpuPool(2, 1, 8)
    state = cast(AppState, SimpleNamespace(redis=client, counter=SimpleNamespace(pool=pool)))
    worst, done = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.002)
            worst = max(worst, time.perf_counter() - t - 0.002)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    try:
        pieces = [p async for p in batch_files.render(
            state, {"batch": BATCH, "kind": "batch_completed"})]
    finally:
        took = time.perf_counter() - start
        done.set()
        await tick
        pool.close()
        await client.aclose()
    lines = [json.loads(x) for x in b"".join(pieces).decode().splitlines()]
    return lines, worst, took


def test_a_chunk_of_large_records_renders_off_the_event_loop(r: redis.Redis) -> None:
    seed(r, tools=True)
    port = r.connection_pool.connection_kwargs["port"]
    lines, worst, took = asyncio.run(render_watching_the_loop(port))
    print(f"\n[render] {LINES} lines with {len(json.dumps(TOOLS))} B of tools each: "
          f"{took * 1000:.0f} ms, the loop's worst lag {worst * 1000:.0f} ms")
    assert [x["custom_id"] for x in lines] == [f"c{n}" for n in range(1, LINES + 1)]
    choice = lines[0]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "tool_1"
    assert json.loads(call["function"]["arguments"]) == {"field_0": "a" * 8000}
    # Inline, the loop stood still for the whole chunk (its lag was the render's time);
    # on the pool it waits at most for the GIL between records.
    assert worst < max(0.1, took / 3), (worst, took)


def test_lines_without_tools_render_inline(r: redis.Redis) -> None:
    seed(r, tools=False)
    port = r.connection_pool.connection_kwargs["port"]
    lines, _, _ = asyncio.run(render_watching_the_loop(port))
    assert len(lines) == LINES and lines[-1]["custom_id"] == f"c{LINES}"
    choice = lines[-1]["response"]["body"]["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert lines[-1]["response"]["status_code"] == 200 and lines[-1]["error"] is None
