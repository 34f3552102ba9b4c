-- reject (api's batch driver): a batch line that cannot be enqueued (it passed validation,
-- then failed; or it raised) becomes a job record that ended `failed` at once, never
-- queued: counted in its batch (enqueued and failed), listed in the batch's error file.
-- `state` 'cancelled' (a line the batch's cancel left unenqueued): it ends `cancelled`
-- instead, as a queued line the cancel ends does (its error file line: `batch_cancelled`).
-- Idempotent like create: returns 1 rejected, 0 when the line's job exists already.
--#include terminal
local job_key, events_key, running_key, tenant_jobs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local fields_json, err, now, maxlen, default_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local state = ARGV[6] or 'failed'

if redis.call('EXISTS', job_key) == 1 then return 0 end
local fields = cjson.decode(fields_json)
for k, v in pairs(fields) do redis.call('HSET', job_key, k, v) end
redis.call('ZADD', tenant_jobs, now, fields['id'])
if fields['batch'] then
  redis.call('HINCRBY', '@BATCH_PREFIX@' .. fields['batch'], 'enqueued', 1)
end
if state == 'cancelled' then
  end_job(job_key, events_key, running_key, 'cancelled',
          {finished_at = now, cancel_requested = '1'}, 'cancelled', '{}', now, default_ttl,
          maxlen)
else
  end_job(job_key, events_key, running_key, 'failed', {finished_at = now, error = err},
          'error', err, now, default_ttl, maxlen)
end
return 1
