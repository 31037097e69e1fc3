-- Writes what one sweep of claimed runs found: each run's next look, or none
-- (it settled, or it only waits for a signal, a child or a call). A run is
-- changed as found only while it still holds this sweep's claim: one whose
-- look somebody asked for meanwhile (look.lua: a signal, a child's end, a
-- call's answer counted a wake after the examine) keeps that look, or takes
-- the sooner of the two, since its wake may never have been published.
-- KEYS[1] the sweep's due zset
-- ARGV[1] the claim's score (claim_due.lua), ARGV[2..] pairs of run id and
-- next look in ms ('' for none)
-- Returns the number of runs whose look was asked for meanwhile.
local claim = tonumber(ARGV[1])
local kept = 0
for i = 2, #ARGV, 2 do
  local run_id, at = ARGV[i], tonumber(ARGV[i + 1])
  local score = tonumber(redis.call('ZSCORE', KEYS[1], run_id) or '')
  if score == claim then
    if at then redis.call('ZADD', KEYS[1], at, run_id) else redis.call('ZREM', KEYS[1], run_id) end
  elseif score then
    kept = kept + 1
    if at and at < score then redis.call('ZADD', KEYS[1], at, run_id) end
  end
end
return kept
