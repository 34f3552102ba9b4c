"""The LoRA adapter registry: one JSON record per adapter name in the hash tokenq:adapters.

Every API replica and worker reads the same hash, so there is no registry process to
keep in sync. A record holds every version ever loaded under the name (each with an id
from tokenq:adapters:seq, unique across names: vLLM's lora_int_id, and the engines'
cache key), which one is current, whether the name is loaded, and a stack of earlier
(current, status) states: rollback pops it, so it undoes the last load *or* unload in
one write. The API resolves a name to its current version when a job is submitted and
stores it in the job's spec: a job in flight finishes on the version it started with,
whatever happens to the name meanwhile.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

AdapterStatus = Literal["loaded", "unloaded"]
# Adapter names share the `model` field with base models (vLLM's convention).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"


class AdapterRef(BaseModel):
    """What a job and an engine need: the version to apply (stored in the job spec)."""

    name: str
    id: int
    path: str


class AdapterVersion(BaseModel):
    id: int
    path: str
    created_at: float
    rank: int | None = None  # reported by the first worker that loaded it


class AdapterRecord(BaseModel):
    name: str
    base: str  # the base model: jobs naming this adapter go to its queue
    engine: str  # the base model's backend (llama | vllm | fake)
    status: AdapterStatus
    current: int | None  # id of the version served while loaded
    versions: list[AdapterVersion] = Field(default_factory=list)
    history: list[tuple[int | None, AdapterStatus]] = Field(default_factory=list)
    updated_at: float = 0.0
    # Who may run jobs on it: the owner tenant, or every tenant when shared. To any other
    # tenant it is absent (404), as another tenant's job is.
    owner: str = ""
    shared: bool = False

    def usable_by(self, tenant: str) -> bool:
        return self.shared or self.owner == tenant

    def version(self, vid: int | None) -> AdapterVersion | None:
        return next((v for v in self.versions if v.id == vid), None)

    def ref(self) -> AdapterRef | None:
        """The version new jobs get, or None while unloaded."""
        v = self.version(self.current)
        if self.status != "loaded" or v is None:
            return None
        return AdapterRef(name=self.name, id=v.id, path=v.path)

    def _push(self) -> None:
        self.history.append((self.current, self.status))
        self.updated_at = time.time()

    def load(self, vid: int, path: str) -> None:
        self._push()
        self.versions.append(AdapterVersion(id=vid, path=path, created_at=time.time()))
        self.current, self.status = vid, "loaded"

    def unload(self) -> None:
        self._push()
        self.status = "unloaded"

    def rollback(self) -> bool:
        """Back to the state before the last load or unload; False if there is none.
        A record whose first load is undone is left unloaded with no current version."""
        if not self.history:
            return False
        self.current, self.status = self.history.pop()
        if self.current is None:
            self.status = "unloaded"
        self.updated_at = time.time()
        return True

    def public(self) -> dict[str, object]:
        """GET /v1/adapters: the record as operators read it."""
        cur = self.version(self.current)
        return {"id": self.name, "object": "adapter", "model": self.base,
                "engine": self.engine, "status": self.status,
                "path": cur.path if cur else None, "version": self.current,
                "rank": cur.rank if cur else None, "updated_at": self.updated_at,
                "versions": [v.model_dump() for v in self.versions],
                "can_rollback": bool(self.history), "owner": self.owner,
                "shared": self.shared}


class AdapterAck(BaseModel):
    """A worker's answer for one name (tokenq:adapter:{name}:acks, field = worker id)."""

    id: int  # the version it now serves new jobs with; 0 = none (unloaded)
    ok: bool = True
    error: str | None = None
    seconds: float = 0.0  # how long the engine took to load or release it
    rank: int | None = None
    ts: float = 0.0
