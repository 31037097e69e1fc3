-- Takes the activation lock of a run for one coordinator pass.
-- KEYS[1] run hash, KEYS[2] progress stream
-- ARGV[1] epoch, ARGV[2] lock token, ARGV[3] now (ms), ARGV[4] lock ttl (ms),
-- ARGV[5] lease ttl (ms), ARGV[6] events channel
-- Returns {'ok', cancel, pause}, {'busy', ms the lock has left} (another pass
-- holds the lock: it is told to run once more), or {refusal} from fence().
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local now = tonumber(ARGV[3])
if redis.call('HGET', KEYS[1], 'status') == 'paused' then return {'settled'} end
local lock = redis.call('HMGET', KEYS[1], 'lock', 'lock_until')
if lock[1] and lock[1] ~= '' and lock[1] ~= ARGV[2] and tonumber(lock[2] or '0') > now then
  redis.call('HSET', KEYS[1], 'wake', '1')
  return {'busy', tonumber(lock[2]) - now}
end
redis.call('HSET', KEYS[1], 'lock', ARGV[2], 'lock_until', now + tonumber(ARGV[4]),
  'lease_until', now + lease_ms(KEYS[1], ARGV[5]), 'wake', '0')
if redis.call('HGET', KEYS[1], 'status') == 'pending' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[3], 'updated_at', ARGV[3],
    'active_since', ARGV[3])
  local attempt = redis.call('HGET', KEYS[1], 'attempt') or '1'
  append_progress(KEYS[1], KEYS[2], 'system', '', 'Attempt ' .. attempt .. ' started', ARGV[1], ARGV[3])
  local run_id = redis.call('HGET', KEYS[1], 'id')
  redis.call('PUBLISH', ARGV[6], run_id .. ' status')
end
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3]}
