"""Operations: /health (process alive), /ready (Redis + a live worker per model), /metrics."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError

from api.deps import StateDep
from shared import keys

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


async def live_workers(state: StateDep) -> dict[str, list[str]]:
    """Model -> ids of workers whose heartbeat is fresh."""
    raw: dict[str, str] = await state.redis.hgetall(keys.WORKERS)  # type: ignore[assignment]
    cutoff = time.time() - state.settings.worker_ttl_s
    out: dict[str, list[str]] = {}
    for wid, info in raw.items():
        hb = json.loads(info)
        if hb.get("ts", 0) >= cutoff:
            out.setdefault(hb["model"], []).append(wid)
    return out


@router.get("/ready")
async def ready(state: StateDep) -> JSONResponse:
    try:
        await state.redis.ping()
        workers = await live_workers(state)
    except RedisError as exc:
        return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
    missing = [m for m in state.models if not workers.get(m)]
    # Ready once every served model has a live worker.
    body = {"status": "ready" if not missing else "not_ready",
            "workers": {m: len(workers.get(m, [])) for m in state.models},
            "missing": missing}
    return JSONResponse(body, status_code=200 if not missing else 503)


@router.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
