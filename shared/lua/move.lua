-- move (worker): a queued job goes from one pool's lane to another's of the same model and
-- priority, one atomic step (workers/rebalance.py decides when: docs/scheduling.md,
-- "Moving queued jobs"). The job moved is the one the `from` lane's next ticket would
-- take (its fairest tenant's oldest), and only if it is still `expected`: the caller
-- estimated that one. A job that runs, is pinned to its pool (`backend` in the request)
-- or has a message naming it (a hand-back, a takeover) never moves.
-- What moves with it: its id to the head of its tenant's list in `to` (the tenant enters
-- that lane as create.lua enters it), its record's `lane`, `pool` and `backend`
-- (`moved_from` says where it was placed), one pool's load to the other (place.lua, terminal.lua), and a
-- ticket: one of the last SCAN messages of the `from` queue that is a ticket (not a
-- message naming its job) is removed, and `ticket` is pushed at the consuming end of
-- `to`, so each queue's length stays its backlog. (None of the last SCAN a ticket: the
-- `from` lane keeps one too many, which finds nothing when taken: pick.lua.)
-- Returns {'ok', id}; {'changed', id} (the next job is another now), {'pinned', id},
-- {'stale', id} (not queued: pick.lua skips it) or {'empty'}.
--#include fair
local from_tenants, to_tenants, load_key = KEYS[1], KEYS[2], KEYS[3]
local from_queue, to_queue = KEYS[4], KEYS[5]
local from_lane, to_lane, from_pool, to_pool = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local expected, ticket, now = ARGV[5], ARGV[6], tonumber(ARGV[7])
local half_s, fifo, to_backend = tonumber(ARGV[8]), ARGV[9], ARGV[10]
local SCAN = 16

local tenant = redis.call('ZRANGE', from_tenants, 0, 0)[1]
if not tenant then return {'empty'} end
local from_list = from_lane .. ':t:' .. tenant
local job_id = redis.call('LINDEX', from_list, 0)
if not job_id then return {'empty'} end
if job_id ~= expected then return {'changed', job_id} end
local job_key = '@JOB_PREFIX@' .. job_id
local h = redis.call('HMGET', job_key, 'state', 'pinned', 'msg', 'created_at')
if h[1] ~= 'queued' then return {'stale', job_id} end
if h[2] == '1' or h[3] then return {'pinned', job_id} end

redis.call('LPOP', from_list)
rescore(from_tenants, tenant, from_list, nil, fifo)
redis.call('LPUSH', to_lane .. ':t:' .. tenant, job_id)
enter(to_tenants, tenant, '@SHARE_PREFIX@' .. tenant, now, half_s, fifo, h[4] or ARGV[7])
redis.call('HSET', job_key, 'lane', to_lane, 'pool', to_pool, 'backend', to_backend,
           'moved_from', from_pool)

local tail = redis.call('LRANGE', from_queue, -SCAN, -1)
for i = #tail, 1, -1 do
  local ok, msg = pcall(cjson.decode, tail[i])
  local args = ok and type(msg) == 'table' and type(msg['headers']) == 'table'
               and msg['headers']['argsrepr']
  if type(args) == 'string' and string.sub(args, 1, 4) == "(''," then
    redis.call('LREM', from_queue, -1, tail[i])
    break
  end
end
redis.call('RPUSH', to_queue, ticket)  -- the consuming end: the idle pool takes it now
redis.pcall('PUBLISH', to_queue, '')  -- news for the model's preemptors (workers/preempt.py)

if redis.call('HINCRBY', load_key, from_pool, -1) < 0 then
  redis.call('HSET', load_key, from_pool, 0)
end
redis.call('HINCRBY', load_key, to_pool, 1)
return {'ok', job_id}
