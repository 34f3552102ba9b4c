-- append (worker): one step's token events for one job, only while `attempts` still equals
-- the writer's attempt (the fence) and the job runs. A token is written only if its index
-- is the next one (`n_tokens`), so a step replayed after a failed or cut pipeline (Redis
-- restarted mid-write) adds nothing twice and never leaves a gap.
-- Returns 0 fenced off, 1 written, 2 written and the job's cancel was requested.
local job_key, events_key = KEYS[1], KEYS[2]
local attempt, maxlen = ARGV[1], ARGV[2]
-- then (data, token id, index) per token, from ARGV[3] on

if redis.call('HGET', job_key, 'attempts') ~= attempt then return 0 end
if redis.call('HGET', job_key, 'state') ~= 'running' then return 0 end
local n = tonumber(redis.call('HGET', job_key, 'n_tokens') or '0')
for i = 3, #ARGV, 3 do
  if tonumber(ARGV[i + 2]) == n then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
               'e', 'token', 'd', ARGV[i], 't', ARGV[i + 1])
    n = n + 1
  end
end
redis.call('HSET', job_key, 'n_tokens', n)
if redis.call('HGET', job_key, 'cancel_requested') == '1' then return 2 end
return 1
