-- Lists a new run in its namespace, honouring an idempotency key.
-- KEYS[1] namespace runs zset, KEYS[2] namespace counter, KEYS[3] index
-- meta hash, KEYS[4] (optional) idempotency key
-- ARGV[1] run id, ARGV[2] events channel (a new run is announced there)
-- Returns the run id that owns the start: ARGV[1], or the earlier run's id.
-- The run's index entries follow from its record (index_sync.lua, which the
-- caller runs next). A namespace whose first run is listed here is born
-- indexed ('built' in the meta hash); one of an older store needs
-- `celery-durable runs reindex` before its filtered listings use the indexes.
if KEYS[4] then
  local existing = redis.call('GET', KEYS[4])
  if existing then return existing end
  redis.call('SET', KEYS[4], ARGV[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[3], 'built', '1') end
local score = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], score, ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1] .. ' created')
return ARGV[1]
