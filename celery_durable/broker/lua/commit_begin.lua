-- One round trip for two calls of the main body: journals the step it ran
-- last (commit_call), then begins its next call (begin_call), so a straight
-- line of steps costs one fenced script per step instead of two. The step
-- is journaled before the next call's work starts, as with record_op.lua.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] journal, KEYS[4] running steps,
-- KEYS[5] progress phase index, KEYS[6] steps, KEYS[7] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] events channel, ARGV[4] sequence,
-- the step to journal: ARGV[5] op index, ARGV[6] op identity, ARGV[7] value
-- field, ARGV[8] value, ARGV[9] step key, ARGV[10] row to leave;
-- the call to begin: ARGV[11] cut ('' or "<op index>:<position>"),
-- ARGV[12] step key or '', ARGV[13] step row or '', ARGV[14] record count,
-- then per record: position, kind, phase id, message
-- Returns {'ok', cancel, pause, limit, outcome} as begin_op.lua does;
-- {'conflict', identity} or {'winner', value} when the step could not be
-- journaled as run (then nothing was begun); or {refusal}.
local verdict, detail = commit_call(KEYS[1], KEYS[3], KEYS[6], KEYS[4], ARGV[1], ARGV[4], ARGV[5], ARGV[6],
                                    ARGV[7], ARGV[8], ARGV[9], ARGV[10], KEYS[7], ARGV[2])
if verdict ~= 'ok' then return {verdict, detail} end
local outcome, f = begin_call(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3],
                           ARGV[4], ARGV[11], ARGV[12], ARGV[13], ARGV, 15, tonumber(ARGV[14]), KEYS[7])
return {'ok', f[1], f[2], f[3], outcome}
