-- The library every script that ends a job includes (shared/lua_scripts.py): the one
-- terminal transition, the bookkeeping it triggers (a batch line counted, its batch
-- settled, completion webhooks put in the outbox workers deliver), and leaving the
-- queued indexes. Key prefixes (written between at signs) come from shared/keys.py.

-- Put a webhook event in the outbox (delivered by workers/webhooks.py) and ring the bell
-- an idle sender waits on (one ring at most: a sender that wakes claims every due event).
-- `tenant` picks the signing secret (each tenant has its own).
local function webhook(kind, obj_id, url, tenant, now)
  local eid = 'evt_' .. redis.call('INCR', '@WEBHOOK_SEQ@')
  redis.call('HSET', '@WEBHOOK_PREFIX@' .. eid, 'url', url, 'type', kind, 'object_id', obj_id,
             'tenant', tenant or '', 'created_at', now, 'attempts', 0)
  redis.call('ZADD', '@WEBHOOKS@', now, eid)
  redis.call('LPUSH', '@WEBHOOK_BELL@', eid)
  redis.call('LTRIM', '@WEBHOOK_BELL@', 0, 0)
end

-- A settled batch's output and error files become file objects, once (`files_at` marks
-- it): created at settle time and indexed in its tenant's files (`files_key`, named in the
-- batch hash) for `ttl` seconds. A file deleted afterwards is never made again. Their
-- `bytes` is measured on first read (api/openai/batch_files.py). A batch without
-- `files_key` (written by an older API) is registered on read, with the key passed in.
local function register_files(bk, now, files_key, ttl)
  local b = redis.call('HMGET', bk, 'id', 'owner', 'output_file_id', 'error_file_id',
                       'completed', 'failed', 'files_at')
  if b[7] or not files_key then return 0 end
  redis.call('HSET', bk, 'files_at', now)
  local expires = math.floor(tonumber(now) + tonumber(ttl))
  local outputs = {{b[3], b[5], 'batch_completed', 'output'},
                   {b[4], b[6], 'batch_failed', 'error'}}
  for _, o in ipairs(outputs) do
    local fk = '@FILE_PREFIX@' .. (o[1] or '')
    -- (one an older API registered on read is kept as it is)
    if o[1] and (tonumber(o[2]) or 0) > 0 and redis.call('EXISTS', fk) == 0 then
      redis.call('HSET', fk, 'id', o[1], 'owner', b[2], 'purpose', 'batch_output',
                 'filename', b[1] .. '_' .. o[4] .. '.jsonl', 'created_at', now,
                 'expires_at', expires, 'kind', o[3], 'batch', b[1])
      redis.call('EXPIRE', fk, ttl)
      redis.call('ZADD', files_key, now, o[1])
    end
  end
  return 1
end

