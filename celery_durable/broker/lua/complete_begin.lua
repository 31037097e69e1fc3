-- One round trip for two branches a branch task (or a coordinator pass)
-- runs one after the other: journals the finished one's last step and
-- outcome (complete_branch.lua, ending no message), then begins the next
-- one's first call (begin_call, as begin_op.lua). Quick branches then cost
-- one fenced script each instead of two.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] journal, KEYS[4] running steps,
-- KEYS[5] progress phase index, KEYS[6] steps, KEYS[7] live, KEYS[8] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] events channel, ARGV[4] sequence
-- of the call to begin;
-- the finished branch: ARGV[5] call ("<seq>:<i>"), ARGV[6] branch index,
-- ARGV[7] outcome (never fatal), ARGV[8] task id of the coordinator message
-- sent on wake ('' for none), ARGV[9] its last step's sequence, then as
-- record_op.lua's ARGV[4..9]: ARGV[10] op index, ARGV[11] identity,
-- ARGV[12] value field, ARGV[13] value, ARGV[14] step key, ARGV[15] row;
-- the call to begin: ARGV[16] cut ('' or "<op index>:<position>"),
-- ARGV[17] step key or '', ARGV[18] step row or '', ARGV[19] record count,
-- then per record: position, kind, phase id, message
-- Returns {'ok', cancel, pause, limit, outcome, wake} (outcome as
-- begin_op.lua's; wake 1 when the coordinator must be woken, ARGV[8] then
-- counted in flight); {'winner', value} or {'conflict', identity} when the
-- finished branch's step could not be journaled as run (then nothing was
-- written); or {refusal}.
if not dispatched_in(KEYS[3], ARGV[5], ARGV[1]) then return {'stale'} end
local verdict, detail = commit_call(KEYS[1], KEYS[3], KEYS[6], KEYS[4], ARGV[1], ARGV[9], ARGV[10], ARGV[11],
                                    ARGV[12], ARGV[13], ARGV[14], ARGV[15], KEYS[8], ARGV[2])
if verdict ~= 'ok' then return {verdict, detail} end
local wake = 0
if branch_outcome(KEYS[1], KEYS[3], ARGV[5], ARGV[6], ARGV[7], ARGV[1]) then
  token_queued(KEYS[1], KEYS[7], ARGV[8], 'c', ARGV[2], ARGV[2])
  wake = 1
end
local outcome, f = begin_call(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3],
                           ARGV[4], ARGV[16], ARGV[17], ARGV[18], ARGV, 20, tonumber(ARGV[19]), KEYS[8])
return {'ok', f[1], f[2], f[3], outcome, wake}
