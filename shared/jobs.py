"""The job state machine, lease and fencing, as Redis scripts both sides run.

Every transition is one Lua script, so it is atomic in Redis:

    create   (api)     record + Celery message + `queued` event, or refuse if the queue is full
    acquire  (worker)  queued|running-without-lease -> running, attempts += 1, lease set,
                       `started` event; or drop (terminal, live lease), expire or exhaust
    append   (worker)  token events, only while `attempts` still equals the writer's attempt
    finish   (worker)  running -> succeeded|failed|cancelled with its terminal event, once
    cancel   (api)     queued -> cancelled at once; running -> cancel_requested=1
    renew    (worker)  extend the lease only while it is still ours (retake it if it
                       expired and no newer attempt took the job)
    requeue  (worker)  a running job whose lease expired goes back on its queue (takeover)
    handback (worker)  a draining worker puts its running job back (same takeover path)

The attempt check on every worker write is the fence: a worker that lost its
lease (paused, partitioned) and comes back cannot write into a stream that a
newer attempt now owns.
"""

from __future__ import annotations

import json
from typing import Any

from shared import keys

# Run on every terminal transition (finish, cancel of a queued job, expiry, exhaustion):
# count a batch line as done, settle its batch when it was the last one, and put
# completion webhooks in the outbox that workers deliver (shared/webhooks.py).
# Returns the TTL the job's keys get: batch lines live as long as their batch's files.
_ON_TERMINAL = """
local function webhook(kind, obj_id, url, now)
  local eid = 'evt_' .. redis.call('INCR', '@SEQ@')
  redis.call('HSET', '@HOOK@' .. eid, 'url', url, 'type', kind, 'object_id', obj_id,
             'created_at', now, 'attempts', 0)
  redis.call('ZADD', '@HOOKS@', now, eid)
end
local function batch_settle(bk, now)
  local b = redis.call('HMGET', bk, 'status', 'enqueued', 'enqueue_done', 'completed', 'failed',
                       'expired', 'webhook_url', 'id')
  if b[3] ~= '1' or (b[1] ~= 'in_progress' and b[1] ~= 'cancelling') then return b[1] end
  if (tonumber(b[4]) or 0) + (tonumber(b[5]) or 0) < (tonumber(b[2]) or 0) then return b[1] end
  local final = 'completed'
  if b[1] == 'cancelling' then final = 'cancelled'
  elseif (tonumber(b[6]) or 0) > 0 then final = 'expired' end
  redis.call('HSET', bk, 'status', final, final .. '_at', now, 'finalizing_at', now)
  redis.call('SREM', '@PENDING@', b[8])
  if b[7] then webhook('batch.' .. final, b[8], b[7], now) end
  return final
end
local function on_terminal(jobkey, state, now, ttl)
  local h = redis.call('HMGET', jobkey, 'batch', 'id', 'webhook_url', 'ttl')
  if h[3] then webhook('job.' .. state, h[2], h[3], now) end
  if not h[1] then return ttl end
  local bk = '@BATCH@' .. h[1]
  if state == 'succeeded' then
    redis.call('RPUSH', bk .. ':out', h[2])
    redis.call('HINCRBY', bk, 'completed', 1)
  else
    redis.call('RPUSH', bk .. ':err', h[2])
    redis.call('HINCRBY', bk, 'failed', 1)
    if state == 'expired' then redis.call('HINCRBY', bk, 'expired', 1) end
  end
  batch_settle(bk, now)
  return h[4] or ttl
end
""".replace("@SEQ@", keys.WEBHOOK_SEQ).replace("@HOOK@", keys.WEBHOOK_PREFIX) \
   .replace("@HOOKS@", keys.WEBHOOKS).replace("@PENDING@", keys.BATCHES_PENDING) \
   .replace("@BATCH@", keys.BATCH_PREFIX)

_TERMINAL = ("state == 'succeeded' or state == 'failed' or state == 'cancelled'"
             " or state == 'expired'")

