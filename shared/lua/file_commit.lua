-- file_commit (api's uploads): a copied upload becomes a file, unless its lease ran out
-- meanwhile (the sweeper took it). Its record and content expire at `expires_at` (Unix s,
-- from its first byte), and its deadline in the uploads index becomes that.
-- Returns 1 stored, 0 gone.
local uploads_key, file_key, data_key, files_key, bytes_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local member, file_id, now, expires_at, size =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
-- ARGV[6..]: the record's field/value pairs

local deadline = redis.call('ZSCORE', uploads_key, member)
if not deadline or tonumber(deadline) <= now then
  return 0
end
redis.call('HSET', file_key, unpack(ARGV, 6))
redis.call('EXPIREAT', file_key, expires_at)
if redis.call('EXISTS', data_key) == 1 then
  redis.call('EXPIREAT', data_key, expires_at)
end
redis.call('ZADD', uploads_key, expires_at, member)
redis.call('ZADD', files_key, now, file_id)
redis.call('ZADD', bytes_key, size, file_id)  -- what it holds: its size, not a guess
return 1
