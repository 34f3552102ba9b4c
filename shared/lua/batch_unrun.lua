-- batch_unrun (api's batch driver, a cancel's sweep): lines the cancel left unenqueued end
-- `cancelled` as entries of the batch's error file, not as job records: "~<line> <custom_id>"
-- (api/openai/batch_files.py renders it as the `batch_cancelled` line a cancelled record
-- gives), counted in `enqueued` and `failed` as reject.lua counts a line. A record each
-- (hash, event stream, the tenant's job list, kept as long as the batch's files) made a
-- cancel while a 50,000-line batch validated write 50,000 of them, without running any.
-- A line that has a job (written past the cursor before the cancel) is skipped;
-- `unrun_to` (the last line handled) makes a second sweep of the same lines (another
-- driver, after this one died) count none twice. Settles the batch when they were its
-- last. KEYS: the batch, then each line's job key; ARGV: now, then line, custom_id pairs.
-- Returns how many lines were counted.
--#include terminal
local bk = KEYS[1]
local now = ARGV[1]

local done = tonumber(redis.call('HGET', bk, 'unrun_to')) or 0
local counted, last = 0, done
for i = 2, #KEYS do
  local line, custom_id = tonumber(ARGV[2 * i - 2]), ARGV[2 * i - 1]
  if line > done and redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('RPUSH', bk .. ':err', '~' .. line .. ' ' .. custom_id)
    counted = counted + 1
  end
  if line > last then last = line end
end
if counted > 0 then
  redis.call('HINCRBY', bk, 'enqueued', counted)
  redis.call('HINCRBY', bk, 'failed', counted)
end
redis.call('HSET', bk, 'unrun_to', last)
batch_settle(bk, now)
return counted
