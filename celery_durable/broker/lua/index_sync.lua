-- Brings runs' entries in their namespace's indexes in line with their
-- records (what the indexes hold of a run: run_index.py).
-- KEYS[1] namespace index (lex zset), KEYS[2] index state hash, KEYS[3]
-- namespace runs zset, KEYS[4] index intents hash, KEYS[5..] (one Redis
-- only) the run hashes, read here: the caller runs this script in one MULTI
-- with the scripts that changed the runs
-- ARGV[1] 'w' the sync of a writer that counted an intent (index_intent.lua),
-- 'r' a repair, '' neither; ARGV[2] now (ms), ARGV[3] grace (ms): a repair
-- forgets an intent older than that; then with KEYS[5..], ARGV[4..] their
-- run ids; without, 7 values per run, its record as the caller read it after
-- its change: run id, '1' if it exists, its 'ixv', status, workflow, created_at
-- (ms), waiting summary ('' or JSON)
-- Returns one verdict per run: 'applied', 'same', 'older' (the indexes hold
-- a newer version), 'unlisted' (not in its namespace's runs: index_run.lua
-- lists it) or 'gone' (the record is gone: its entries are dropped).
local mode, now, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local function sync(run_id, exists, version, status, workflow, created, waiting)
  if mode == 'w' then
    local count, last = string.match(redis.call('HGET', KEYS[4], run_id) or '', '^(%-?%d+)|(%d+)$')
    if count and tonumber(count) > 1 then
      redis.call('HSET', KEYS[4], run_id, (tonumber(count) - 1) .. '|' .. last)
    else
      redis.call('HDEL', KEYS[4], run_id)
    end
  elseif mode == 'r' then
    local last = string.match(redis.call('HGET', KEYS[4], run_id) or '', '|(%d+)$')
    if last and tonumber(last) < now - grace then redis.call('HDEL', KEYS[4], run_id) end
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
end

local verdicts = {}
if KEYS[5] then
  for i = 5, #KEYS do
    local f = redis.call('HMGET', KEYS[i], 'ixv', 'status', 'workflow', 'created_at', 'waiting', 'id')
    table.insert(verdicts, sync(ARGV[i - 1], f[6] ~= false, f[1] or '0', f[2], f[3], f[4], f[5]))
  end
  return verdicts
end
for i = 4, #ARGV, 7 do
  table.insert(verdicts, sync(ARGV[i], ARGV[i + 1] == '1', ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5],
    ARGV[i + 6]))
end
return verdicts
