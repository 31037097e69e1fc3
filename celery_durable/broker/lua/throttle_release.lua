-- Gives back slots of throttle T and takes waiters out of its queue, then
-- admits whoever may go now: the one way a slot is freed, so a freed slot
-- goes to the next waiter in the same script.
-- KEYS[1..9] the throttle's keys (keys.ThrottleKeys)
-- ARGV[1] now (ms), ARGV[2..] pairs of holder and which of its attempts
-- give up their slot or place: '=<epoch>' that one, '!<epoch>' any other,
-- '' any
-- Returns {'released', next due ms or '', holder, epoch, ...}: when an
-- admission may next be possible by time alone, and the holders admitted,
-- whose runs the caller tells (throttle_granted.lua); {'unknown', ''} when
-- the throttle does not exist.
local T = throttle_keys(1)
if redis.call('EXISTS', T.conf) == 0 then return {'unknown', ''} end
local now = tonumber(ARGV[1])
local function which(epoch, mode)
  if mode == '' then return true end
  if string.sub(mode, 1, 1) == '=' then return epoch == string.sub(mode, 2) end
  return epoch ~= string.sub(mode, 2)
end
for i = 2, #ARGV, 2 do
  local holder, mode = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', T.holders, holder)
  if held and which(throttle_holder(held), mode) then throttle_give_back(T, holder, held) end
  local waiting = redis.call('HGET', T.waiters, holder)
  if waiting and which(throttle_waiter(waiting), mode) then throttle_dequeue(T, holder, waiting) end
end
local granted, next_due = throttle_admit(T, now)
return throttle_reply('released', granted, next_due)
