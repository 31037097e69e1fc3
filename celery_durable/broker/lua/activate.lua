-- Takes the activation lock of a run for one coordinator pass, and marks the
-- pass's message running (see liveness in _prelude.lua).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] live, KEYS[4] journal
-- (only with ARGV[8])
-- ARGV[1] epoch, ARGV[2] lock token (the pass's task id), ARGV[3] now (ms),
-- ARGV[4] lock ttl (ms), ARGV[5] lease ttl (ms), ARGV[6] events channel,
-- ARGV[7] task id of the message that comes back if the lock is busy,
-- ARGV[8] a sequence whose tail to read once the lock is taken (optional:
-- the body a worker kept parked checks it is still current, without a
-- round trip of its own), ARGV[9] the index that tail starts at
-- Returns {'ok', cancel, pause, limit} followed, with ARGV[8], by that tail
-- as sequence_reply gives it; {'busy', ms until that message is due}
-- (another pass holds the lock: it is told to run once more, and this one
-- looks again when the lock would have expired); or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local now = tonumber(ARGV[3])
if redis.call('HGET', KEYS[1], 'status') == 'paused' then return {'settled'} end
local lock = redis.call('HMGET', KEYS[1], 'lock', 'lock_until')
if lock[1] and lock[1] ~= '' and lock[1] ~= ARGV[2] and tonumber(lock[2] or '0') > now then
  redis.call('HSET', KEYS[1], 'wake', '1')
  local wait = tonumber(lock[2]) - now + 100
  token_done(KEYS[1], KEYS[3], ARGV[2], now)
  token_queued(KEYS[1], KEYS[3], ARGV[7], 'c', now + wait, now)
  return {'busy', wait}
end
redis.call('HSET', KEYS[1], 'lock', ARGV[2], 'lock_until', now + tonumber(ARGV[4]), 'wake', '0')
if redis.call('HGET', KEYS[1], 'status') == 'pending' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[3], 'updated_at', ARGV[3],
    'active_since', '')
  local attempt = redis.call('HGET', KEYS[1], 'attempt') or '1'
  append_progress(KEYS[1], KEYS[2], 'system', '', 'Attempt ' .. attempt .. ' started', ARGV[1], ARGV[3])
  local run_id = redis.call('HGET', KEYS[1], 'id')
  redis.call('PUBLISH', ARGV[6], run_id .. ' status')
  clock_start(KEYS[1], now)
  redis.call('PERSIST', KEYS[1])  -- see create_run.lua
  redis.call('PERSIST', KEYS[3])
end
token_running(KEYS[1], KEYS[3], ARGV[2], now + tonumber(ARGV[5]), now)
local f = flags(KEYS[1])
local reply = {'ok', f[1], f[2], f[3]}
if ARGV[8] and ARGV[8] ~= '' then
  for _, item in ipairs(sequence_reply(KEYS[4], ARGV[8], ARGV[9])) do table.insert(reply, item) end
end
return reply
