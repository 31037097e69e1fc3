-- Hands the workers that stopped beating to one sweeper, with the messages
-- each held when it last beat (received, scheduled or running): those died
-- with it. A claimed worker is forgotten, so no other sweeper claims it too.
-- KEYS[1] the fleet's worker zset (worker id -> ms of its last beat)
-- ARGV[1] a worker whose last beat is older than this (ms) is dead,
-- ARGV[2] the key prefix of the held hashes ("<prefix><worker id>")
-- Returns {worker, 'task|run task|run ...', worker, '...', ...}.
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, 100)
local out = {}
for _, worker in ipairs(dead) do
  redis.call('ZREM', KEYS[1], worker)
  local held_key = ARGV[2] .. worker
  local held = redis.call('HGETALL', held_key)
  redis.call('DEL', held_key)
  local pairs_text = {}
  for i = 1, #held, 2 do table.insert(pairs_text, held[i] .. '|' .. held[i + 1]) end
  table.insert(out, worker)
  table.insert(out, table.concat(pairs_text, ' '))
end
return out
