-- Deletes throttle T: whatever waits on it goes on unthrottled (the caller
-- tells each waiter's run, as for a slot given, throttle_granted.lua).
-- KEYS[1..9] the throttle's keys (keys.ThrottleKeys)
-- Returns {'unknown'} (no such throttle) or {'deleted', holder, epoch, ...}:
-- the waiters.
local T = throttle_keys(1)
if redis.call('EXISTS', T.conf) == 0 then return {'unknown'} end
local out = {'deleted'}
local waiters = redis.call('HGETALL', T.waiters)
for i = 1, #waiters, 2 do
  table.insert(out, waiters[i])
  table.insert(out, (throttle_waiter(waiters[i + 1])))
end
redis.call('DEL', unpack(KEYS))
return out
