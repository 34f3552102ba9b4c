"""The jobs API end to end: real Redis, real Celery workers, real llama.cpp models."""

from __future__ import annotations

import json
import time

import httpx
import redis

from tests.conftest import GEMMA, IDLE_MODEL, SMOL
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def submit(client: httpx.Client, **body: object) -> dict[str, object]:
    body.setdefault("model", SMOL)
    if "prompt" not in body:
        body.setdefault("messages", CHAT)
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    assert resp.headers["location"] == f"/v1/jobs/{resp.json()['id']}"
    out: dict[str, object] = resp.json()
    return out


def all_events(client: httpx.Client, job_id: str, last: str | None = None) -> list[RawEvent]:
    return list(stream_events(client, job_id, last_event_id=last, timeout=120))


def tokens(events: list[RawEvent]) -> list[RawEvent]:
    return [e for e in events if e.event == "token"]


def test_submit_stream_done(client: httpx.Client) -> None:
    job = submit(client, max_tokens=24, temperature=0)
    assert job["status"] == "queued" and job["stream_url"] == f"/v1/jobs/{job['id']}/events"
    events = all_events(client, str(job["id"]))
    kinds = [e.event for e in events]
    assert kinds[0] == "queued" and kinds[1] == "started" and kinds[-1] == "done"
    assert set(kinds[2:-1]) == {"token"}
    toks = tokens(events)
    assert [t.data["index"] for t in toks] == list(range(len(toks)))
    assert events[1].data["attempt"] == 1 and ":" in events[1].data["worker"]
    ids = [e.id for e in events]
    assert all(ids) and len(set(ids)) == len(ids)

    record = client.get(f"/v1/jobs/{job['id']}").json()
    assert record["status"] == "succeeded" and record["attempts"] == 1
    assert record["output"] == "".join(t.data["text"] for t in toks)
    assert record["usage"]["completion_tokens"] == len(toks)
    assert record["usage"]["prompt_tokens"] > 5
    assert events[-1].data["usage"] == record["usage"]
    assert events[-1].data["finish_reason"] in ("stop", "length")
    assert record["started_at"] >= record["created_at"]
    assert record["finished_at"] >= record["started_at"]


