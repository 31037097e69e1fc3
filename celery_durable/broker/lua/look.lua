-- Asks the sweep to look at runs no later than a time: before a script that
-- may count a wake of a run runs (store_core.py), so a process that dies
-- between that script and the wake's publish leaves a run the sweep looks at
-- (and finds its counted message gone, liveness in _prelude.lua), never one
-- that waits unwatched for ever. A look already due sooner is kept; a
-- sweeper's claim (a score of half a millisecond, claim_due.lua) is replaced,
-- so the verdict of a look begun before this cannot drop it (looked.lua).
-- KEYS[1] the sweep's due zset
-- ARGV[1] the time (ms), ARGV[2..] run ids
-- Returns the number of runs whose look was moved.
local at = tonumber(ARGV[1])
local moved = 0
for i = 2, #ARGV do
  local score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or '')
  if not score or score > at or score % 1 ~= 0 then
    redis.call('ZADD', KEYS[1], at, ARGV[i])
    moved = moved + 1
  end
end
return moved
