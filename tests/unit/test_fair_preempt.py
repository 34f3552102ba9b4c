"""Fair share's preemption in Redis (shared/lua/fair_victims.lua, preempt.lua with a
ticket, pick.lua): which running job makes room for the lane's next tenant, and where it
goes back."""

from __future__ import annotations

import time

import pytest
import redis

from tests.unit.test_fair_share import SPEC, TICKET, Q, owner, store, submit, take
from tests.unit.test_move import CELERY
from tokenq.shared import keys
from tokenq.shared.celery_app import task_message, ticket_message
from tokenq.shared.jobs import Ending, NoJob, Picked
from tokenq.shared.store import JobStore

LANE = keys.lane(Q)


def running(r: redis.Redis, ids: list[str]) -> list[str]:
    """`ids` as the preemptor passes them: the most recently started first."""
    assert all(r.hget(keys.job(j), "state") == "running" for j in ids)
    return list(reversed(ids))


def hand_back(s: JobStore, job_id: str) -> None:
    attempt = int(s.r.hget(keys.job(job_id), "attempts") or 0)
    assert s.preempt(job_id, "w", attempt, Q, "job-bound message (unused)", TICKET)


def test_a_tenant_holding_every_slot_makes_room_for_a_newcomer(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 6)
    slots = take(s, 2)  # a holds both slots, 4 more of a's wait
    submit(s, "b", 1)
    assert r.hgetall(keys.lane_held(LANE)) == {"a": "2"}
    assert s.fair_victims(Q, running(r, slots), 1000) == ("ok", "a-1")  # the newest
    # A second look (another worker's preemptor) frees nothing more: one is on its way.
    assert s.fair_victims(Q, running(r, slots), 1000) == ("claimed", None)
    hand_back(s, "a-1")
    rec = r.hgetall(keys.job("a-1"))
    assert rec["state"] == "queued" and rec["preemptions"] == "1" and "charged" not in rec
    assert r.lindex(keys.lane_list(LANE, "a"), 0) == "a-1"  # the head of its tenant's list
    # a ticket at the far end: 7 created (the takes here pop none) and this one
    assert r.lindex(Q, 0) == TICKET and r.llen(Q) == 8
    # The freed slot's take goes to b, not back to a's job; the claim is used up.
    assert take(s, 1) == ["b-0"]
    assert r.get(keys.lane_ceded(LANE)) is None
    assert r.hgetall(keys.lane_held(LANE)) == {"a": "1", "b": "1"}
    # One slot each now: nobody is owed another (b has nothing waiting, a is next).
    assert s.fair_victims(Q, running(r, ["a-0", "b-0"]), 1000) == ("none", None)
    # a's handed-back job resumes first of a's.
    assert take(s, 1) == ["a-1"]
    # Ending a job gives its slot back to the count.
    r.hset(keys.job("b-0"), "n_tokens", 1)
    assert s.finish(Ending("b-0", 1, "succeeded", {}, "done", "{}"))
    assert r.hgetall(keys.lane_held(LANE)) == {"a": "2"}


def test_slots_are_counted_over_every_worker(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 6)
    take(s, 3, worker="w1")
    here = take(s, 1, worker="w2")  # a holds 4 slots, one of them on this worker
    submit(s, "b", 1)
    assert s.fair_victims(Q, running(r, here), 1000) == ("ok", "a-3")


def test_the_less_served_tenant_is_never_the_one_to_make_room(r: redis.Redis) -> None:
    s = store(r)
    slots = take(s, 0) + [j for j in submit(s, "b", 2) if take(s, 1)]  # b holds both slots
    r.hset(keys.share("a"), mapping={"served": 1e6, "at": repr(time.time())})
    submit(s, "a", 1)  # a, served far more, waits and is the lane's next tenant
    assert s.fair_victims(Q, running(r, slots), 1000) == ("none", None)
    # The same with a served as little as b: a gets one of b's two slots.
    r.hset(keys.share("a"), "served", 1)
    r.zadd(keys.lane_tenants(LANE), {"a": 0})
    assert s.fair_victims(Q, running(r, slots), 1000) == ("ok", "b-1")


