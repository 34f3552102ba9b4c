"""Every Redis key tokenq uses, in one screen.

    tokenq:job:{id}              hash    the job record (see shared/schemas.JobRecord)
    tokenq:job:{id}:events       stream  SSE events; entry id == SSE id
                                 (and a pub/sub channel of that name: a message per
                                 write, the token writes' carrying their entries,
                                 read by api/stream_notify.py)
    tokenq:job:{id}:lease        string  "{worker}|{attempt}", PX = lease TTL
    tokenq:tenant:{t}:jobs       zset    job ids by creation time (listing, quotas)
    tokenq:tenant:{t}:queued     zset    the tenant's jobs still queued (per-tenant limit)
    tokenq:tenant:{t}:batch_queued  zset  its batch lines still queued (not limited)
    tokenq:tenant:{t}:idem:{kind}:{sha}  string  "{object id}|{body sha256}" for a request's
                                 Idempotency-Key (kind: job | batch), EX idempotency_ttl_s
    tokenq:ratelimit:{t}:{kind}  hash    token bucket (level, ts) for requests/s and tokens/min
    tokenq:workers               hash    worker id -> JSON heartbeat (model, backend, slots, ts)
    tokenq:running               zset    job keys with a running attempt (for takeover)
    tokenq:queued                zset    job keys still queued, by creation (lost-message rescue)
    unacked                      hash    kombu's delivered-not-acked messages, by delivery tag
    tokenq:api:{uuid}:wake       stream  wakes the API's shared XREAD BLOCK reader
                                 (tokenq.api.stream_notify off)
    tokenq.{model}.{priority}    list    Celery queue (kombu's Redis transport): tickets, and
                                 messages that name a job (takeover, preempted, handed back)
    tokenq:lane:{model}:{priority}:tenants  zset  the lane's tenants with jobs waiting -> score
                                 (fair share, shared/lua/fair.lua)
    tokenq:lane:{model}:{priority}:t:{t}    list  that tenant's waiting job ids, oldest first
    tokenq:lane:{model}:{priority}:empty    string  tickets that found no job (a count)
    tokenq:lane:{model}:{priority}:ceded    string  slots freed for the lane's next tenant
                                 and not yet taken (shared/lua/fair_victims.lua)
    tokenq:lane:{model}:{priority}:held     hash    tenant -> its jobs running (leasing.lua,
                                 terminal.lua, preempt.lua)
    tokenq:share:{t}             hash    served (decayed tokens), at, weight (fair share)
    tokenq:pool:load             hash    `{model}@{pool}` -> its jobs placed and not ended
                                 (placement: shared/lua/place.lua, terminal.lua)

LoRA adapters (shared/lora_registry.py):

    tokenq:adapters              hash    adapter name -> JSON record (base, versions, current,
                                         status, history); every replica and worker reads it
    tokenq:adapters:seq          string  INCR: a version id unique across names (vLLM lora_int_id)
    tokenq:adapters:events       stream  one entry per registry change: wakes the workers' watchers
    tokenq:adapter:{name}:acks   hash    worker id -> JSON {id, ok, error, seconds, ts}: what
                                         that worker serves for the name (id 0 = nothing)

OpenAI files and batches, completion webhooks:

    tokenq:file:{id}             hash    file object (owner, purpose, filename, bytes, kind)
    tokenq:file:{id}:data        string  uploaded content (when files live in Redis)
    tokenq:tenant:{t}:files      zset    file ids by creation time
    tokenq:tenant:{t}:upload_bytes  zset  its uploads (copying or stored) -> bytes reserved
                                 (the byte quota, checked atomically by file_reserve.lua)
    tokenq:uploads               zset    "{file id}:{tenant}" -> deadline (Unix s): while
                                 copied, the upload's lease; once stored, its expiry; once
                                 dropped, 0 (its copy on disk still to delete). The sweeper
                                 deletes whatever is past its deadline
    tokenq:uploads:sweeper       string  lease of the API replica sweeping expired uploads
    tokenq:batch:{id}            hash    batch object, counters, enqueue cursor
    tokenq:batch:{id}:out|:err   list    job ids of lines that succeeded | did not, in end order
    tokenq:batch:{id}:ids        set     custom_ids seen while validating (duplicate check)
    tokenq:batch:{id}:driver     string  lease of the API replica validating/enqueuing it
    tokenq:batches:pending       set     batches a driver must work on (validate/enqueue/cancel)
    tokenq:tenant:{t}:batches    zset    batch ids by creation time
    tokenq:webhooks              zset    event id -> time of its next delivery attempt
    tokenq:webhook:{eid}         hash    url, type, object id, attempts
    tokenq:webhooks:bell         list    rung (one entry at most) when an event is put in the
                                         outbox: an idle sender waits on it (BLPOP)
    tokenq:webhooks:bell:{w}     list    worker w's own bell (its sender's stop)

The job scripts (shared/lua/) build batch and webhook keys from the prefixes
below inside Lua, because which batch a job belongs to is only known there
(shared/lua_scripts.py fills them in).
"""

from __future__ import annotations

PREFIX = "tokenq"
PRIORITIES = ("high", "normal", "low")


