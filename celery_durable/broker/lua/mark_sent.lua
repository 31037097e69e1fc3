-- Records that the execution which dispatched a fan-out finished publishing
-- its branch tasks: a later execution of the same epoch then knows the
-- branches are in flight and must not send them again (see dispatch.lua),
-- and the run counts each of those messages as queued (liveness).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>"), ARGV[3] now (ms), ARGV[4..]
-- the task ids of the branch messages sent
-- Returns {'ok'} or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
redis.call('HSET', KEYS[2], 's:' .. ARGV[2], ARGV[1])
local now = tonumber(ARGV[3])
for i = 4, #ARGV do token_queued(KEYS[1], KEYS[3], ARGV[i], 's', now, now) end
return {'ok'}
