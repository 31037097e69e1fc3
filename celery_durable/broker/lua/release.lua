-- Ends a coordinator pass. When another activation arrived meanwhile (wake),
-- the lock is kept and the caller runs one more pass, so no wake-up is lost;
-- else the lock is released and the pass's message is done.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] lock token (the pass's task id), ARGV[2] epoch, ARGV[3] now (ms)
-- Returns 1 to run again, 0 when released.
if redis.call('HGET', KEYS[1], 'lock') ~= ARGV[1] then return 0 end
local f = redis.call('HMGET', KEYS[1], 'wake', 'epoch', 'status')
if f[1] == '1' and f[2] == ARGV[2] and f[3] == 'running' then
  redis.call('HSET', KEYS[1], 'wake', '0')
  return 1
end
redis.call('HSET', KEYS[1], 'lock', '', 'lock_until', '0')
if f[2] == ARGV[2] then token_done(KEYS[1], KEYS[2], ARGV[1], ARGV[3]) end
return 0
