-- A cancelled pass steps over an op journaled without an answer (a call, a
-- child, a wait: Cursor.stops_cancelled), and what its saga journals next
-- goes after it. The step-over is journaled here, before that next write, so
-- that every later replay steps over the op alike: sequence_reply hides any
-- answer of it from then on, and an answer that arrives late (call_done.lua,
-- child_done.lua) is answered 'late' and changes nothing. Otherwise a pass
-- that died before settling would leave the next one to find the op
-- answered, go on past it and diverge from its own compensations.
-- The mark is "so:<value field>" = the op's entry, so it holds only while
-- that very entry stands at the op (an op replaced there is not stepped over).
-- KEYS[1] run hash, KEYS[2] journal
-- ARGV[1] epoch, ARGV[2] sequence, ARGV[3] op index
-- Returns {'ok', cancel, pause, limit} or {refusal}.
local entry = redis.call('HGET', KEYS[2], 'o:' .. ARGV[2] .. ':' .. ARGV[3])
if entry then
  local field = value_field(ARGV[2], ARGV[3], entry)
  if field then redis.call('HSET', KEYS[2], 'so:' .. field, entry, 'stepped', '1') end
end
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3]}