def test_weights_share_the_slots(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 6, weight=3)
    slots = take(s, 2)
    submit(s, "b", 2)
    tenants = keys.lane_tenants(LANE)
    # b served as much as a (weighted): only the slot counts speak. a at weight 3 holding
    # 2 slots (2/3 a weight) against b's 1 with one more: nothing owed.
    r.zadd(tenants, {"b": float(r.zscore(tenants, "a") or 0) - 1e-6})
    assert s.fair_victims(Q, running(r, slots), 1000) == ("none", None)
    # At weight 1 a holds twice what b would: b is owed one of a's.
    r.hset(keys.share("a"), "weight", 1)
    assert s.fair_victims(Q, running(r, slots), 1000) == ("ok", "a-1")


def test_a_tenant_far_behind_is_owed_a_slot_however_few_others_hold(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 5, est=1000)
    take(s, 1, worker="elsewhere")  # a holds 1 slot and was served 1,000 tokens
    submit(s, "b", 1)  # comes back one step below a (500), c one below b (250)
    submit(s, "c", 1)
    here = take(s, 2)  # b and c go first, each charged 100 (600 and 350)
    assert sorted(owner(j) for j in here) == ["b", "c"]
    # d comes back one step below the least served of the tenants with work, c, which is
    # running and waits for nothing (175, not a's 500): owed a slot though nobody holds two
    submit(s, "d", 1)
    assert float(r.hget(keys.share("d"), "served") or 0) == pytest.approx(175, rel=1e-3)
    assert s.fair_victims(Q, ["a-0"], 1000) == ("ok", "a-0")
    # Of several served far more than d, the most served makes room: a, then b (not c).
    r.delete(keys.lane_ceded(LANE))
    assert s.fair_victims(Q, [*running(r, here), "a-0"], 1000) == ("ok", "a-0")
    r.delete(keys.lane_ceded(LANE))
    assert s.fair_victims(Q, running(r, here), 1000) == ("ok", "b-0")


def test_the_lanes_only_tenant_running_here_is_alone(r: redis.Redis) -> None:
    """'alone': nothing here can make room until news comes, whatever the time (the
    preemptor stops looking every poll); 'none' where standings that move with time could
    still name a victim."""
    s = store(r)
    submit(s, "a", 4)
    slots = take(s, 2)  # a holds both slots; two more of a's wait, nobody else's
    assert s.fair_victims(Q, running(r, slots), 1000) == ("alone", None)
    take(s, 1, worker="elsewhere")  # a's jobs elsewhere change nothing here
    assert s.fair_victims(Q, running(r, slots), 1000) == ("alone", None)
    submit(s, "b", 1)  # the news of another tenant's job: room is made for it
    assert s.fair_victims(Q, running(r, slots), 1000) == ("ok", "a-1")


def test_a_running_tenant_other_than_the_next_is_never_alone(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "b", 1)
    slots = take(s, 1)
    submit(s, "a", 3)
    slots += take(s, 1)
    assert slots == ["b-0", "a-0"] and r.zrange(keys.lane_tenants(LANE), 0, -1) == ["a"]
    # b's job runs here, a alone waits: b's standing against a's moves with time
    assert s.fair_victims(Q, running(r, slots), 1000)[0] != "alone"


def test_fifo_never_preempts_between_tenants(r: redis.Redis) -> None:
    s = store(r, fair=False)
    submit(s, "a", 4)
    slots = take(s, 2)
    submit(s, "b", 1)
    assert s.fair_victims(Q, running(r, slots), 1000) == ("none", None)