def job(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def job_events(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:events"


def job_lease(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:lease"


def job_id_of(job_key: str) -> str:
    """tokenq:job:{id} -> id."""
    return job_key.rsplit(":", 1)[-1]


def tenant_jobs(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:jobs"


def tenant_queued(tenant: str, batch: bool = False) -> str:
    return f"{PREFIX}:tenant:{tenant}:{'batch_queued' if batch else 'queued'}"


def idempotency(tenant: str, kind: str, key_sha: str) -> str:
    """Where an Idempotency-Key's first request is remembered (the key itself hashed)."""
    return f"{PREFIX}:tenant:{tenant}:idem:{kind}:{key_sha}"


JOB_PREFIX = f"{PREFIX}:job:"


def rate_bucket(tenant: str, kind: str) -> str:
    return f"{PREFIX}:ratelimit:{tenant}:{kind}"


WORKERS = f"{PREFIX}:workers"
RUNNING = f"{PREFIX}:running"
QUEUED = f"{PREFIX}:queued"
POOL_LOAD = f"{PREFIX}:pool:load"
KOMBU_UNACKED = "unacked"  # kombu's Redis transport default (unacked_key)
# A pub/sub channel nobody subscribes to: a PUBLISH there is a write that replicates, so
# a WAIT after it covers everything the primary wrote before (api/durable.py).
DURABLE_BARRIER = f"{PREFIX}:durable"


def api_wake(instance: str) -> str:
    return f"{PREFIX}:api:{instance}:wake"


def queue(model: str, priority: str) -> str:
    """Celery queue name (also the Redis list key) for a model at a priority."""
    return f"{PREFIX}.{model}.{priority}"


def model_queues(model: str) -> list[str]:
    """A worker's queues, highest priority first (consumed in this order)."""
    return [queue(model, p) for p in PRIORITIES]


SHARE_PREFIX = f"{PREFIX}:share:"


def lane(queue_name: str) -> str:
    """The fair-share keys' prefix of a Celery queue's lane (`{lane}:tenants`,
    `{lane}:t:{tenant}`, built in Lua too): tokenq.{model}.{priority} ->
    tokenq:lane:{model}:{priority}; any other queue name (tests) -> tokenq:lane:{name}."""
    model, _, priority = queue_name.removeprefix(f"{PREFIX}.").rpartition(".")
    if queue_name.startswith(f"{PREFIX}.") and model and priority in PRIORITIES:
        return f"{PREFIX}:lane:{model}:{priority}"
    return f"{PREFIX}:lane:{queue_name}"


def lane_tenants(lane_prefix: str) -> str:
    return f"{lane_prefix}:tenants"


def lane_ceded(lane_prefix: str) -> str:
    return f"{lane_prefix}:ceded"


def lane_held(lane_prefix: str) -> str:
    return f"{lane_prefix}:held"


def lane_list(lane_prefix: str, tenant: str) -> str:
    return f"{lane_prefix}:t:{tenant}"


def share(tenant: str) -> str:
    return SHARE_PREFIX + tenant


FILE_PREFIX = f"{PREFIX}:file:"
UPLOADS = f"{PREFIX}:uploads"
UPLOADS_SWEEPER = f"{PREFIX}:uploads:sweeper"


def file(file_id: str) -> str:
    return FILE_PREFIX + file_id


def file_data(file_id: str) -> str:
    return f"{PREFIX}:file:{file_id}:data"


def tenant_files(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:files"


def tenant_upload_bytes(tenant: str) -> str:
    """Sorted set: the tenant's uploads, scored by their size (its file quota)."""
    return f"{PREFIX}:tenant:{tenant}:upload_bytes"


def upload_member(file_id: str, tenant: str) -> str:
    """An upload's member in UPLOADS (file ids hold no ':'; file_reserve.lua builds the
    same)."""
    return f"{file_id}:{tenant}"


def upload_of(member: str) -> tuple[str, str]:
    """UPLOADS member -> (file id, tenant)."""
    file_id, _, tenant = member.partition(":")
    return file_id, tenant


BATCH_PREFIX = f"{PREFIX}:batch:"
BATCHES_PENDING = f"{PREFIX}:batches:pending"


def batch(batch_id: str) -> str:
    return BATCH_PREFIX + batch_id


def batch_out(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}:out"


def batch_err(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}:err"


def batch_ids(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}:ids"


def batch_driver(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}:driver"


def tenant_batches(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:batches"


WEBHOOKS = f"{PREFIX}:webhooks"
WEBHOOK_PREFIX = f"{PREFIX}:webhook:"
WEBHOOK_SEQ = f"{PREFIX}:webhooks:seq"
WEBHOOK_BELL = f"{PREFIX}:webhooks:bell"


def webhook_bell(worker_id: str) -> str:
    """One worker's own bell: its sender's stop wakes only that sender."""
    return f"{WEBHOOK_BELL}:{worker_id}"


def webhook(event_id: str) -> str:
    return WEBHOOK_PREFIX + event_id


ADAPTERS = f"{PREFIX}:adapters"
ADAPTER_SEQ = f"{PREFIX}:adapters:seq"
ADAPTER_EVENTS = f"{PREFIX}:adapters:events"


def adapter_acks(name: str) -> str:
    return f"{PREFIX}:adapter:{name}:acks"
