-- Forgets slot intents of a run once their slots were given back: each
-- only while it is still what the caller read (a newer attempt's intent
-- for the same op stays).
-- KEYS[1] the run's throttle intents
-- ARGV[1..] pairs of op and the intent read
-- Returns the number forgotten.
local forgotten = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    forgotten = forgotten + 1
  end
end
return forgotten
