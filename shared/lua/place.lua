-- place (api): choose a new job's pool among a model's pools and count it there, one atomic
-- step (api/placement.py, docs/scheduling.md "Placement"), so that a burst of concurrent
-- placements each sees the jobs placed before it. A pool's load (`@POOL_LOAD@`, a hash:
-- pool id -> jobs placed there and not yet ended) is counted up here and down when the
-- job ends (terminal.lua's on_terminal), or by the API when its create did not happen.
-- Per pool (ARGV, 6 each after the budget): its id, slots, mean job seconds, the job's
-- own first-token and decode seconds there, and whether it may take the job (1/0).
--   wait   = 0 while load < slots, else (ceil(k / slots) - 1/2) x job_s, k = load - slots + 1:
--            the job starts with the k-th slot to free, in the ceil(k / slots)-th round of
--            the pool's slots, the round under way half done (a burst's slots all started
--            together: the first frees a whole job later, not job_s / slots)
--   first  = wait + own first;  finish = first + own decode
-- The earliest finish among those allowed whose first token is within the budget (ms;
-- 0: none) gets the job and its load + 1. Returns {index (1-based; 0: none fits), then
-- first and finish in ms of each pool}.
local load_key = KEYS[1]
local budget_ms = tonumber(ARGV[1])
local FIELDS = 6

local best, best_finish = 0, nil
local out = {0}
for i = 0, (#ARGV - 1) / FIELDS - 1 do
  local o = 2 + i * FIELDS
  local pool, slots, job_s = ARGV[o], tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2])
  local own_first, own_decode, allowed = tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]), ARGV[o + 5]
  local load = math.max(0, tonumber(redis.call('HGET', load_key, pool)) or 0)
  slots = math.max(1, slots)
  local wait = 0
  if load >= slots then wait = (math.ceil((load - slots + 1) / slots) - 0.5) * job_s end
  local first = wait + own_first
  local finish = first + own_decode
  out[#out + 1] = math.floor(first * 1000 + 0.5)
  out[#out + 1] = math.floor(finish * 1000 + 0.5)
  if allowed == '1' and (budget_ms <= 0 or first * 1000 <= budget_ms)
     and (best_finish == nil or finish < best_finish) then
    best, best_finish = i + 1, finish
  end
end
if best > 0 then
  redis.call('HINCRBY', load_key, ARGV[2 + (best - 1) * FIELDS], 1)
end
out[1] = best
return out
