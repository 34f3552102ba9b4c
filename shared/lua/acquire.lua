-- acquire (worker): take a delivered job. queued, or running without a lease (its worker
-- died) -> running with attempts + 1, our lease and a `started` event. Returns
-- {'ok', attempt, spec, cancel_requested}, or {reason} when the job is not run:
-- 'missing'; 'terminal' or 'busy' (a redelivered copy: counted in `duplicates` so the
-- duplicate is visible, and dropped); 'expired' (past its deadline), 'poison' (a worker
-- died compiling its grammar) or 'exhausted' (max_attempts reached), which end the job
-- here. Attempts ended by a preemption (preempt.lua: `preemptions`) still bump the
-- attempt number (the fence) but do not count against max_attempts.
--#include terminal
--#include leasing
local job_key, events_key, lease_key, running_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker, lease_ms, max_attempts = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, maxlen, default_ttl = ARGV[4], ARGV[5], ARGV[6]

return lease_job(job_key, events_key, lease_key, running_key, worker, lease_ms,
                 max_attempts, now, maxlen, default_ttl)
