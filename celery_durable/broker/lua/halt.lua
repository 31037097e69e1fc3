-- Stops a run whose attempt died, resumably, instead of taking it over:
-- while automatic recovery is off (status halted, reason interrupted), or
-- once it was taken over max_recoveries times in a row with nothing new
-- journaled between (status error, reason recovery_limit: its passes die
-- every time). The epoch is bumped so the dead attempt, should it wake, is
-- fenced out. Compare-and-set like resume.lua, the death and the count of
-- take-overs checked again here.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] steps, KEYS[4] running
-- steps, KEYS[5] agent rows, KEYS[6] live, KEYS[7] waits, KEYS[8] history,
-- KEYS[9..] every other key of the run
-- ARGV[1] expected epoch, ARGV[2] expected status, ARGV[3] now (ms),
-- ARGV[4] events channel, ARGV[5] lease ttl (ms), ARGV[6] when each queue was
-- last found empty ("c=<ms>,s=<ms>,a=<ms>", see liveness), ARGV[7] status,
-- ARGV[8] reason, ARGV[9] error, ARGV[10] the system record's message,
-- ARGV[11] the take-overs in a row it needs (0: none), ARGV[12] '1' when a
-- message delivered again says its holder died (no lease need run out),
-- ARGV[13] retention (ms; 0 keeps the run for ever)
-- Returns {'ok', idempotency key or ''} or {'changed'}.
local f = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'recoveries')
-- Settled for good, a run is never written again (archive_run.lua), whatever its caller read.
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or ARCHIVABLE[f[2]] then return {'changed'} end
if tonumber(f[3] or '0') < tonumber(ARGV[11]) then return {'changed'} end
local now = tonumber(ARGV[3])
if ARGV[12] ~= '1' and liveness(KEYS[1], KEYS[6], KEYS[7], now, tonumber(ARGV[5]), parse_empty(ARGV[6])) ~= 'dead' then
  return {'changed'}
end
tokens_clear(KEYS[1], KEYS[6], KEYS[7], attempt_end(KEYS[1], now))  -- the dead time is no active time
redis.call('HSET', KEYS[1], 'agents_running', '0')
local epoch = next_epoch(KEYS[1])
add_attempt(KEYS[1], -1)  -- no new attempt runs: the count stays
set_status(KEYS[1], ARGV[7], 'reason', ARGV[8], 'error', ARGV[9],
  'can_resume', '1', 'finished_at', ARGV[3], 'updated_at', ARGV[3], 'lock', '', 'lock_until', '0')
interrupt_steps(KEYS[1], KEYS[4], KEYS[3], KEYS[8], ARGV[3])
interrupt_agents(KEYS[5])
append_progress(KEYS[1], KEYS[2], 'system', '', ARGV[10], epoch, ARGV[3], nil, KEYS[8])
announce_status(KEYS[1], ARGV[4])
return {'ok', retain_run(KEYS[1], ARGV[13], {KEYS[2], KEYS[8]})}
