-- Brings one run's entries in its namespace's indexes in line with its
-- record (what the indexes hold of a run: run_index.py).
-- KEYS[1] namespace index (lex zset), KEYS[2] index state hash, KEYS[3]
-- namespace runs zset, KEYS[4] index intents hash, KEYS[5] (one Redis only)
-- the run hash, read here: the caller runs this script in one MULTI with the
-- script that changed the run
-- ARGV[1] run id, ARGV[2] 'w' the sync of a writer that counted an intent
-- (index_intent.lua), 'r' a repair, '' neither; ARGV[3] now (ms), ARGV[4]
-- grace (ms): a repair forgets an intent older than that;
-- without KEYS[5], the record as the caller read it after its change:
-- ARGV[5] '1' if it exists, ARGV[6] its 'ixv', ARGV[7] status, ARGV[8]
-- workflow, ARGV[9] created_at (ms), ARGV[10] waiting summary ('' or JSON)
-- Returns 'applied', 'same', 'older' (the indexes hold a newer version),
-- 'unlisted' (not in its namespace's runs: index_run.lua lists it) or 'gone'
-- (the record is gone: its entries are dropped).
local run_id, mode = ARGV[1], ARGV[2]
local exists, version, status, workflow, created, waiting
if KEYS[5] then
  local f = redis.call('HMGET', KEYS[5], 'ixv', 'status', 'workflow', 'created_at', 'waiting', 'id')
  exists, version, status, workflow, created, waiting = f[6] ~= false and f[6] ~= nil, f[1] or '0', f[2], f[3], f[4], f[5]
else
  exists, version, status, workflow, created, waiting = ARGV[5] == '1', ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
end
if mode == 'w' then
  local count, last = string.match(redis.call('HGET', KEYS[4], run_id) or '', '^(%-?%d+)|(%d+)$')
  if count and tonumber(count) > 1 then
    redis.call('HSET', KEYS[4], run_id, (tonumber(count) - 1) .. '|' .. last)
  else
    redis.call('HDEL', KEYS[4], run_id)
  end
elseif mode == 'r' then
  local last = string.match(redis.call('HGET', KEYS[4], run_id) or '', '|(%d+)$')
  if last and tonumber(last) < tonumber(ARGV[3]) - tonumber(ARGV[4]) then redis.call('HDEL', KEYS[4], run_id) end
end
if not exists then
  index_drop(KEYS[1], KEYS[2], run_id)
  redis.call('ZREM', KEYS[3], run_id)
  return 'gone'
end
local counter = redis.call('ZSCORE', KEYS[3], run_id)
if not counter then return 'unlisted' end
return index_apply(KEYS[1], KEYS[2], run_id, tonumber(version) or 0, index_ord(created, counter), status or '',
  workflow or '', waiting or '')
