"""Admin routes: need a key with the `admin` role (403 for other keys, 401 without one)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tokenq.api.deps import AdminDep, StateDep
from tokenq.shared import keys
from tokenq.shared.schemas import WorkerHeartbeat, live_workers

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get("/workers")
async def workers(state: StateDep, _admin: AdminDep) -> dict[str, Any]:
    """Every worker's last heartbeat, with whether it is still live."""
    raw: dict[str, str] = await state.redis.hgetall(keys.WORKERS)  # type: ignore[assignment]
    live = live_workers(raw, state.settings.worker_ttl_s)
    data = [{"id": wid, "live": wid in live,
             **WorkerHeartbeat.model_validate_json(info).model_dump()}
            for wid, info in sorted(raw.items())]
    return {"object": "list", "data": data}
