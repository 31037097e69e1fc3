-- Counts a write about to change what the indexes hold of each run, before
-- that write (run_index.py): while a run's count is above zero its entries
-- may be behind its record, and a listing brings them in line first
-- (index_sync.lua 'r').
-- KEYS[1] namespace index intents hash
-- ARGV[1] now (ms), ARGV[2..] run ids
-- Returns each run's count of writes under way, this one included.
local counts = {}
for i = 2, #ARGV do
  local count = tonumber(string.match(redis.call('HGET', KEYS[1], ARGV[i]) or '', '^(%-?%d+)|') or '0')
  count = math.max(count, 0) + 1
  redis.call('HSET', KEYS[1], ARGV[i], count .. '|' .. ARGV[1])
  table.insert(counts, count)
end
return counts