def test_resume_with_last_event_id_yields_exactly_the_rest(client: httpx.Client) -> None:
    job_id = str(submit(client, max_tokens=20, temperature=0)["id"])
    full = all_events(client, job_id)
    middle = full[len(full) // 2]
    rest = all_events(client, job_id, last=middle.id)
    assert [e.id for e in rest] == [e.id for e in full[len(full) // 2 + 1:]]
    # ?last_event_id= works the same way
    with client.stream("GET", f"/v1/jobs/{job_id}/events",
                       params={"last_event_id": middle.id}) as resp:
        from tokenq.client.sse import parse_lines

        via_query = list(parse_lines(resp.iter_lines()))
    assert [e.id for e in via_query] == [e.id for e in rest]


def test_resume_while_running_has_no_gap_or_duplicate(client: httpx.Client) -> None:
    job_id = str(submit(client, max_tokens=60, temperature=0)["id"])
    seen: list[RawEvent] = []
    for ev in stream_events(client, job_id, timeout=60):  # disconnect after a few tokens
        seen.append(ev)
        if len(tokens(seen)) == 5:
            break
    rest = all_events(client, job_id, last=seen[-1].id)
    joined = tokens(seen) + tokens(rest)
    assert [t.data["index"] for t in joined] == list(range(len(joined)))
    assert rest[-1].event == "done"


def test_late_subscriber_gets_the_whole_stream(client: httpx.Client) -> None:
    job_id = str(submit(client, max_tokens=12, temperature=0)["id"])
    first = all_events(client, job_id)
    late = all_events(client, job_id)  # connects after `done`
    assert [(e.id, e.event, e.data) for e in late] == [(e.id, e.event, e.data) for e in first]


def test_cancel_queued_job_never_runs(client: httpx.Client, stack: Stack) -> None:
    job_id = str(submit(client, model=IDLE_MODEL, max_tokens=8)["id"])
    resp = client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert client.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"  # idempotent
    events = all_events(client, job_id)
    assert [e.event for e in events] == ["queued", "cancelled"]
    # Now start a worker for that model: it must drop the cancelled job and run the next.
    stack.add_worker(IDLE_MODEL)
    later = str(submit(client, model=IDLE_MODEL, max_tokens=4, temperature=0)["id"])
    assert all_events(client, later)[-1].event == "done"
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert record["status"] == "cancelled" and record["attempts"] == 0
    assert [e.event for e in all_events(client, job_id)] == ["queued", "cancelled"]


def test_cancel_running_job_aborts_engine_and_frees_slot(client: httpx.Client,
                                                         stack_redis: redis.Redis) -> None:
    job_id = str(submit(client, model=GEMMA, prompt="Once upon a time, in a small village,",
                        max_tokens=1500, temperature=0.9, seed=3)["id"])
    seen: list[RawEvent] = []
    for ev in stream_events(client, job_id, timeout=60):
        seen.append(ev)
        if len(tokens(seen)) == 5:
            break
    t0 = time.monotonic()
    record = client.delete(f"/v1/jobs/{job_id}").json()
    assert record["status"] == "cancelled", record
    assert time.monotonic() - t0 < 1.5
    events = all_events(client, job_id)
    assert events[-1].event == "cancelled"
    assert len(tokens(events)) < 1500
    assert [t.data["index"] for t in tokens(events)] == list(range(len(tokens(events))))
    # The engine let the slot go: the worker's heartbeat shows nothing running.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        beats = [json.loads(v) for v in stack_redis.hgetall("tokenq:workers").values()]
        if all(b["running"] == 0 for b in beats if b["model"] == GEMMA):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"gemma worker still busy: {beats}")


def test_jobs_route_to_their_model(client: httpx.Client, stack_redis: redis.Redis) -> None:
    beats = stack_redis.hgetall("tokenq:workers")
    workers = {wid: json.loads(v)["model"] for wid, v in beats.items()}
    a = str(submit(client, model=SMOL, max_tokens=4, temperature=0)["id"])
    b = str(submit(client, model=GEMMA, prompt="The capital of France is", max_tokens=4,
                   temperature=0)["id"])
    started_a = all_events(client, a)[1]
    started_b = all_events(client, b)[1]
    assert workers[started_a.data["worker"]] == SMOL
    assert workers[started_b.data["worker"]] == GEMMA
    assert client.get(f"/v1/jobs/{b}").json()["backend"] == "llama"


def test_more_jobs_than_slots_all_complete(client: httpx.Client) -> None:
    ids = [str(submit(client, max_tokens=8, temperature=0)["id"]) for _ in range(12)]
    for job_id in ids:
        events = all_events(client, job_id)
        assert events[-1].event == "done", events[-1]


def test_models_health_ready(client: httpx.Client) -> None:
    names = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert {SMOL, GEMMA} <= names
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    # IDLE_MODEL has no worker in this session until a test starts one.
    assert ready.json()["workers"][SMOL] >= 1 and ready.json()["workers"][GEMMA] >= 1


def test_every_sampling_parameter_runs(client: httpx.Client) -> None:
    """temperature/top_p/top_k/repetition_penalty/seed/stop all reach the sampler."""
    job = submit(client, max_tokens=12, temperature=0.8, top_p=0.9, top_k=20,
                 repetition_penalty=1.2, seed=11, stop=["\n\n"])
    events = all_events(client, str(job["id"]))
    assert events[-1].event == "done", events[-1]
    assert len(tokens(events)) >= 1


def test_same_seed_same_text(client: httpx.Client) -> None:
    texts = []
    for _ in range(2):
        job_id = str(submit(client, max_tokens=16, temperature=1.0, seed=1234)["id"])
        all_events(client, job_id)
        texts.append(client.get(f"/v1/jobs/{job_id}").json()["output"])
    assert texts[0] == texts[1] and texts[0]


def test_stop_string_ends_job_and_is_not_emitted(client: httpx.Client) -> None:
    job_id = str(submit(client, prompt="Count: 1, 2, 3, 4, 5, 6,", max_tokens=30,
                        temperature=0, stop=["9"])["id"])
    events = all_events(client, job_id)
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert events[-1].data["finish_reason"] == "stop"
    assert "9" not in record["output"]
    assert record["output"] == "".join(t.data["text"] for t in tokens(events))
