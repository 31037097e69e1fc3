-- Takes the activation lock of a run for one coordinator pass, and marks the
-- pass's message running (see liveness in _prelude.lua; activate_run there).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] live, KEYS[4] history,
-- KEYS[5] journal (read only with ARGV[8])
-- ARGV[1] epoch, ARGV[2] lock token (the pass's task id), ARGV[3] now (ms),
-- ARGV[4] lock ttl (ms), ARGV[5] lease ttl (ms), ARGV[6] events channel,
-- ARGV[7] task id of the message that comes back if the lock is busy,
-- ARGV[8] a sequence whose tail to read once the lock is taken (optional:
-- the body a worker kept parked checks it is still current, without a
-- round trip of its own), ARGV[9] the index that tail starts at;
-- ARGV[10], ARGV[11] (optional, with ARGV[8]): the workflow and namespace
-- the caller's message names, when it has not read the run: the script
-- checks them, and the attempt's throttle slot, as that read would have,
-- and answers with the run's record as that read would have found it, just
-- before the lock was taken (a first pass sees the run pending).
-- Returns {'ok', cancel, pause, limit} followed, with ARGV[10], by the run
-- hash as HGETALL gives it, then, with ARGV[8], by that tail as
-- sequence_reply gives it; {'busy', ms until that message is due}
-- (another pass holds the lock: it is told to run once more, and this one
-- looks again when the lock would have expired); {refusal} ('settled' for a
-- paused run too: activate_run in _prelude.lua); with ARGV[10], {'forged'}
-- (the run is another workflow's) or {'read'}: nothing done, the caller
-- reads the run and activates as without ARGV[10] (a throttled attempt
-- without its slot yet, which it takes first; or another namespace named).
local expect, record = ARGV[10], nil
if expect then
  local f = redis.call('HMGET', KEYS[1], 'workflow', 'namespace', 'throttle', 'slot', 'cancel')
  if f[1] and f[1] ~= expect then return {'forged'} end
  if f[2] ~= ARGV[11] or (f[3] and f[3] ~= '' and f[4] ~= ARGV[1] and f[5] ~= '1') then return {'read'} end
  record = redis.call('HGETALL', KEYS[1])
end
local reply = activate_run(KEYS[1], KEYS[2], KEYS[3], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
  ARGV[7], ARGV[8], ARGV[9], '', KEYS[4])
if record and reply[1] == 'ok' then table.insert(reply, 5, record) end
return reply
