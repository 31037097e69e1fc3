-- Journals one call of a sequence and, for a step, its outcome (commit_call
-- in _prelude.lua).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] steps, KEYS[4] running steps,
-- KEYS[5] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity, ARGV[6] value field ('' for none; "v:<key>" for a
-- step outcome, "x:<seq>:<i>" for a now()/uuid4() value), ARGV[7] value,
-- ARGV[8] step key whose row to settle ('' for none), ARGV[9] row to leave
-- ('' deletes it), ARGV[10] '1' when the step is a saga's compensation
-- (absent or '0' otherwise): the sequence's field u:<seq> then names it,
-- '<epoch>:<index>', so that no failure journaled before it is run again
-- (Cursor.compensated_after)
-- Returns {'ok', cancel, pause, limit, ''}; {'ok', cancel, pause, limit,
-- value} when the value field already held a live outcome (first write
-- wins, and the caller must use that one); {'conflict', identity} for
-- non-determinism; {refusal}.
local verdict, detail = commit_call(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[3], ARGV[4], ARGV[5],
                                    ARGV[6], ARGV[7], ARGV[8], ARGV[9], KEYS[5], ARGV[2])
if verdict == 'conflict' then return {'conflict', detail} end
if ARGV[10] == '1' then
  -- Past the live history, so past any live compensation named before; or a
  -- compensation that re-runs an older attempt's failure in place, named back
  -- from the later ones of its saga, which the cut past them keeps
  -- (Cursor.cut_here): only compensations lie between.
  redis.call('HSET', KEYS[2], 'u:' .. ARGV[3], ARGV[1] .. ':' .. ARGV[4])
end
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3], detail}
