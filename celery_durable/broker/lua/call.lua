-- A sequence calls a Celery task of the fleet (ctx.call): the op is journaled
-- under its key, exactly as a step's, and the call is answered from the
-- journal, or published once per attempt, or waited for. Its due time (the
-- call's timeout) is fixed the first time it is reached, and fixed again by
-- an attempt that re-runs an older attempt's failure (a time-out too) before
-- it sends the task: the old due time is that attempt's, and may be past.
-- Past it, with no result, the call fails as a time-out (journaled like a
-- step's failure).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] waits, KEYS[4] running steps,
-- KEYS[5] steps, KEYS[6] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity "c|<key>", ARGV[6] key, ARGV[7] owner, ARGV[8] due
-- (ms) or '', ARGV[9] '' or "<op index>:<position>" when this op re-runs an
-- older attempt's failure (see cut_sequence), ARGV[10] running step row,
-- ARGV[11] the outcome to journal on a time-out, ARGV[12] the step row's
-- error then, ARGV[13] events channel, ARGV[14] the call's inputs (JSON
-- {"args", "kwargs"}, kept whole as i:<key> for the run's history; '' keeps none)
-- Returns {'hit', cancel, pause, limit, outcome}, {'publish', ...flags}
-- (send the task now), {'pending', ...flags} (it is in flight already),
-- {'conflict', identity} or {refusal}.
local seq, index, key, now = ARGV[3], ARGV[4], ARGV[6], tonumber(ARGV[2])
local stop, at = enter_op(KEYS[2], ARGV[1], seq, index, ARGV[5], ARGV[9])
if stop then return stop end
local f
local outcome = redis.call('HGET', KEYS[2], 'v:' .. key)
if outcome and not is_stale_failure(outcome, ARGV[1]) then
  redis.call('HDEL', KEYS[3], at)
  f = flags(KEYS[1])
  return {'hit', f[1], f[2], f[3], outcome}
end
-- Here any outcome is an older attempt's failure: this attempt calls again
-- (SPEC 4, 5a). Until it has sent the task (ce:<key>), the old due time is
-- void; once sent, later passes of this attempt keep the one it fixed.
local due
if not outcome or redis.call('HGET', KEYS[2], 'ce:' .. key) == ARGV[1] then
  due = redis.call('HGET', KEYS[2], 'wd:' .. at)
end
if not due then
  due = ARGV[8]
  redis.call('HSET', KEYS[2], 'wd:' .. at, due)
end
if due ~= '' and now >= tonumber(due) then
  -- No result within the time-out: the call fails, in this attempt (a
  -- later one calls again; a result that comes late is refused).
  redis.call('HSET', KEYS[2], 'v:' .. key, ARGV[11])
  local ok, row = pcall(cjson.decode, redis.call('HGET', KEYS[4], key) or ARGV[10])
  if not ok or type(row) ~= 'table' then row = {} end
  row['status'], row['finished_at'], row['error'] = 'failed', now, ARGV[12]
  if redis.call('HDEL', KEYS[4], key) == 1 then redis.call('HINCRBY', KEYS[1], 'steps_running', -1) end
  local text = cjson.encode(row)
  redis.call('HSET', KEYS[5], key, text)
  record_event(KEYS[1], KEYS[6], 'call_failed', key, ARGV[2], text)
  redis.call('HDEL', KEYS[3], at)
  if journals_new(outcome, ARGV[11]) then made_progress(KEYS[1]) end
  f = flags(KEYS[1])
  return {'hit', f[1], f[2], f[3], ARGV[11]}
end
local entry = {owner = ARGV[7], kind = 'call', name = key}
if due ~= '' then entry['until'] = tonumber(due) end
-- A call's wait is fleet work, never in the 'waiting' summary: adding or
-- removing one leaves it as it is (refresh_waiting reads every wait, and a
-- fan-out of calls has thousands).
redis.call('HSET', KEYS[3], at, cjson.encode(entry))
local verdict = 'pending'
if redis.call('HGET', KEYS[2], 'ce:' .. key) ~= ARGV[1] then
  -- Not published by this attempt yet: publish now, and show it running.
  redis.call('HSET', KEYS[2], 'ce:' .. key, ARGV[1])
  if ARGV[14] and ARGV[14] ~= '' then redis.call('HSET', KEYS[2], 'i:' .. key, ARGV[14]) end
  if redis.call('HSET', KEYS[4], key, ARGV[10]) == 1 then redis.call('HINCRBY', KEYS[1], 'steps_running', 1) end
  record_event(KEYS[1], KEYS[6], 'call_sent', key, ARGV[2], ARGV[10])
  verdict = 'publish'
end
redis.call('PUBLISH', ARGV[13], run_field(KEYS[1], 'id') .. ' waiting')
f = flags(KEYS[1])
return {verdict, f[1], f[2], f[3]}
