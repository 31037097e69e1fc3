-- Lists a new run in its namespace, honouring an idempotency key.
-- KEYS[1] namespace runs zset, KEYS[2] namespace counter,
-- KEYS[3] (optional) idempotency key
-- ARGV[1] run id, ARGV[2] events channel (a new run is announced there)
-- Returns the run id that owns the start: ARGV[1], or the earlier run's id.
if KEYS[3] then
  local existing = redis.call('GET', KEYS[3])
  if existing then return existing end
  redis.call('SET', KEYS[3], ARGV[1])
end
local score = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], score, ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1] .. ' created')
return ARGV[1]
