-- Requests cancellation. A run with a live attempt gets the cancel flag (its
-- attempt stops at its next call, woken by a coordinator message counted as
-- queued here); a settled but resumable run is cancelled here and now, with
-- its epoch bumped so nothing older can write.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] live, KEYS[4] waits,
-- KEYS[5..] every other key of the run (for retain_run)
-- ARGV[1] now (ms), ARGV[2] events channel, ARGV[3] task id of the
-- coordinator message the caller sends on 'requested', ARGV[4] retention
-- (ms; 0 keeps the run for ever)
-- Returns {'requested', epoch}, {'cancelled', idempotency key or ''} or
-- {'settled', status}.
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'id')
local status = f[1]
if status == 'completed' or status == 'cancelled' then return {'settled', status} end
if status == 'pending' or status == 'running' then
  if redis.call('HGET', KEYS[1], 'cancel') ~= '1' then
    append_progress(KEYS[1], KEYS[2], 'system', '', 'Cancel requested', f[2], ARGV[1])
  end
  redis.call('HSET', KEYS[1], 'cancel', '1', 'updated_at', ARGV[1])
  token_queued(KEYS[1], KEYS[3], ARGV[3], 'c', ARGV[1], ARGV[1])
  redis.call('PUBLISH', ARGV[2], f[3] .. ' cancel')
  return {'requested', f[2]}
end
local epoch = next_epoch(KEYS[1])
redis.call('HINCRBY', KEYS[1], 'attempt', -1)  -- fencing only: no new attempt runs
set_status(KEYS[1], 'cancelled', 'reason', 'cancelled',
  'error', 'Cancelled while ' .. status, 'can_resume', '0', 'finished_at', ARGV[1],
  'updated_at', ARGV[1], 'cancel', '1')
tokens_clear(KEYS[1], KEYS[3], KEYS[4], ARGV[1])
append_progress(KEYS[1], KEYS[2], 'system', '', 'Run cancelled', epoch, ARGV[1])
redis.call('PUBLISH', ARGV[2], f[3] .. ' status')
return {'cancelled', retain_run(KEYS[1], ARGV[4])}
