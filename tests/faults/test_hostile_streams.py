"""Hostile tenant, streams (issue 17 items 1, 2, 9): a malformed Last-Event-ID never
reaches the shared XREAD, a cursor Redis refuses ends only its own subscribers, a resume
after the terminal event is a 204, and an idle subscription logs nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from tests.faults.harness import FAKE, FAKE_IDLE, check_exactly_once, submit, wait_terminal
from tests.faults.hostile import BLOCK_MS, Victim, client, hostile, hredis, logs_of
from tests.faults.test_abusive_input import assert_envelope
from tokenq.api.streams import BadCursor, StreamHub, hub_client
from tokenq.cli.stack import Stack
from tokenq.client.sse import parse_lines, stream_events
from tokenq.shared import keys
from tokenq.shared.settings import Settings

__all__ = ["hostile", "hredis"]  # fixtures, used by name

# Each was accepted by Python's int() (or by Redis) before: none is an id we ever write.
BAD_IDS = ["1_0-0", "-1", "1-2-3", "1-", "-", "0x10-0", "+1-0", "1.5-0",
           "99999999999999999999999-0", "18446744073709551616-0", "1-18446744073709551616",
           "1e3-0", "1", "0-0-0", "1--1"]
# Arabic-Indic and fullwidth digits, a newline, a NUL, spaces: as a query parameter only
# (a header cannot carry them).
UNICODE_IDS = ["\u0661\u0662-\u0660", "\uff11-\uff10", "1-0\n", "1-0\x00", " 1-0", "1-0 "]


def test_malformed_last_event_id_is_400_and_the_victim_finishes(
        hostile: Stack, hredis: redis.Redis) -> None:
    victim = Victim(hostile)
    with client(hostile, "alpha") as alpha:
        own = submit(alpha, 1, 5)[0]
        refused = 0
        for bad in BAD_IDS:
            resp = alpha.get(f"/v1/jobs/{own}/events", headers={"Last-Event-ID": bad})
            assert_envelope(resp, 400)
            assert resp.json()["error"]["param"] == "last_event_id", (bad, resp.text)
            refused += 1
        for bad in BAD_IDS + UNICODE_IDS:
            resp = alpha.get(f"/v1/jobs/{own}/events", params={"last_event_id": bad})
            assert_envelope(resp, 400)
            refused += 1
    body = victim.finish()
    assert body["choices"][0]["finish_reason"] == "length"
    check_exactly_once(hredis, [victim.job_id], victim.max_tokens)
    print(f"\n[hostile] {refused} malformed Last-Event-IDs: all 400; the victim's stream "
          f"({victim.max_tokens} tokens) and chat request finished whole meanwhile")


@pytest.mark.parametrize("notify", [True, False], ids=["notified", "blocking"])
def test_a_cursor_redis_refuses_ends_only_its_subscribers(
        hostile: Stack, hredis: redis.Redis, notify: bool) -> None:
    """Defence in depth: a cursor that got past validation (simulated by planting it in
    the hub) makes Redis refuse the whole XREAD; the hub ends that stream's subscribers
    and every other stream goes on. (Notified: the full read names the planted cursor.)"""
    with client(hostile, "beta") as beta:
        good = submit(beta, 1, 200)[0]  # ~0.2 s
        idle = submit(beta, 1, 5, model=FAKE_IDLE)[0]

    async def scenario() -> tuple[list[str], BaseException | None]:
        r = hub_client(Settings(redis_url=hostile.redis_url), BLOCK_MS)
        hub = StreamHub(r, block_ms=BLOCK_MS, notify=notify, full_read_ms=200)
        await hub.start()
        try:
            bad_sub = hub.subscribe(keys.job_events(idle), None)
            first = await anext(bad_sub)  # registered, reading the idle stream
            assert first[1]["e"] == "queued"
            hub._cursor[keys.job_events(idle)] = "1_0-0"  # what int() once let through
            failure: BaseException | None = None
            try:
                await asyncio.wait_for(anext(bad_sub), timeout=60)
            except BadCursor as exc:
                failure = exc
            got = [e["e"] async for _, e in hub.subscribe(keys.job_events(good), None)]
            return got, failure
        finally:
            await hub.stop()
            await r.aclose()

    events, failure = asyncio.run(scenario())
    assert isinstance(failure, BadCursor)
    assert events[-1] == "done" and events.count("token") == 200
    wait_terminal(hredis, [good], 30)
    check_exactly_once(hredis, [good], 200)


def test_resume_at_or_after_the_terminal_event_is_204(hostile: Stack) -> None:
    with client(hostile, "alpha") as alpha:
        job = submit(alpha, 1, 20)[0]
        events = list(stream_events(alpha, job, timeout=60))
        done = events[-1]
        assert done.event == "done" and done.id
        ms, seq = done.id.split("-")
        for after in (done.id, f"{ms}-{int(seq) + 1}", f"{int(ms) + 1}-0",
                      "18446744073709551615-18446744073709551615"):
            resp = alpha.get(f"/v1/jobs/{job}/events", headers={"Last-Event-ID": after})
            assert resp.status_code == 204, (after, resp.status_code, resp.text[:200])
            resp = alpha.get(f"/v1/jobs/{job}/events", params={"last_event_id": after})
            assert resp.status_code == 204, after
        # One before the end still gets exactly the rest.
        before = events[-2]
        rest = list(stream_events(alpha, job, last_event_id=before.id, timeout=60))
        assert [e.event for e in rest] == ["done"]


def test_a_cursor_past_a_running_stream_gets_the_rest(hostile: Stack) -> None:
    """An id after the stream's last entry (never one of its ids) is read as 'at the end':
    the client gets what comes next and the end, not pings forever."""
    with client(hostile, "alpha") as alpha:
        job = submit(alpha, 1, 2000)[0]  # ~2 s
        future = f"{int(time.time() * 1000) + 10**9}-0"
        rest = list(stream_events(alpha, job, last_event_id=future, timeout=60))
    assert rest and rest[-1].event == "done"


def test_idle_subscription_logs_no_timeouts(hostile: Stack) -> None:
    """The shared XREAD's socket timeout exceeds its BLOCK: a subscription on a stream
    with nothing to say spans several BLOCK periods without a timeout in the log."""
    with client(hostile, "alpha") as alpha:
        idle = submit(alpha, 1, 5, model=FAKE_IDLE)[0]
        before = logs_of(hostile).get("api.log", "")
        pings = 0
        with alpha.stream("GET", f"/v1/jobs/{idle}/events", timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                pings += line.startswith(": ping")
                if pings >= 5 * 1000 // BLOCK_MS:  # 1 ping/s: 5 s, five BLOCK periods
                    break
        alpha.delete(f"/v1/jobs/{idle}")
    new = logs_of(hostile).get("api.log", "")[len(before):]
    for bad in ("Timeout reading", "XREAD", "Traceback"):
        assert bad not in new, new[-2000:]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_openai_streams_ignore_last_event_id(hostile: Stack, route: str) -> None:
    """The OpenAI-shaped streams do not resume (each request is a new job): a hostile
    Last-Event-ID on them is ignored, never a cursor."""
    body = {"model": FAKE, "max_tokens": 3, "stream": True}
    body |= ({"messages": [{"role": "user", "content": "x"}]} if "chat" in route
             else {"prompt": "x"})
    with client(hostile, "alpha") as alpha, alpha.stream(
            "POST", route, json=body, headers={"Last-Event-ID": "1_0-0"}) as resp:
        assert resp.status_code == 200
        lines = list(resp.iter_lines())
    assert "data: [DONE]" in lines
    assert not any(e.data.get("error") for e in parse_lines(iter(
        ln for ln in lines if ln != "data: [DONE]")))


def test_stream_ids_validated_strictly() -> None:
    from tokenq.api.stream_ids import is_valid_id

    assert is_valid_id("1700000000000-0") and is_valid_id("0-0")
    assert is_valid_id("18446744073709551615-18446744073709551615")
    assert not any(is_valid_id(b) for b in BAD_IDS + UNICODE_IDS)
