-- renew_job (worker): extend a job's lease while it is ours, and take it back if it
-- expired while this worker was stalled (a GC pause, a frozen VM) as long as no newer
-- attempt took the job and it has not ended. Once a takeover's acquire bumped `attempts`
-- it is lost for good and the worker aborts its attempt; a requeued message that meets
-- the taken-back lease drops itself (acquire: busy). A handed-back job is never renewed
-- (the worker stops renewing it before handback deletes the lease).
-- A lost attempt whose worker is alive to ask (a newer attempt took the job while this
-- worker could not reach Redis: a failover, a partition, a stall) is noted in `survived`
-- (the attempt numbers, comma-separated) and counted once in `survivals`: acquire does
-- not count it against max_attempts, which bounds attempts whose worker died.
-- Returns 1 held, 0 lost.
local lease_key, job_key = KEYS[1], KEYS[2]
local lease, lease_ms, attempt = ARGV[1], ARGV[2], ARGV[3]

local function survived()
  if (tonumber(redis.call('HGET', job_key, 'attempts')) or 0) <= tonumber(attempt) then
    return
  end
  local seen = redis.call('HGET', job_key, 'survived')
  if seen and string.find(',' .. seen .. ',', ',' .. attempt .. ',', 1, true) then return end
  redis.call('HSET', job_key, 'survived', seen and (seen .. ',' .. attempt) or attempt)
  redis.call('HINCRBY', job_key, 'survivals', 1)
end

local cur = redis.call('GET', lease_key)
if cur == lease then
  redis.call('PEXPIRE', lease_key, lease_ms)
  return 1
end
if redis.call('EXISTS', job_key) == 0 then return 0 end
if cur then
  survived()
  return 0
end
if redis.call('HGET', job_key, 'state') == 'running'
   and redis.call('HGET', job_key, 'attempts') == attempt then
  redis.call('SET', lease_key, lease, 'PX', lease_ms)
  return 1
end
survived()
return 0
