-- Requests a pause: the run dispatches no new work and settles as paused at
-- its next call; work in flight finishes and is journaled.
-- KEYS[1] run hash
-- ARGV[1] events channel
-- Returns {'requested', epoch} or {'settled', status}.
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'id')
if f[1] ~= 'pending' and f[1] ~= 'running' then return {'settled', f[1]} end
redis.call('HSET', KEYS[1], 'pause', '1')
redis.call('PUBLISH', ARGV[1], f[3] .. ' pause')
return {'requested', f[2]}
