-- create (api): a job's record, its Celery message and its `queued` event in one step, or
-- a refusal when the model's queue or the tenant's queued jobs are at their limit.
-- Returns {code, n}: 1 created (n: queue depth before it), 2 already there (batch lines
-- are created idempotently), -1 queue full (n: depth), -2 tenant full (n: its queued jobs).
local job_key, events_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local tenant_jobs, tenant_queued, queued_index = KEYS[4], KEYS[5], KEYS[6]
local fields_json, message, queue_limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local maxlen, now, tenant_limit = ARGV[4], ARGV[5], tonumber(ARGV[6])

if redis.call('EXISTS', job_key) == 1 then return {2, 0} end
local depth = redis.call('LLEN', queue_key)
if queue_limit > 0 and depth >= queue_limit then return {-1, depth} end
local mine = redis.call('ZCARD', tenant_queued)
if tenant_limit > 0 and mine >= tenant_limit then return {-2, mine} end
local fields = cjson.decode(fields_json)
for k, v in pairs(fields) do redis.call('HSET', job_key, k, v) end
-- the record names its tenant's queued set, so scripts that only know the job can leave it
redis.call('HSET', job_key, 'tenant_queued', tenant_queued, 'msg', message)
redis.call('LPUSH', queue_key, message)
redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', 'queued',
           'd', cjson.encode({position = depth}))
redis.call('ZADD', tenant_jobs, now, fields['id'])
redis.call('ZADD', tenant_queued, now, fields['id'])
redis.call('ZADD', queued_index, now, job_key)
if fields['batch'] then
  redis.call('HINCRBY', '@BATCH_PREFIX@' .. fields['batch'], 'enqueued', 1)
end
return {1, depth}
