-- A worker received these queued messages of the run (its consumer says so
-- as each arrives, before it can start): they are '|held <ms>' from now, out
-- of reach of the empty-queue rule, which would take a message waiting in a
-- live worker (for its countdown, or a slot) for a lost one. A held message
-- still not started a lease after it was received (or due, for a countdown)
-- is dead all the same (liveness in _prelude.lua); should its worker die,
-- the worker's silence marks it lost first (claim_dead_workers, mark_lost).
-- KEYS[1] live
-- ARGV[1] now (ms), ARGV[2..] task ids
-- Returns how many were marked.
local marked = 0
for i = 2, #ARGV do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  local kind, due = string.match(value or '', '^q|(%a)|(%d+)')
  if kind then
    redis.call('HSET', KEYS[1], ARGV[i], 'q|' .. kind .. '|' .. due .. '|held ' .. ARGV[1])
    marked = marked + 1
  end
end
return marked
