-- create (api): a job's record, its Celery message and its `queued` event in one step, or
-- a refusal when the model's queue or the tenant's queued jobs are at their limit.
-- Returns {code, n}: 1 created (n: queue depth before it; then its position and eta in
-- ms, -1 unknown: eta.lua; both on its `queued` event too, reason `waiting`), 2 already
-- there (batch lines are created idempotently), -1 queue full (n: depth), -2 tenant full
-- (n: its queued jobs), 3 the Idempotency-Key's job, same body (n: its id), 4 its job, another body (n: its id).
-- With an Idempotency-Key (KEYS[7], its record "{id}|{body sha256}"): a key whose job still
-- exists answers 3 or 4 and creates nothing; otherwise the record is set in the same step
-- as the job, so a retry can never make a second job.
-- The message is a ticket (one job of this lane is ready); the job's id joins its tenant's
-- list in the lane, and the tenant the lane's backlogged (fair.lua: pick.lua takes it).
--#include fair
--#include eta
local job_key, events_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local tenant_jobs, tenant_queued, queued_index = KEYS[4], KEYS[5], KEYS[6]
local tenants_key, list_key, share_key, idem_key = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local fields_json, message, queue_limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local maxlen, now, tenant_limit = ARGV[4], ARGV[5], tonumber(ARGV[6])
local body_sha, idem_ttl = ARGV[7], ARGV[8]
local lane, tenant, half_s, fifo = ARGV[9], ARGV[10], tonumber(ARGV[11]), ARGV[12]

if idem_key then
  local prev = redis.call('GET', idem_key)
  if prev then
    local bar = string.find(prev, '|', 1, true)
    local prev_id = string.sub(prev, 1, bar - 1)
    if redis.call('EXISTS', '@JOB_PREFIX@' .. prev_id) == 1 then
      if string.sub(prev, bar + 1) == body_sha then return {3, prev_id} end
      return {4, prev_id}
    end
  end
end
if redis.call('EXISTS', job_key) == 1 then return {2, 0} end
local depth = redis.call('LLEN', queue_key)
if queue_limit > 0 and depth >= queue_limit then return {-1, depth} end
local mine = redis.call('ZCARD', tenant_queued)
if tenant_limit > 0 and mine >= tenant_limit then return {-2, mine} end
local fields = cjson.decode(fields_json)
for k, v in pairs(fields) do redis.call('HSET', job_key, k, v) end
-- the record names its tenant's queued set, so scripts that only know the job can leave it
redis.call('HSET', job_key, 'tenant_queued', tenant_queued, 'lane', lane,
           'lane_tenant', tenant)
redis.call('LPUSH', queue_key, message)
redis.call('RPUSH', list_key, fields['id'])
if fields['weight'] then
  redis.call('HSET', share_key, 'weight', fields['weight'])
  redis.call('EXPIRE', share_key, math.ceil(40 * half_s))
end
enter(tenants_key, tenant, share_key, tonumber(now), half_s, fifo, now)
-- news for the model's preemptors, naming the tenant (workers/preempt.py)
redis.pcall('PUBLISH', queue_key, tenant)
local est = estimate(lane, tenant, redis.call('LLEN', list_key) - 1, tonumber(now),
                     tonumber(fields['est_tokens']) or 0, tonumber(now), half_s, fifo)
redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'queued',
           'd', cjson.encode({position = est[1], eta_s = est[2], reason = 'waiting'}))
redis.pcall('PUBLISH', events_key, '')  -- a hint for the API's readers (terminal.lua)
redis.call('ZADD', tenant_jobs, now, fields['id'])
-- the index holds ids whose records may still exist: those past every retention (ARGV[13]
-- seconds old) leave it here, not only when a listing meets them (api/joblist.py)
local horizon = tonumber(ARGV[13]) or 0
if horizon > 0 then
  redis.call('ZREMRANGEBYSCORE', tenant_jobs, '-inf', '(' .. (tonumber(now) - horizon))
end
redis.call('ZADD', tenant_queued, now, fields['id'])
redis.call('ZADD', queued_index, now, job_key)
if fields['batch'] then
  redis.call('HINCRBY', '@BATCH_PREFIX@' .. fields['batch'], 'enqueued', 1)
end
if idem_key then
  redis.call('SET', idem_key, fields['id'] .. '|' .. body_sha, 'EX', idem_ttl)
end
return {1, depth, est[1], est[2] and math.floor(est[2] * 1000 + 0.5) or -1}
