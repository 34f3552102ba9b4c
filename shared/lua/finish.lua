-- finish (worker): running -> succeeded | failed | cancelled with its terminal event, once,
-- and only for the attempt that still holds the job. Returns 1 ended, 0 fenced off.
--#include terminal
local job_key, events_key, lease_key, running_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempt, state, fields_json, event, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local maxlen, default_ttl = ARGV[6], ARGV[7]

if redis.call('HGET', job_key, 'attempts') ~= attempt then return 0 end
if redis.call('HGET', job_key, 'state') ~= 'running' then return 0 end
local fields = cjson.decode(fields_json)
redis.call('DEL', lease_key)
end_job(job_key, events_key, running_key, state, fields, event, data,
        fields['finished_at'] or '0', default_ttl, maxlen)
return 1
