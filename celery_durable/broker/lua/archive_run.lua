-- Folds a run settled for good (completed or cancelled: it can never be
-- resumed, SPEC §8) into its archive: one string, built by the caller from
-- the keys it read (schema/archive.py; Lua has no zlib), kept as long as the
-- run hash, and the keys it was built from deleted. Such a run is never
-- written again (the fence, and each other writer's own refusal), so the
-- keys are what the caller read; written only if the run is still settled
-- so and the keys still have the shape the caller read (schema.archive.shape:
-- each stream's length and last id, each hash's length), so a write the
-- rules missed leaves the run unarchived, never archived stale. An
-- optimisation: a run never archived (its caller died first, or it settled
-- before archives) reads the same.
-- KEYS[1] run hash, KEYS[2] history, KEYS[3] steps, KEYS[4] progress
-- stream, KEYS[5] journal, KEYS[6] progress phase index, KEYS[7] archive
-- ARGV[1] the archive, ARGV[2..8] the shape of the keys it was built from:
-- history length, its last id, steps length, progress length, its last id,
-- journal length, phase index length
-- Returns {'ok'}, {'archived'} (it was already), {'changed', status} (not
-- completed or cancelled, or its keys are not what was read) or {'missing'}.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if not ARCHIVABLE[status] then return {'changed', status} end
if redis.call('EXISTS', KEYS[7]) == 1 then return {'archived'} end
local function last_id(key)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  return last and last[1] or ''
end
local now = {tostring(redis.call('XLEN', KEYS[2])), last_id(KEYS[2]), tostring(redis.call('HLEN', KEYS[3])),
  tostring(redis.call('XLEN', KEYS[4])), last_id(KEYS[4]), tostring(redis.call('HLEN', KEYS[5])),
  tostring(redis.call('ZCARD', KEYS[6]))}
for i = 1, #now do
  if now[i] ~= ARGV[i + 1] then return {'changed', status} end
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[7], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[7], ARGV[1])
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return {'ok'}
