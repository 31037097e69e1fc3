-- Settles a run: completed, error, cancelled or halted, by the attempt that
-- owns it.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] steps, KEYS[4] running
-- steps, KEYS[5] agent rows, KEYS[6] live, KEYS[7] waits, KEYS[8] history,
-- KEYS[9] journal, KEYS[10] progress phase index, KEYS[11..] every other key
-- of the run (they all start the retention clock, retain_run)
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] events channel, ARGV[4] status,
-- ARGV[5] reason, ARGV[6] error, ARGV[7] can_resume (0/1),
-- ARGV[8] has_result (0/1), ARGV[9] result json, ARGV[10] system message,
-- ARGV[11] retention (ms; 0 keeps the run for ever); then, for a main
-- body's pass that settles with writes it has not made yet (the step it
-- held back, its buffered progress: one round trip for both, as
-- commit_begin.lua makes them): ARGV[12] 1/0 whether the settlement knew of
-- a cancel, ARGV[13] the sequence, ARGV[14..19] the step to journal ('' in
-- ARGV[14] for none) as commit_begin.lua's ARGV[5..10], ARGV[20..] the
-- records as its ARGV[11..]
-- Returns {'ok', idempotency key or '', '1' if the run ever asked a throttle
-- for a slot else '0'} or {refusal}; with writes, and the run not settled:
-- {'cancel'} (a cancel the settlement did not know of: nothing written, the
-- caller writes as a pass that did not settle, and decides again), or
-- commit_begin.lua's {'conflict', identity} or {'winner', value}.
if ARGV[12] then
  if ARGV[12] == '0' and redis.call('HGET', KEYS[1], 'cancel') == '1' then return {'cancel'} end
  if ARGV[14] ~= '' then
    local verdict, detail = commit_call(KEYS[1], KEYS[9], KEYS[3], KEYS[4], ARGV[1], ARGV[13], ARGV[14], ARGV[15],
                                        ARGV[16], ARGV[17], ARGV[18], ARGV[19], KEYS[8], ARGV[2])
    if verdict ~= 'ok' then return {verdict, detail} end
  end
  begin_call(KEYS[1], KEYS[2], KEYS[9], KEYS[4], KEYS[10], ARGV[1], ARGV[2], ARGV[3], ARGV[13], ARGV[20], ARGV[21],
             ARGV[22], ARGV, 24, tonumber(ARGV[23]), KEYS[8])
end
tokens_clear(KEYS[1], KEYS[6], KEYS[7], ARGV[2])
set_status(KEYS[1], ARGV[4], 'reason', ARGV[5], 'error', ARGV[6],
  'can_resume', ARGV[7], 'has_result', ARGV[8], 'result', ARGV[9],
  'finished_at', ARGV[2], 'updated_at', ARGV[2], 'lock', '', 'lock_until', '0', 'wake', '0')
if ARGV[4] == 'completed' then
  local phase_id = redis.call('HGET', KEYS[1], 'phase_id')
  if phase_id and phase_id ~= '' then redis.call('HSET', KEYS[1], 'pe:' .. phase_id, ARGV[2]) end
end
-- Settled for good, the run fences out every later write, so a step still
-- running (a fan-out branch left behind by a cancel or a fatal sibling) can
-- never finish: show it interrupted, not running forever. A paused run still
-- lets in-flight steps finish and be journaled.
if ARGV[4] ~= 'paused' then
  interrupt_steps(KEYS[1], KEYS[4], KEYS[3], KEYS[8], ARGV[2])
  interrupt_agents(KEYS[5])
  redis.call('HSET', KEYS[1], 'agents_running', '0')
end
if ARGV[5] == 'nondeterminism' then
  record_event(KEYS[1], KEYS[8], 'nondeterminism', '', ARGV[2], cjson.encode({message = ARGV[6]}))
end
if ARGV[10] ~= '' then
  append_progress(KEYS[1], KEYS[2], 'system', '', ARGV[10], ARGV[1], ARGV[2], nil, KEYS[8])
end
local f = redis.call('HMGET', KEYS[1], 'throttle', 'throttled')
announce_status(KEYS[1], ARGV[3])
-- Whether the run ever asked a throttle for a slot (its own, or an op's):
-- only then has its caller slots to give back (tasks/throttling.give_back).
local throttled = (f[1] and f[1] ~= '') and '1' or throttled_flag(f[2])
if ARGV[4] == 'paused' then return {'ok', '', throttled} end
return {'ok', retain_run(KEYS[1], ARGV[11], {KEYS[2], KEYS[8]}), throttled}
