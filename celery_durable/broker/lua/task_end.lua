-- A branch task ends: its message is no longer in flight.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch, ARGV[2] the task's id, ARGV[3] now (ms)
-- Returns {'ok'} (also when the attempt changed: nothing of it is kept).
if redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then
  token_done(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
end
return {'ok'}
