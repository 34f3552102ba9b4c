-- batch_files (api): a finished batch settled without registering its output and error
-- files (its hash has no `files_key`: written by an older API) registers them now, once,
-- as batch_settle does. Returns 1 registered now, 0 already (or not finished).
--#include terminal
local batch_key, files_key = KEYS[1], KEYS[2]
local now, ttl = ARGV[1], ARGV[2]

local status = redis.call('HGET', batch_key, 'status')
if status ~= 'completed' and status ~= 'failed' and status ~= 'expired'
   and status ~= 'cancelled' then
  return 0
end
return register_files(batch_key, now, files_key, ttl)
