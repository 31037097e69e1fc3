-- A worker received these queued messages of the run (its consumer says so
-- as each arrives, before it can start): they are '|held' from now, out of
-- reach of the empty-queue rule, which would take a message waiting in its
-- worker (for a countdown, or a free slot) for a lost one. Should that
-- worker die, its silence marks them lost (claim_dead_workers, mark_lost).
-- KEYS[1] live
-- ARGV[1..] task ids
-- Returns how many were marked.
local marked = 0
for i = 1, #ARGV do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  local kind, due = string.match(value or '', '^q|(%a)|(%d+)')
  if kind then
    redis.call('HSET', KEYS[1], ARGV[i], 'q|' .. kind .. '|' .. due .. '|held')
    marked = marked + 1
  end
end
return marked
