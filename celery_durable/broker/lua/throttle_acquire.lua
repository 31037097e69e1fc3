-- Asks throttle T for a slot for holder "<run id>|<op>" of attempt <epoch>:
-- taken now, or a place in its queue (priority, then first come first
-- served). Idempotent: a holder already holding, or already waiting, keeps
-- its slot or its place; a holder of an older attempt (one that died) gives
-- its slot back and asks again as the new one.
-- KEYS[1..9] the throttle's keys (keys.ThrottleKeys)
-- ARGV[1] now (ms), ARGV[2] holder, ARGV[3] epoch, ARGV[4] throttle key
-- ('' for none), ARGV[5] priority (an int, higher first)
-- Returns {'unknown'} (no such throttle), or {'granted'|'held'|'queued',
-- next due ms or '', holder, epoch, ...}: the verdict for this holder, when
-- an admission may next be possible by time alone, and the other holders
-- admitted meanwhile, whose runs the caller tells (throttle_granted.lua).
local T = throttle_keys(1)
if redis.call('EXISTS', T.conf) == 0 then return {'unknown'} end
local now, holder, epoch = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local held = redis.call('HGET', T.holders, holder)
if held then
  local held_epoch = throttle_holder(held)
  if held_epoch == epoch then return {'held', ''} end
  throttle_give_back(T, holder, held)
end
local waiting = redis.call('HGET', T.waiters, holder)
if waiting then
  local w_epoch, since, rank, key = throttle_waiter(waiting)
  if w_epoch ~= epoch then redis.call('HSET', T.waiters, holder, epoch .. '|' .. since .. '|' .. rank .. '|' .. key) end
else
  throttle_enqueue(T, holder, epoch, ARGV[4], ARGV[5], now)
end
local granted, next_due = throttle_admit(T, now)
local others, mine = {}, false
for i = 1, #granted, 2 do
  if granted[i] == holder then mine = true else
    table.insert(others, granted[i])
    table.insert(others, granted[i + 1])
  end
end
return throttle_reply(mine and 'granted' or 'queued', others, next_due)
