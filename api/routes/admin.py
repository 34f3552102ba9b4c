"""Admin routes: need a key with the `admin` role (403 for other keys, 401 without one)."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter

from api.deps import AdminDep, StateDep
from shared import keys

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get("/workers")
async def workers(state: StateDep, _admin: AdminDep) -> dict[str, Any]:
    """Every worker's last heartbeat, with whether it is still live."""
    raw: dict[str, str] = await state.redis.hgetall(keys.WORKERS)  # type: ignore[assignment]
    cutoff = time.time() - state.settings.worker_ttl_s
    data = []
    for wid, info in sorted(raw.items()):
        hb = json.loads(info)
        data.append({"id": wid, "live": hb.get("ts", 0) >= cutoff, **hb})
    return {"object": "list", "data": data}
