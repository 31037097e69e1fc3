-- Runs before every call a workflow makes: flushes its buffered progress
-- records (dropping those an earlier replay already wrote) and, for a step,
-- shows the step as running (begin_call in _prelude.lua).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] journal, KEYS[4] running steps,
-- KEYS[5] progress phase index, KEYS[6] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] events channel, ARGV[4] sequence,
-- ARGV[5] '' or "<op index>:<position>": this op re-runs a failure of an
-- older attempt, so what that attempt journaled after it is abandoned and
-- progress from <position> on is new (see cut_sequence),
-- ARGV[6] step key or '', ARGV[7] step row or '', ARGV[8] record count,
-- then per record: position, kind, phase id, message
-- Returns {'ok', cancel, pause, limit, outcome}: outcome is the step's live
-- journaled outcome when another sequence (or an attempt that died before
-- recording this op) already journaled the key, else ''. Or {refusal}.
local outcome, f = begin_call(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3],
                           ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV, 9, tonumber(ARGV[8]), KEYS[6])
return {'ok', f[1], f[2], f[3], outcome}
