-- Reads one sequence of the journal in one round trip: its op entries, the
-- values replay needs (step outcomes, now()/uuid4() values), its cut and its
-- progress high-water mark.
-- KEYS[1] journal
-- ARGV[1] sequence, ARGV[2] the first index to read (0: the whole sequence)
-- Returns {cut or '', hwm or '', entry<start>, value<start>, ...}; an
-- entry is "<epoch>:<identity>", a value is false when the op carries none.
local seq = ARGV[1]
local count = tonumber(redis.call('HGET', KEYS[1], 'n:' .. seq) or '0')
local out = {redis.call('HGET', KEYS[1], 'k:' .. seq) or '', redis.call('HGET', KEYS[1], 'h:' .. seq) or ''}
for i = tonumber(ARGV[2] or '0'), count - 1 do
  local entry = redis.call('HGET', KEYS[1], 'o:' .. seq .. ':' .. i) or '0:'
  local ident = string.sub(entry, string.find(entry, ':', 1, true) + 1)
  local kind = string.sub(ident, 1, 1)
  local value = false
  if kind == 's' or kind == 'c' then
    value = redis.call('HGET', KEYS[1], 'v:' .. string.sub(ident, 3))
  elseif kind == 'a' then
    value = redis.call('HGET', KEYS[1], 'a:' .. string.sub(ident, 3))
  elseif kind == 't' or kind == 'u' or kind == 'z' or kind == 'g' then
    -- now()/uuid4() values, and how a wait ended (false while it has not)
    value = redis.call('HGET', KEYS[1], 'x:' .. seq .. ':' .. i)
  end
  table.insert(out, entry)
  table.insert(out, value)
end
return out
