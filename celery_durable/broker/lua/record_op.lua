-- Journals one call of a sequence and, for a step, its outcome.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] steps, KEYS[4] running steps
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity, ARGV[6] value field ('' for none; "v:<key>" for a
-- step outcome, "x:<seq>:<i>" for a now()/uuid4() value), ARGV[7] value,
-- ARGV[8] step key whose row to settle ('' for none), ARGV[9] row to leave
-- ('' deletes it)
-- Returns {'ok', cancel, pause, ''}; {'ok', cancel, pause, value} when the
-- value field already held a live outcome (first write wins, and the caller
-- must use that one); {'conflict', identity} for non-determinism; {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local conflict, replaced = record_op(KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[1])
if conflict then return {'conflict', conflict} end
local winner = ''
if ARGV[6] ~= '' then
  local current = redis.call('HGET', KEYS[2], ARGV[6])
  local is_step = string.sub(ARGV[6], 1, 2) == 'v:'
  -- A now()/uuid4() value of an abandoned op is not this op's value.
  if current and not is_step and replaced then current = nil end
  if current and not (is_step and is_stale_failure(current, ARGV[1])) then
    winner = current
  else
    redis.call('HSET', KEYS[2], ARGV[6], ARGV[7])
    made_progress(KEYS[1])
    if ARGV[8] ~= '' and string.sub(ARGV[7], 1, 1) == 'o' then
      redis.call('HINCRBY', KEYS[1], 'steps_done', 1)
    end
  end
end
if ARGV[8] ~= '' then
  if redis.call('HDEL', KEYS[4], ARGV[8]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'steps_running', -1)
  end
  if ARGV[9] == '' then
    redis.call('HDEL', KEYS[3], ARGV[8])
  else
    redis.call('HSET', KEYS[3], ARGV[8], ARGV[9])
  end
end
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3], winner}
