-- Takes runs whose keys are gone (run retention) out of every index of
-- their namespace: the runs zset, the lexicographic index, the index state
-- and the intents.
-- KEYS[1] namespace runs zset, KEYS[2] namespace index, KEYS[3] index state
-- hash, KEYS[4] index intents hash
-- ARGV run ids
-- Returns how many of them were in the runs zset.
local gone = 0
for _, run_id in ipairs(ARGV) do
  gone = gone + redis.call('ZREM', KEYS[1], run_id)
  index_drop(KEYS[2], KEYS[3], run_id)
  redis.call('HDEL', KEYS[4], run_id)
end
return gone