-- A finished batch lives as long as its files (`file_ttl`, from its end): its hash and its
-- lists of lines (`:out`, `:err`) expire with them, rather than never (listing drops it
-- from its tenant's index then: api/openai/batches.py). One written by an older API
-- (no `file_ttl`) is kept.
local function expire_batch(bk, ttl)
  if not ttl then return end
  for _, k in ipairs({bk, bk .. ':out', bk .. ':err'}) do redis.call('EXPIRE', k, ttl) end
end

-- Settle a batch whose lines have all ended once its driver finished enqueuing them: every
-- line of its `total` (the validated lines) is counted, as `completed` or `failed`, before
-- it settles (a line the driver could not enqueue is counted by the driver: reject.lua).
-- Returns the batch's status (after settling), or false for a missing batch.
local function batch_settle(bk, now)
  local b = redis.call('HMGET', bk, 'status', 'enqueued', 'enqueue_done', 'completed', 'failed',
                       'expired', 'webhook_url', 'id', 'owner', 'total', 'files_key', 'file_ttl')
  if b[3] ~= '1' or (b[1] ~= 'in_progress' and b[1] ~= 'cancelling') then return b[1] end
  local lines = math.max(tonumber(b[2]) or 0, tonumber(b[10]) or 0)
  if (tonumber(b[4]) or 0) + (tonumber(b[5]) or 0) < lines then return b[1] end
  local final = 'completed'
  if b[1] == 'cancelling' then final = 'cancelled'
  elseif (tonumber(b[6]) or 0) > 0 then final = 'expired' end
  redis.call('HSET', bk, 'status', final, final .. '_at', now, 'finalizing_at', now)
  redis.call('SREM', '@BATCHES_PENDING@', b[8])
  register_files(bk, now, b[11], b[12])
  expire_batch(bk, b[12])
  if b[7] then webhook('batch.' .. final, b[8], b[7], b[9], now) end
  return final
end

-- Count a batch line as done (settling its batch when it was the last) and queue the job's
-- completion webhook. Returns the TTL the job's keys get: batch lines live as long as
-- their batch's files, other jobs `default_ttl`.
local function on_terminal(job_key, state, now, default_ttl)
  local h = redis.call('HMGET', job_key, 'batch', 'id', 'webhook_url', 'ttl', 'owner', 'pool')
  if h[3] then webhook('job.' .. state, h[2], h[3], h[5], now) end
  if h[6] and redis.call('HINCRBY', '@POOL_LOAD@', h[6], -1) < 0 then  -- placed: it left
    redis.call('HSET', '@POOL_LOAD@', h[6], 0)
  end
  if not h[1] then return default_ttl end
  local bk = '@BATCH_PREFIX@' .. h[1]
  if state == 'succeeded' then
    redis.call('RPUSH', bk .. ':out', h[2])
    redis.call('HINCRBY', bk, 'completed', 1)
  else
    redis.call('RPUSH', bk .. ':err', h[2])
    redis.call('HINCRBY', bk, 'failed', 1)
    if state == 'expired' then redis.call('HINCRBY', bk, 'expired', 1) end
  end
  batch_settle(bk, now)
  -- The line's record lives as long as its batch's files (they render from the records):
  -- those expire `ttl` after the batch ends, at the latest at its window's end
  -- (`expires_at`), so the record keeps what is left of the window on top (an hour more
  -- for the expiry's own lag). It expired `ttl` after its own end: a file lost its
  -- first lines for up to a day before it expired itself.
  local ttl = tonumber(h[4]) or tonumber(default_ttl)
  local left = (tonumber(redis.call('HGET', bk, 'expires_at')) or 0) - tonumber(now)
  if left > 0 then ttl = ttl + math.ceil(left) + 3600 end
  return ttl
end

local function is_terminal(state)
  return state == 'succeeded' or state == 'failed' or state == 'cancelled'
         or state == 'expired'
end

-- The job no longer counts as queued, for its tenant or the rescue (idempotent).
local function leave_queue(job_key)
  local tq = redis.call('HGET', job_key, 'tenant_queued')
  if tq then redis.call('ZREM', tq, redis.call('HGET', job_key, 'id')) end
  redis.call('ZREM', '@QUEUED@', job_key)
end

-- The job no longer holds a slot of its lane (fair share: fair_victims.lua reads the
-- counts `{lane}:held`, tenant -> its running jobs; leasing.lua counts a job up once).
local function unhold(job_key)
  local h = redis.call('HMGET', job_key, 'held', 'lane', 'lane_tenant')
  if not h[1] then return end
  redis.call('HDEL', job_key, 'held')
  if redis.call('HINCRBY', h[2] .. ':held', h[3], -1) <= 0 then
    redis.call('HDEL', h[2] .. ':held', h[3])
  end
end

-- The one terminal transition (finish, a queued job cancelled, expiry, exhaustion): the
-- state and its fields, the terminal event, out of the running index, the bookkeeping
-- above, and the TTL the record and its stream keep from now on.
local function end_job(job_key, events_key, running_key, state, fields, event, data, now,
                       default_ttl, maxlen)
  redis.call('HSET', job_key, 'state', state)
  for k, v in pairs(fields) do redis.call('HSET', job_key, k, v) end
  redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', event, 'd', data)
  -- A hint for the API's stream readers (api/stream_notify.py). pcall: a Redis user
  -- without rights on the channel still gets the job written whole; the API then reads
  -- the stream at its full-read interval.
  redis.pcall('PUBLISH', events_key, '')
  redis.call('ZREM', running_key, job_key)
  unhold(job_key)
  local ttl = on_terminal(job_key, state, now, default_ttl)
  redis.call('EXPIRE', job_key, ttl)
  redis.call('EXPIRE', events_key, ttl)
end
