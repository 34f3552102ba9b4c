"""Operations: /health (process alive), /ready (Redis + a live worker per model), /metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from tokenq.api import models_admin
from tokenq.api.deps import MetricsDep, StateDep
from tokenq.shared import keys
from tokenq.shared.metrics import ClusterMetrics

router = APIRouter(tags=["ops"])
log = logging.getLogger(__name__)


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def live_workers(state: StateDep) -> dict[str, list[str]]:
    """Model -> ids of workers whose heartbeat is fresh."""
    out: dict[str, list[str]] = {}
    for wid, hb in (await state.live_workers()).items():
        out.setdefault(hb.model, []).append(wid)
    return out


# A Redis that stopped answering (a stalled host, SIGSTOP) held /ready ~20 s (socket
# timeout and retries): a probe answers 503 within this instead.
READY_TIMEOUT_S = 2.0


@router.get("/ready")
async def ready(state: StateDep, workers: bool = True) -> JSONResponse:
    """`?workers=false`: Redis only. For a load balancer's readiness probe when workers
    scale to zero: the API must stay routable to take the jobs that bring workers back.
    Draining (after SIGTERM): 503 either way, so the probe takes the replica out of the
    rotation while its open streams finish (/health stays 200: it must not be restarted)."""
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await state.redis.ping()
            live = await live_workers(state) if workers else {}
    except (RedisError, TimeoutError) as exc:
        # Unauthenticated: Redis' own words (addresses, auth errors) go to the log only.
        log.warning("ready: Redis unavailable: %s", exc)
        return JSONResponse({"status": "unavailable", "redis": "unavailable"},
                            status_code=503)
    if not workers:
        return JSONResponse({"status": "ready"})
    missing = [m for m in state.models if not live.get(m) and models_admin.fixed(state, m)]
    # Ready once every served model has a live worker (but those deployed over the API,
    # which load on demand).
    body = {"status": "ready" if not missing else "not_ready",
            "workers": {m: len(live.get(m, [])) for m in state.models},
            "missing": missing}
    return JSONResponse(body, status_code=200 if not missing else 503)


async def _oldest_age(state: StateDep, queue: str, now: float) -> float:
    """Age of the job at the consuming end (the tail: LPUSH in, BRPOP out) of a queue."""
    raw = await state.redis.lindex(queue, -1)
    if not raw:
        return 0.0
    try:
        job_id = json.loads(base64.b64decode(json.loads(raw)["body"]))[0][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return 0.0
    if not job_id:  # a ticket (fair share): the oldest of the tenants' oldest waiting jobs
        return await _oldest_waiting(state, keys.lane(queue), now)
    created = await state.redis.hget(keys.job(job_id), "created_at")
    return max(0.0, now - float(created)) if created else 0.0


async def _oldest_waiting(state: StateDep, lane: str, now: float) -> float:
    tenants: list[str] = await state.redis.zrange(  # type: ignore[assignment]
        keys.lane_tenants(lane), 0, -1)
    pipe = state.redis.pipeline(transaction=False)
    for t in tenants:
        pipe.lindex(keys.lane_list(lane, t), 0)
    heads = [h for h in await pipe.execute() if h]
    for h in heads:
        pipe.hget(keys.job(h), "created_at")
    created = [float(c) for c in (await pipe.execute() if heads else []) if c]
    return max(0.0, now - min(created)) if created else 0.0


@router.get("/metrics/targets")
async def metrics_targets(state: StateDep, _who: MetricsDep) -> JSONResponse:
    """Prometheus HTTP service discovery: every live worker's metrics endpoint, so one
    scrape job finds workers however they were started (compose replicas, the autoscaler's
    children, `tokenq up`). Target labels are __meta_ only: the worker's own series already
    carry `model`, and a target label of the same name would rename theirs."""
    groups = []
    for wid, hb in (await state.live_workers()).items():
        if not hb.metrics_port:
            continue
        host = hb.metrics_host or wid.rsplit(":", 1)[0]
        groups.append({"targets": [f"{host}:{hb.metrics_port}"],
                       "labels": {"__meta_tokenq_worker": wid,
                                  "__meta_tokenq_model": hb.model,
                                  "__meta_tokenq_backend": hb.backend}})
    return JSONResponse(groups)


@router.get("/metrics")
async def metrics(state: StateDep, _who: MetricsDep) -> Response:
    """The cluster view from Redis (queues, workers) + this process's own metrics. Each
    worker's engine metrics are on its own port (`metrics_port` in its heartbeat).

    Every scrape fills gauges of its own (ClusterMetrics is made per scrape): scrapes that
    overlap (two Prometheus servers, an HA pair, a person with curl) cannot clear or
    half-fill each other's view while one awaits Redis."""
    m, now = ClusterMetrics(), time.time()
    try:
        beats = list((await state.live_workers()).values())
        for model in state.models:
            depth = 0
            for prio in keys.PRIORITIES:
                queue = keys.queue(model, prio)
                n = int(await state.redis.llen(queue))
                depth += n
                m.queue_depth.labels(model, prio).set(n)
                m.queue_oldest_age.labels(model, prio).set(await _oldest_age(state, queue, now))
            mine = [b for b in beats if b.model == model]
            m.running.labels(model).set(sum(b.running for b in mine))
            m.waiting.labels(model).set(depth + sum(b.waiting for b in mine))
            m.free_slots.labels(model).set(sum(b.slots - b.running for b in mine))
            m.kv_cache.labels(model).set(max((b.kv_cache_usage for b in mine), default=0.0))
            for backend in {b.backend for b in mine}:
                m.workers.labels(model, backend).set(
                    sum(1 for b in mine if b.backend == backend))
    except RedisError:
        pass  # the process metrics still answer; /ready reports Redis
    body = generate_latest(m.registry) + generate_latest()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
