-- Journals a fan-out call and decides which of its branches to dispatch:
-- those without a live outcome, unless they are in flight already: sent by
-- this very execution, or by one that finished sending them (mark_sent.lua).
-- A redelivered coordinator whose first execution died halfway through
-- sending sends the missing ones again.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live, KEYS[4] history
-- ARGV[1] epoch, ARGV[2] sequence, ARGV[3] op index, ARGV[4] op identity,
-- ARGV[5] branch count, ARGV[6] dispatcher token, ARGV[7] position the op
-- began at (for a cut), ARGV[8] now (ms)
-- Returns {'dispatch', cut, j1, j2, ...} (possibly no j: all are done; cut
-- is 1 when branches that failed in an older attempt run again, which cuts
-- the sequence here), {'pending', messages of the run in flight (the
-- caller's own included)}, {'conflict', identity}, or {refusal}.
local conflict, replaced, fresh = record_op(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[1])
if conflict then return {'conflict', conflict} end
local call = ARGV[2] .. ':' .. ARGV[3]
local width = tonumber(ARGV[5])
if fresh then
  local tag = string.sub(ARGV[4], 1, 1)
  record_event(KEYS[1], KEYS[4], 'branches_dispatched', call, ARGV[8],
    cjson.encode({op = call, kind = tag == 'l' and 'pipeline' or 'parallel', width = width}))
end
if replaced then
  -- Whatever stood here before, outcomes under this call id are not ours.
  for j = 0, width - 1 do
    redis.call('HDEL', KEYS[2], 'r:' .. call .. ':' .. j)
  end
end
local stamp = ARGV[1] .. ':' .. ARGV[6]
local missing = {'dispatch', 0}
if fresh then
  -- The op is journaled here and now: no stamp or outcome of this call can
  -- be there yet (a replaced op's went with it), so every branch is
  -- missing, and none is read (a fan-out of n costs n reads less).
  for j = 0, width - 1 do table.insert(missing, j) end
else
  local previous = redis.call('HGET', KEYS[2], 'd:' .. call)
  if previous == stamp or (previous and string.sub(previous, 1, #ARGV[1] + 1) == ARGV[1] .. ':'
      and redis.call('HGET', KEYS[2], 's:' .. call) == ARGV[1]) then
    return {'pending', redis.call('HLEN', KEYS[3])}
  end
  for j = 0, width - 1 do
    local outcome = redis.call('HGET', KEYS[2], 'r:' .. call .. ':' .. j)
    if is_stale_failure(outcome, ARGV[1]) then
      table.insert(missing, j)
      if outcome then missing[2] = 1 end
    end
  end
end
if missing[2] == 1 then cut_sequence(KEYS[2], ARGV[2], ARGV[3], ARGV[1], ARGV[7]) end
redis.call('HSET', KEYS[2], 'c:' .. call, #missing - 2, 'd:' .. call, stamp)
return missing
