-- A branch task ends: its message is no longer in flight. While a pause is
-- asked for, each branch that ends wakes the coordinator: the pause settles
-- once nothing of the fan-out runs any more (dispatch.lua's in-flight count),
-- even when the branch that ended last was not the fan-out's last.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch, ARGV[2] the task's id, ARGV[3] now (ms), ARGV[4] task id of
-- the coordinator message to send if a pause waits for this
-- Returns {'ok', wake (0/1)} (also when the attempt changed: nothing of it is kept).
local f = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'pause')
if f[1] ~= ARGV[1] then return {'ok', 0} end
token_done(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
if f[2] == 'running' and f[3] == '1' and ARGV[4] ~= '' then
  token_queued(KEYS[1], KEYS[2], ARGV[4], 'c', ARGV[3], ARGV[3])
  return {'ok', 1}
end
return {'ok', 0}
