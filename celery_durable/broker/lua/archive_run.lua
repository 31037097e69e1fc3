-- Folds a run settled for good (completed or cancelled: it can never be
-- resumed, SPEC §8) into its archive: one string, built by the caller from
-- the keys it read (schema/archive.py; Lua has no zlib), kept as long as the
-- run hash, and the keys it was built from deleted. Written only if the run
-- is still settled so and the keys are still exactly what the caller read
-- (the same digest as schema.archive.digest: each string length-prefixed,
-- a hash as the sorted SHA-1s of its pairs, whatever order Redis keeps them
-- in; hex digits sort alike in any locale), so a write that came between leaves the run
-- unarchived, never archived stale. An optimisation: a run never archived
-- (its caller died first, or it settled before archives) reads the same.
-- KEYS[1] run hash, KEYS[2] history, KEYS[3] steps, KEYS[4] progress
-- stream, KEYS[5] journal, KEYS[6] progress phase index, KEYS[7] archive
-- ARGV[1] the archive, ARGV[2] the digest of the keys it was built from
-- Returns {'ok'}, {'archived'} (it was already), {'changed', status} (not
-- completed or cancelled, or its keys are not what was read) or {'missing'}.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if status ~= 'completed' and status ~= 'cancelled' then return {'changed', status} end
if redis.call('EXISTS', KEYS[7]) == 1 then return {'archived'} end
local parts = {}
local function add(text) parts[#parts + 1] = #text .. ':' .. text end
local function stream(key)
  for _, entry in ipairs(redis.call('XRANGE', key, '-', '+')) do
    add(entry[1])
    for _, item in ipairs(entry[2]) do add(item) end
  end
  parts[#parts + 1] = '|'
end
local function hash(key)
  local flat = redis.call('HGETALL', key)
  local pairs_ = {}
  for i = 1, #flat, 2 do
    pairs_[#pairs_ + 1] = redis.sha1hex(#flat[i] .. ':' .. flat[i] .. #flat[i + 1] .. ':' .. flat[i + 1])
  end
  table.sort(pairs_)
  for _, pair in ipairs(pairs_) do parts[#parts + 1] = pair end
  parts[#parts + 1] = '|'
end
stream(KEYS[2])
hash(KEYS[3])
stream(KEYS[4])
hash(KEYS[5])
for _, member in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do add(member) end
if redis.sha1hex(table.concat(parts)) ~= ARGV[2] then return {'changed', status} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[7], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[7], ARGV[1])
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return {'ok'}
