-- renew_job (worker): extend a job's lease while it is ours, and take it back if it
-- expired while this worker was stalled (a GC pause, a frozen VM) as long as no newer
-- attempt took the job and it has not ended. Once a takeover's acquire bumped `attempts`
-- it is lost for good and the worker aborts its attempt; a requeued message that meets
-- the taken-back lease drops itself (acquire: busy). A handed-back job is never renewed
-- (the worker stops renewing it before handback deletes the lease).
-- Returns 1 held, 0 lost.
local lease_key, job_key = KEYS[1], KEYS[2]
local lease, lease_ms, attempt = ARGV[1], ARGV[2], ARGV[3]

local cur = redis.call('GET', lease_key)
if cur == lease then
  redis.call('PEXPIRE', lease_key, lease_ms)
  return 1
end
if cur then return 0 end
if redis.call('HGET', job_key, 'state') == 'running'
   and redis.call('HGET', job_key, 'attempts') == attempt then
  redis.call('SET', lease_key, lease, 'PX', lease_ms)
  return 1
end
return 0
