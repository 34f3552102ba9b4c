-- renew (api's batch driver): extend a lease key while it still holds our value.
-- Returns 1 held, 0 lost.
local lease_key = KEYS[1]
local lease, lease_ms = ARGV[1], ARGV[2]

if redis.call('GET', lease_key) == lease then
  redis.call('PEXPIRE', lease_key, lease_ms)
  return 1
end
return 0
