-- handback (worker): a draining worker gives a running job back, only while the lease is
-- still ours. The job stays in the running index, so a lost hand-back message is rescued
-- like a takeover. Returns 1 handed back, 0 not ours (or no longer running).
local job_key, lease_key, queue_key = KEYS[1], KEYS[2], KEYS[3]
local lease, message = ARGV[1], ARGV[2]

if redis.call('GET', lease_key) ~= lease then return 0 end
redis.call('DEL', lease_key)
if redis.call('HGET', job_key, 'state') ~= 'running' then return 0 end
redis.call('HSET', job_key, 'msg', message)
redis.call('RPUSH', queue_key, message)  -- the consuming end (kombu BRPOPs the tail)
redis.pcall('PUBLISH', queue_key, '')  -- news for the model's preemptors (workers/preempt.py)
return 1
