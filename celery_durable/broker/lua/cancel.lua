-- Requests cancellation. A run with a live attempt gets the cancel flag (its
-- attempt stops at its next call, woken by a coordinator message counted as
-- queued here). Settled here and now, with its epoch bumped so nothing older
-- can write (a message of it a worker takes later is refused as stale):
--  * a pending run, which no attempt has started (activate_run is what turns
--    pending into running): nothing of it ran, so nothing is to undo, and no
--    worker need serve its workflow for it to end (SPEC 3);
--  * a settled run (paused, halted, error) whose saga never registered a
--    compensation;
--  * an error run that is not resumable (can_resume '0': nondeterminism,
--    say), even one marked compensable: an attempt would replay the same
--    code and end as it did, never reaching the cancellation, so its undos
--    would not run that way either, and the cancel would never end (SPEC 8:
--    such a run is non_resumable).
-- A settled but resumable run (paused, halted, error with can_resume) marked
-- compensable (compensable.lua: a saga of it registered an undo) is not
-- settled here: its undos may not have run, and only its code can run them.
-- It gets one more attempt, as resume.lua gives, with the cancel flag set:
-- the pass replays to where the run stood, meets the cancellation at its
-- next call, compensates and settles cancelled (SPEC 5c). Its ceilings are
-- cleared: a limit reached must not stop the undo of a run being cancelled.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] live, KEYS[4] waits,
-- KEYS[5] steps, KEYS[6] running steps, KEYS[7] agent rows, KEYS[8] history,
-- KEYS[9..] every other key of the run (for retain_run, and persisted for a
-- new attempt)
-- ARGV[1] now (ms), ARGV[2] events channel, ARGV[3] task id of the
-- coordinator message the caller sends on 'requested', ARGV[4] retention
-- (ms; 0 keeps the run for ever), ARGV[5] lease ttl (ms)
-- Returns {'requested', epoch}, {'cancelled', idempotency key or ''} or
-- {'settled', status}.
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'id', 'compensates', 'can_resume')
local status = f[1]
if ARCHIVABLE[status] then return {'settled', status} end
if not status then return {'settled'} end
local first_request = redis.call('HGET', KEYS[1], 'cancel') ~= '1'
if status == 'running' then
  if first_request then
    append_progress(KEYS[1], KEYS[2], 'system', '', 'Cancel requested', f[2], ARGV[1], nil, KEYS[8])
  end
  redis.call('HSET', KEYS[1], 'cancel', '1', 'updated_at', ARGV[1])
  token_queued(KEYS[1], KEYS[3], ARGV[3], 'c', ARGV[1], ARGV[1])
  redis.call('PUBLISH', ARGV[2], f[3] .. ' cancel')
  return {'requested', f[2]}
end
if status ~= 'pending' and f[4] == '1' and (status ~= 'error' or f[5] == '1') then
  local now = tonumber(ARGV[1])
  if first_request then
    append_progress(KEYS[1], KEYS[2], 'system', '', 'Cancel requested', f[2], ARGV[1], nil, KEYS[8])
  end
  tokens_clear(KEYS[1], KEYS[3], KEYS[4], now)
  for i = 1, #KEYS do redis.call('PERSIST', KEYS[i]) end
  local epoch = next_epoch(KEYS[1])
  set_status(KEYS[1], 'running', 'reason', '', 'error', '', 'can_resume', '0',
    'cancel', '1', 'pause', '0', 'lock', '', 'lock_until', '0', 'wake', '0',
    'lease_until', now + tonumber(ARGV[5]), 'finished_at', '', 'updated_at', ARGV[1],
    'limit', '', 'active_since', '', 'agents_running', '0', 'lim_timeout_ms', '', 'lim_credits_nano', '')
  interrupt_agents(KEYS[7])
  token_queued(KEYS[1], KEYS[3], ARGV[3], 'c', now, now)
  local attempt = redis.call('HGET', KEYS[1], 'attempt')
  append_progress(KEYS[1], KEYS[2], 'system', '',
    'Run resumed from ' .. status .. ' to cancel it: its saga compensates first (attempt ' .. attempt .. ')',
    epoch, ARGV[1], nil, KEYS[8])
  interrupt_steps(KEYS[1], KEYS[6], KEYS[5], KEYS[8], ARGV[1])
  record_event(KEYS[1], KEYS[8], 'attempt_started', '', ARGV[1], '')
  announce_status(KEYS[1], ARGV[2])
  return {'requested', epoch}
end
if first_request then
  -- Its request comes first in the history (cancel_requested), then its settling.
  append_progress(KEYS[1], KEYS[2], 'system', '', 'Cancel requested', f[2], ARGV[1], nil, KEYS[8])
end
local epoch = next_epoch(KEYS[1])
add_attempt(KEYS[1], -1)  -- fencing only: no new attempt runs
set_status(KEYS[1], 'cancelled', 'reason', 'cancelled',
  'error', 'Cancelled while ' .. status, 'can_resume', '0', 'finished_at', ARGV[1],
  'updated_at', ARGV[1], 'cancel', '1')
tokens_clear(KEYS[1], KEYS[3], KEYS[4], ARGV[1])
append_progress(KEYS[1], KEYS[2], 'system', '', 'Run cancelled', epoch, ARGV[1], nil, KEYS[8])
announce_status(KEYS[1], ARGV[2])
return {'cancelled', retain_run(KEYS[1], ARGV[4], {KEYS[2], KEYS[8]})}
