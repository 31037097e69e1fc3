-- Counts a write about to change what the indexes hold of a run (Redis
-- Cluster only: run_index.py), before that write: while the count is above
-- zero the run's entries may be behind its record, and a listing brings them
-- in line first (index_sync.lua 'r').
-- KEYS[1] namespace index intents hash
-- ARGV[1] run id, ARGV[2] now (ms)
-- Returns the count of writes under way.
local count = tonumber(string.match(redis.call('HGET', KEYS[1], ARGV[1]) or '', '^(%-?%d+)|') or '0')
count = math.max(count, 0) + 1
redis.call('HSET', KEYS[1], ARGV[1], count .. '|' .. ARGV[2])
return count