# KEYS: job, events, queue, tenant's job index, tenant's queued set, queued index,
#       [Idempotency-Key record]
# ARGV: fields, Celery message, queue limit, stream maxlen, now, tenant queued limit,
#       [body sha256, idempotency TTL s]
# With an Idempotency-Key: a key whose job still exists answers {3, its id} (same body)
# or {4, its id} (another body) and creates nothing; otherwise the key is set to
# "{id}|{sha}" in the same step as the job, so a retry can never make a second job.
CREATE = """
if KEYS[7] then
  local prev = redis.call('GET', KEYS[7])
  if prev then
    local bar = string.find(prev, '|', 1, true)
    local jid = string.sub(prev, 1, bar - 1)
    if redis.call('EXISTS', '@JOB@' .. jid) == 1 then
      if string.sub(prev, bar + 1) == ARGV[7] then return {3, jid} end
      return {4, jid}
    end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {2, 0} end  -- idempotent (batch lines)
local depth = redis.call('LLEN', KEYS[3])
if tonumber(ARGV[3]) > 0 and depth >= tonumber(ARGV[3]) then return {-1, depth} end
local mine = redis.call('ZCARD', KEYS[5])
if tonumber(ARGV[6]) > 0 and mine >= tonumber(ARGV[6]) then return {-2, mine} end
local fields = cjson.decode(ARGV[1])
for k, v in pairs(fields) do redis.call('HSET', KEYS[1], k, v) end
-- the record names its tenant's queued set, so scripts that only know the job can leave it
redis.call('HSET', KEYS[1], 'tenant_queued', KEYS[5], 'msg', ARGV[2])
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'e', 'queued',
           'd', cjson.encode({position = depth}))
redis.call('ZADD', KEYS[4], ARGV[5], fields['id'])
redis.call('ZADD', KEYS[5], ARGV[5], fields['id'])
redis.call('ZADD', KEYS[6], ARGV[5], KEYS[1])
if fields['batch'] then redis.call('HINCRBY', '@BATCH@' .. fields['batch'], 'enqueued', 1) end
if KEYS[7] then
  redis.call('SET', KEYS[7], fields['id'] .. '|' .. ARGV[7], 'EX', ARGV[8])
end
return {1, depth}
""".replace("@BATCH@", keys.BATCH_PREFIX).replace("@JOB@", keys.JOB_PREFIX)

# Lua: the job no longer counts as queued, for its tenant or the rescue (idempotent).
_LEAVE_QUEUE = f"""
local function leave_queue()
  local tq = redis.call('HGET', KEYS[1], 'tenant_queued')
  if tq then redis.call('ZREM', tq, redis.call('HGET', KEYS[1], 'id')) end
  redis.call('ZREM', '{keys.QUEUED}', KEYS[1])
end
"""

ACQUIRE = _ON_TERMINAL + _LEAVE_QUEUE + f"""
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {{'missing'}} end
-- A redelivered copy (visibility timeout, broker reconnect) drops itself; counted so
-- operators and the fault suite can see duplicates were delivered and not run.
if {_TERMINAL} then
  leave_queue()
  redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  return {{'terminal'}}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  return {{'busy'}}
end
leave_queue()
local now = ARGV[4]
local function terminate(st, code, msg)
  redis.call('HSET', KEYS[1], 'state', st, 'finished_at', now,
             'error', cjson.encode({{code = code, message = msg}}))
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'e', 'error',
             'd', cjson.encode({{code = code, message = msg}}))
  local ttl = on_terminal(KEYS[1], st, now, ARGV[6])
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('ZREM', KEYS[4], KEYS[1])
end
local deadline = redis.call('HGET', KEYS[1], 'deadline')
if deadline and deadline ~= '' and tonumber(now) > tonumber(deadline) then
  terminate('expired', 'expired', 'the job passed its deadline before it could run')
  return {{'expired'}}
end
local attempts = tonumber(redis.call('HGET', KEYS[1], 'attempts') or '0')
if attempts >= tonumber(ARGV[3]) then
  terminate('failed', 'max_attempts',
            'the job was attempted ' .. attempts .. ' times and its worker died each time')
  return {{'exhausted'}}
end
attempts = attempts + 1
redis.call('HSET', KEYS[1], 'state', 'running', 'attempts', attempts, 'worker', ARGV[1])
redis.call('HDEL', KEYS[1], 'msg')  -- delivered: a rescue needs a lost lease from now on
if not redis.call('HGET', KEYS[1], 'started_at') then
  redis.call('HSET', KEYS[1], 'started_at', now)
end
redis.call('SET', KEYS[3], ARGV[1] .. '|' .. attempts, 'PX', ARGV[2])
redis.call('ZADD', KEYS[4], now, KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'e', 'started',
           'd', cjson.encode({{attempt = attempts, worker = ARGV[1]}}))
return {{'ok', attempts, redis.call('HGET', KEYS[1], 'spec'),
        redis.call('HGET', KEYS[1], 'cancel_requested') or '0'}}
"""

