-- Gives a run a new attempt: bumps the epoch (fencing out every older
-- attempt), forgets the old attempt's work in flight and sets the run
-- running again, with one coordinator message queued. Compare-and-set on
-- epoch and status, so two concurrent resumes (or sweeping workers) cannot
-- both win; a recovery also requires the old attempt to be dead (liveness).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] steps, KEYS[4] running
-- steps, KEYS[5] agent rows, KEYS[6] live, KEYS[7] waits, KEYS[8] history,
-- KEYS[9..] every other key of the run (a settled run's keys may carry its
-- retention TTL: persisted here)
-- ARGV[1] expected epoch, ARGV[2] expected status, ARGV[3] now (ms),
-- ARGV[4] events channel, ARGV[5] limits json or '' to keep,
-- ARGV[6] system message, ARGV[7] lease ttl (ms), ARGV[8] code hash or '',
-- ARGV[9] '1' for a recovery: the old attempt must be dead; '2' for a
-- recovery forced by a message delivered again whose holder died (the broker
-- says so: no lease need run out),
-- ARGV[10] run fields to set as "field=value,field=value" pairs: the ceilings
-- ('' keeps them; an empty value clears one) and trace_attempt, ARGV[11] task id of the new attempt's first
-- coordinator message, ARGV[12] when each queue was last found empty ("c=<ms>,s=<ms>,a=<ms>")
-- Returns {'ok', new epoch, attempt} or {'changed', epoch, status}.
local f = redis.call('HMGET', KEYS[1], 'epoch', 'status')
-- Settled for good, a run is never written again (archive_run.lua), whatever its caller read.
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or ARCHIVABLE[f[2]] then
  return {'changed', f[1] or '', f[2] or ''}
end
local now = tonumber(ARGV[3])
local recovery = ARGV[9] == '1' or ARGV[9] == '2'
if ARGV[9] == '1' and liveness(KEYS[1], KEYS[6], KEYS[7], now, tonumber(ARGV[7]), parse_empty(ARGV[12])) ~= 'dead' then
  return {'changed', f[1], f[2]}
end
-- A run still 'running' had an attempt, alive or dead: its clock stops when it
-- was last known alive (a paused, halted or failed run's stopped when it settled).
tokens_clear(KEYS[1], KEYS[6], KEYS[7], f[2] == 'running' and attempt_end(KEYS[1], now) or now)
for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]) end
-- A new attempt takes over the old one, not the requests made of it: a
-- cancel asked for still holds, whoever resumes (SPEC 3: a cancel made
-- durable is received; the run compensates, then settles cancelled), and so
-- does a pause through a recovery. A resume by hand is what lifts a pause.
local requested = redis.call('HMGET', KEYS[1], 'cancel', 'pause')
local cancel = requested[1] or '0'
local pause = recovery and (requested[2] or '0') or '0'
local epoch = next_epoch(KEYS[1])
if recovery then
  count_recovery(KEYS[1])
else
  made_progress(KEYS[1])  -- a resume by hand starts the count again
end
set_status(KEYS[1], 'running', 'reason', '', 'error', '', 'can_resume', '0',
  'cancel', cancel, 'pause', pause, 'lock', '', 'lock_until', '0', 'wake', '0',
  'lease_until', now + tonumber(ARGV[7]), 'finished_at', '', 'updated_at', ARGV[3],
  'limit', '', 'active_since', '', 'agents_running', '0')
for pair in string.gmatch(ARGV[10], '[^,]+') do
  local eq = string.find(pair, '=', 1, true)
  redis.call('HSET', KEYS[1], string.sub(pair, 1, eq - 1), string.sub(pair, eq + 1))
end
interrupt_agents(KEYS[5])
if redis.call('HGET', KEYS[1], 'started_at') == '' then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[3])
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'limits', ARGV[5]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'code_hash', ARGV[8]) end
token_queued(KEYS[1], KEYS[6], ARGV[11], 'c', now, now)
local attempt = redis.call('HGET', KEYS[1], 'attempt')
append_progress(KEYS[1], KEYS[2], 'system', '', ARGV[6] .. ' (attempt ' .. attempt .. ')', epoch, ARGV[3], nil,
  KEYS[8])
-- The history says it in causal order: the take-over (or resume), the old
-- attempt's steps it interrupted, then the new attempt.
interrupt_steps(KEYS[1], KEYS[4], KEYS[3], KEYS[8], ARGV[3])
record_event(KEYS[1], KEYS[8], 'attempt_started', '', ARGV[3], '')
announce_status(KEYS[1], ARGV[4])
return {'ok', epoch, tonumber(attempt)}
