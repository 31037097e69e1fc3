-- Ends a coordinator pass. When another activation arrived meanwhile (wake),
-- the lock is kept and the caller runs one more pass, so no wake-up is lost.
-- KEYS[1] run hash
-- ARGV[1] lock token, ARGV[2] epoch
-- Returns 1 to run again, 0 when released.
if redis.call('HGET', KEYS[1], 'lock') ~= ARGV[1] then return 0 end
local f = redis.call('HMGET', KEYS[1], 'wake', 'epoch', 'status')
if f[1] == '1' and f[2] == ARGV[2] and f[3] == 'running' then
  redis.call('HSET', KEYS[1], 'wake', '0')
  return 1
end
redis.call('HSET', KEYS[1], 'lock', '', 'lock_until', '0')
return 0
