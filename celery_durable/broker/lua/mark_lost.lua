-- Marks messages of a run as lost: a worker that died (claim_dead_workers.lua)
-- had received them and not started them (its prefetch, its countdowns), so
-- no queue will deliver them again soon. A message that runs, there or on
-- another worker that got it redelivered, is judged by its own heartbeat.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] now (ms), ARGV[2..] task ids
-- Returns how many were marked.
local marked = 0
for i = 2, #ARGV do
  local value = redis.call('HGET', KEYS[2], ARGV[i])
  if value and string.sub(value, 1, 2) == 'q|' then
    redis.call('HSET', KEYS[2], ARGV[i], 'l|' .. ARGV[1])
    marked = marked + 1
  end
end
return marked