def test_news_of_a_tenant_not_looked_for_lately_is_looked_at_at_once() -> None:
    """A flood of one tenant's creates is looked at once per NEWS_GAP_S; another tenant's
    create (fair share: it may be owed a slot) within MIN_GAP_S."""
    from tokenq.workers.preempt import FRESH_S, MIN_GAP_S, NEWS_GAP_S, news_wait

    now, last = 100.0, 100.0  # a look just happened, for the heavy tenant's news
    seen = {"heavy": now}
    assert news_wait({"heavy"}, seen, last, now) == pytest.approx(NEWS_GAP_S)  # its flood
    assert news_wait({""}, seen, last, now) == pytest.approx(NEWS_GAP_S)  # naming nobody
    assert news_wait({"light"}, seen, last, now) == pytest.approx(MIN_GAP_S)  # someone new
    assert news_wait({"heavy", "light"}, seen, last, now) == pytest.approx(MIN_GAP_S)
    later = now + 2 * FRESH_S
    # not looked for lately: fresh again (MIN_GAP_S after the last look: already past)
    assert news_wait({"heavy"}, seen, last, later) == pytest.approx(last + MIN_GAP_S - later)


def test_several_waiting_tenants_get_their_slots_freed_at_once(r: redis.Redis) -> None:
    """One slot on its way per tenant waiting (other than the victim's), not one at a
    time: a burst of light tenants is not served one look-and-take after another."""
    s = store(r)
    submit(s, "a", 6)
    slots = take(s, 4)  # a holds four slots, two more of a's wait
    submit(s, "b", 1)
    submit(s, "c", 1)
    assert s.fair_victims(Q, running(r, slots), 1000) == ("ok", "a-3")
    assert s.fair_victims(Q, running(r, slots[:3]), 1000) == ("ok", "a-2")  # for the other
    assert s.fair_victims(Q, running(r, slots[:2]), 1000) == ("claimed", None)  # no third


def test_a_direct_take_takes_the_ticket_at_the_queue_end_with_the_lanes_next_job(
        r: redis.Redis) -> None:
    """A preempted job's slot thread takes the job it was freed for (workers/tasks.py): the
    ticket at the consuming end goes with the take, so the queue still holds one message
    per queued job; a message naming a job there is left for Celery."""
    s = store(r)
    for tenant, n in (("a", 3), ("b", 1)):
        for i in range(n):
            job_id = f"{tenant}-{i}"
            s.create(job_id, {"id": job_id, "owner": tenant, "model": "m", "state": "queued",
                              "attempts": "0", "created_at": repr(time.time()), "spec": SPEC,
                              "request": "{}", "est_tokens": "100", "prompt_tokens": "5"},
                     tenant=tenant, queue=Q, message=ticket_message(CELERY, Q))
    r.rpop(Q)  # as Celery delivers a ticket
    assert take(s, 1) == ["a-0"]
    assert r.llen(Q) == 3
    got = s.pick(Q, "w", direct=True)
    assert isinstance(got, Picked) and got.job_id == "b-0"  # the least served, not a's next
    assert r.llen(Q) == 2 and r.zscore(keys.lane_tenants(LANE), "a") is not None
    # A message naming a job at the consuming end (a job preempted for a higher lane):
    # nothing is taken, that message stays for Celery.
    bound = task_message(CELERY, "a-1", Q)
    r.rpush(Q, bound)
    assert s.pick(Q, "w", direct=True) == NoJob("no_ticket")
    assert r.lindex(Q, -1) == bound and r.llen(Q) == 3
    assert r.hget(keys.job("a-1"), "state") == "queued"
    # A ticket of another lane is not this lane's.
    r.rpop(Q)
    r.rpush(Q, ticket_message(CELERY, keys.queue("m", "low")))
    assert s.pick(Q, "w", direct=True) == NoJob("no_ticket")
    r.rpop(Q)
    # Nor is one taken while a higher lane has work (Celery consumes that first).
    high = keys.queue("m", "high")
    r.lpush(high, ticket_message(CELERY, high))
    assert s.pick(Q, "w", direct=True, above=[high]) == NoJob("no_ticket")
    r.delete(high)
    got = s.pick(Q, "w", direct=True, above=[high])
    assert isinstance(got, Picked) and got.job_id == "a-1" and r.llen(Q) == 1