# ARGV: attempt, maxlen, then (data, token id, index) per token. A token is written only
# if its index is the next one (`n_tokens`), so a step replayed after a failed or cut
# pipeline (Redis restarted mid-write) adds nothing twice and never leaves a gap.
APPEND = """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
local n = tonumber(redis.call('HGET', KEYS[1], 'n_tokens') or '0')
for i = 3, #ARGV, 3 do
  if tonumber(ARGV[i + 2]) == n then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
               'e', 'token', 'd', ARGV[i], 't', ARGV[i + 1])
    n = n + 1
  end
end
redis.call('HSET', KEYS[1], 'n_tokens', n)
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return 2 end
return 1
"""

FINISH = _ON_TERMINAL + """
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
local fields = cjson.decode(ARGV[3])
redis.call('HSET', KEYS[1], 'state', ARGV[2])
for k, v in pairs(fields) do redis.call('HSET', KEYS[1], k, v) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[4], 'd', ARGV[5])
redis.call('DEL', KEYS[3])
redis.call('ZREM', KEYS[4], KEYS[1])
local ttl = on_terminal(KEYS[1], ARGV[2], fields['finished_at'] or '0', ARGV[7])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return 1
"""

CANCEL = _ON_TERMINAL + _LEAVE_QUEUE + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
if state == 'queued' then
  leave_queue()
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished_at', ARGV[1], 'cancel_requested', '1')
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'e', 'cancelled', 'd', '{}')
  local ttl = on_terminal(KEYS[1], 'cancelled', ARGV[1], ARGV[3])
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
  return 'cancelled'
end
if state == 'running' then redis.call('HSET', KEYS[1], 'cancel_requested', '1') end
return state
"""

# KEYS: job, lease, running index, queue, kombu's unacked hash, queued index;
# ARGV: a fresh Celery message. Re-enqueue a job that no message will ever deliver:
# - running without a lease (its worker died): the next worker's ACQUIRE takes it over;
# - queued, or requeued, while its last message is neither in the queue nor in kombu's
#   unacked hash. kombu pops a message (BRPOP) before it records it as unacked, so a
#   worker killed in between loses it; without this the job would wait forever.
# A copy pushed while the old message was in flight only meets ACQUIRE's busy/terminal
# check, so a rescue is at worst a duplicate that drops itself, never a second run.
REQUEUE = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' and state ~= 'queued' then
  redis.call('ZREM', KEYS[3], KEYS[1])
  redis.call('ZREM', KEYS[6], KEYS[1])
  return 0
end
if state == 'running' and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local old = redis.call('HGET', KEYS[1], 'msg')
if old then
  local tag = cjson.decode(old)['properties']['delivery_tag']
  if redis.call('HEXISTS', KEYS[5], tag) == 1 then return 0 end  -- delivered, not acked
  if redis.call('LPOS', KEYS[4], old, 'RANK', -1) then return 0 end  -- still queued
end
redis.call('HSET', KEYS[1], 'msg', ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[1])  -- the consuming end: a takeover does not wait its turn
return 1
"""

# KEYS: job, lease, running index, queue; ARGV: our lease value, Celery message.
# A draining worker gives a running job back: only while the lease is still ours. The job
# stays in the running index, so a lost hand-back message is rescued like a takeover.
HANDBACK = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'msg', ARGV[2])
redis.call('RPUSH', KEYS[4], ARGV[2])  -- the consuming end (kombu BRPOPs the tail)
return 1
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease, job; ARGV: our lease value, ttl ms, our attempt. A job lease is renewed
# while it is ours, and taken back if it expired while this worker was stalled (a GC
# pause, a frozen VM: seen here for 8 s under load) as long as no newer attempt took the
# job and it has not ended. Once a takeover's ACQUIRE bumped `attempts`, it is lost for
# good and the worker aborts its attempt; a requeued message that meets the taken-back
# lease drops itself (ACQUIRE: busy). A handed-back job is never renewed (the worker
# stops renewing it before HANDBACK deletes the lease).
RENEW_JOB = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then return 0 end
if redis.call('HGET', KEYS[2], 'state') == 'running'
   and redis.call('HGET', KEYS[2], 'attempts') == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


def dumps(obj: Any) -> str:
    """Compact JSON, the only encoding on the wire and in Redis."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def lease_value(worker: str, attempt: int) -> str:
    return f"{worker}|{attempt}"


# KEYS: batch; ARGV: now. The driver settles a batch whose lines all ended before it
# finished enqueuing (or that had none left to enqueue after a cancel).
SETTLE = _ON_TERMINAL + """
return batch_settle(KEYS[1], ARGV[1])
"""
