-- Takes the activation lock of a run for one coordinator pass, and marks the
-- pass's message running (see liveness in _prelude.lua; activate_run there).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] live, KEYS[4] history,
-- KEYS[5] journal (read only with ARGV[8])
-- ARGV[1] epoch, ARGV[2] lock token (the pass's task id), ARGV[3] now (ms),
-- ARGV[4] lock ttl (ms), ARGV[5] lease ttl (ms), ARGV[6] events channel,
-- ARGV[7] task id of the message that comes back if the lock is busy,
-- ARGV[8] a sequence whose tail to read once the lock is taken (optional:
-- the body a worker kept parked checks it is still current, without a
-- round trip of its own), ARGV[9] the index that tail starts at
-- Returns {'ok', cancel, pause, limit} followed, with ARGV[8], by that tail
-- as sequence_reply gives it; {'busy', ms until that message is due}
-- (another pass holds the lock: it is told to run once more, and this one
-- looks again when the lock would have expired); or {refusal} ('settled'
-- for a paused run too: activate_run in _prelude.lua).
return activate_run(KEYS[1], KEYS[2], KEYS[3], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7],
  ARGV[8], ARGV[9], '', KEYS[4])
