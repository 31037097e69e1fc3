-- Records that the execution which dispatched a fan-out finished publishing
-- its branch tasks: a later execution of the same epoch then knows the
-- branches are in flight and must not send them again (see dispatch.lua).
-- The messages were counted in flight before they were published (sending.lua).
-- KEYS[1] run hash, KEYS[2] journal
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>")
-- Returns {'ok'} or {refusal}.
redis.call('HSET', KEYS[2], 's:' .. ARGV[2], ARGV[1])
return {'ok'}
