-- Requests a pause: the run dispatches no new work and settles as paused at
-- its next call, woken by a coordinator message counted as queued here; work
-- in flight finishes and is journaled.
-- The first request leaves a 'Pause requested' system record (the run's
-- history shows it as pause_requested), as cancel.lua's 'Cancel requested'.
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] progress stream, KEYS[4] history
-- ARGV[1] events channel, ARGV[2] now (ms), ARGV[3] task id of the
-- coordinator message the caller sends on 'requested'
-- Returns {'requested', epoch} or {'settled', status} ({'settled'} alone for
-- a run that does not exist).
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'id')
if f[1] ~= 'pending' and f[1] ~= 'running' then return {'settled', f[1]} end
if redis.call('HGET', KEYS[1], 'pause') ~= '1' then
  append_progress(KEYS[1], KEYS[3], 'system', '', 'Pause requested', f[2], ARGV[2], nil, KEYS[4])
end
redis.call('HSET', KEYS[1], 'pause', '1')
token_queued(KEYS[1], KEYS[2], ARGV[3], 'c', ARGV[2], ARGV[2])
redis.call('PUBLISH', ARGV[1], f[3] .. ' pause')
return {'requested', f[2]}
