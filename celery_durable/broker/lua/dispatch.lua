-- Journals a fan-out call and decides which of its branches to dispatch:
-- those without a live outcome, unless this epoch dispatched them already.
-- KEYS[1] run hash, KEYS[2] journal
-- ARGV[1] epoch, ARGV[2] sequence, ARGV[3] op index, ARGV[4] op identity,
-- ARGV[5] branch count
-- Returns {'dispatch', j1, j2, ...} (possibly none: all are done),
-- {'pending'} (already dispatched by this epoch), {'conflict', identity},
-- or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local conflict, replaced = record_op(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[1])
if conflict then return {'conflict', conflict} end
local call = ARGV[2] .. ':' .. ARGV[3]
if replaced then
  -- The op replaces an abandoned one: its branches' outcomes and histories
  -- belong to the old op and must not be mistaken for this one's.
  local kind = string.sub(replaced, 1, 1)
  if kind == 'p' or kind == 'l' then
    for j = 0, tonumber(string.sub(replaced, 3)) - 1 do
      redis.call('HDEL', KEYS[2], 'r:' .. call .. ':' .. j)
      local branch = ARGV[2] .. '.' .. ARGV[3] .. '.' .. j
      redis.call('HSET', KEYS[2], 'k:' .. branch, ARGV[1] .. ':-1')
      redis.call('HDEL', KEYS[2], 'h:' .. branch)
    end
  end
  redis.call('HDEL', KEYS[2], 'c:' .. call, 'd:' .. call)
end
if redis.call('HGET', KEYS[2], 'd:' .. call) == ARGV[1] then
  return {'pending'}
end
local missing = {'dispatch'}
for j = 0, tonumber(ARGV[5]) - 1 do
  local outcome = redis.call('HGET', KEYS[2], 'r:' .. call .. ':' .. j)
  if is_stale_failure(outcome, ARGV[1]) then
    table.insert(missing, j)
  end
end
redis.call('HSET', KEYS[2], 'c:' .. call, #missing - 1, 'd:' .. call, ARGV[1])
return missing
