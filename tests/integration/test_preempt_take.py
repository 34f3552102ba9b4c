"""A job preempted for a tenant of its lane: its slot thread takes the job it was freed for
itself (workers/tasks.run_job, `worker.preempt_take`). The worker's runtime runs in-process,
on the fake engine and on llama.cpp (SmolLM2, 2 slots), with the tests' Redis db; no Celery
consumer runs, so a waiting job can start only by that take."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import SMOL
from tests.faults.sentinel_deploy import wait_for
from tokenq.shared import keys
from tokenq.shared.celery_app import ticket_message
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.workers.main import build_engine
from tokenq.workers.runtime import WorkerRuntime
from tokenq.workers.tasks import run_ticket

FAKE = "fk"
# SmolLM2's special tokens: a heavy job never ends by itself (a slot freed without a
# preemption would leave the light job waiting for a Celery consumer this test lacks)
NO_END = {0: -100.0, 1: -100.0, 2: -100.0}


def create(rt: WorkerRuntime, job_id: str, tenant: str, max_tokens: int) -> None:
    spec = JobSpec(prompt="Count from one to one thousand:", params=SamplingParams(
        max_tokens=max_tokens, temperature=0, top_p=1, top_k=0, repetition_penalty=1,
        logit_bias=NO_END if rt.model == SMOL else {}))
    model, queue = rt.model, keys.queue(rt.model, "normal")
    rt.store.create(job_id, {"id": job_id, "owner": tenant, "model": model, "state": "queued",
                             "attempts": "0", "created_at": repr(time.time()),
                             "spec": spec.model_dump_json(), "request": "{}",
                             "est_tokens": str(max_tokens + 1), "prompt_tokens": "1"},
                    tenant=tenant, queue=queue, message=ticket_message(rt.celery, queue))


def runtime(redis_server: EmbeddedRedis, tmp_path: Path, state_dir: Path,
            model: str) -> WorkerRuntime:
    """A worker of 2 slots for `model`: the fake engine (20 tok/s a job) or SmolLM2."""
    models = None
    if model == FAKE:
        models = tmp_path / "models.json"
        models.write_text(json.dumps({FAKE: {"backend": "fake", "n_parallel": 2,
                                             "fake_tokens_per_s": 20.0, "n_ctx": 4096}}))
    settings = Settings(redis_url=redis_server.url.rsplit("/", 1)[0] + "/15",
                        state_dir=state_dir if model == SMOL else tmp_path,
                        models_file=models, served_models=[model], fair_share=True,
                        worker=WorkerSettings(metrics_port=None))
    cfg = settings.models()[model].model_copy(update={"n_parallel": 2})
    return WorkerRuntime(settings=settings, model=model, cfg=cfg,
                         engine=build_engine(settings, model, cfg),
                         r=redis.Redis.from_url(settings.redis_url or "", decode_responses=True))


@pytest.mark.parametrize("model", [FAKE, SMOL])
def test_the_preempted_jobs_thread_runs_the_waiting_tenants_job(
        redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path, state_dir: Path,
        model: str) -> None:
    rt = runtime(redis_server, tmp_path, state_dir, model)
    q = keys.queue(model, "normal")
    rt.start()
    results: dict[str, str] = {}
    threads = []
    try:
        for i in range(3):
            create(rt, f"heavy-{i}", "heavy", 400)  # 20 s each (fake), ~10 s (SmolLM2)
        for slot in ("t0", "t1"):  # Celery delivers two tickets, one per slot thread
            assert r.rpop(q)

            def run(slot: str = slot) -> None:
                results[slot] = run_ticket(rt, q)

            threads.append(threading.Thread(target=run, daemon=True))
            threads[-1].start()
        wait_for("both slots streaming",
                 lambda: len([h for h in rt.publisher.tracked() if h.first_token_at]) == 2)
        create(rt, "light-0", "light", 4)  # every slot is the heavy tenant's
        wait_for("the light job done",
                 lambda: r.hget(keys.job("light-0"), "state") == "succeeded", 60)
        rec = r.hgetall(keys.job("light-0"))
        assert rec["worker"] == rt.worker_id
        victims = [j for j in ("heavy-0", "heavy-1")
                   if r.hget(keys.job(j), "preemptions") == "1"]
        assert len(victims) == 1 and r.hget(keys.job(victims[0]), "state") == "queued"
        # One message per queued job still: the take took the ticket it used.
        queued = [j for j in ("heavy-0", "heavy-1", "heavy-2")
                  if r.hget(keys.job(j), "state") == "queued"]
        assert r.llen(q) == len(queued) == 2
        wait_for("the victim's thread done",  # it ran the light job
                 lambda: "succeeded" in results.values())
    finally:
        for i in range(3):
            rt.store.cancel(f"heavy-{i}")
        for t in threads:
            t.join(timeout=10)
        rt.close()
