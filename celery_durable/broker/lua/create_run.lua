-- Creates a run record, refusing to overwrite one.
-- KEYS[1] run hash
-- ARGV    field, value, field, value, ...
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('HSET', KEYS[1], 'incarnation', server_incarnation(), 'attempt', '1')
return 1
