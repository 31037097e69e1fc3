-- A called task finished (its link or link_error reached an engine worker):
-- its outcome is journaled under the call's key, first write wins, by the
-- attempt that published it only (a stale attempt's result is refused), and
-- what waits for the call is woken.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] waits, KEYS[4] live,
-- KEYS[5] running steps, KEYS[6] steps, KEYS[7] history, KEYS[8] progress
-- stream (written only with ARGV[7])
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] key, ARGV[4] outcome
-- ("o<json>" or "e<epoch>|<json>"), ARGV[5] the step row's error ('' for a
-- result), ARGV[6] prefix of the task ids that wake the waiters ("<prefix>-<n>")
-- Optional, when the caller would run the main body's pass itself (it keeps
-- the body parked at this call): ARGV[7] that pass's lock token
-- ("<prefix>-1"), then activate.lua's ARGV[4] to ARGV[9] as ARGV[8] to
-- ARGV[13] (lock ttl, lease ttl, events channel, resend id, sequence, start),
-- ARGV[14] '1' when a pass of the run holds the lock in the caller's process
-- (activate_run's soft: a busy lock is left alone, the caller waits for it).
-- Returns {'ok', throttled, owner, owner, ...}; {'here', throttled, ...}
-- when ARGV[7] was given and the call woke the main body ('m') alone,
-- followed by what activate.lua returns ('ok' and the flags and tail, or
-- 'busy' and the ms): the lock is taken for the caller, or it was told to
-- look again; {'late'} (the call already has a live outcome) or {refusal}.
-- <throttled> is '1' when an op of the run ever asked a throttle for a slot
-- (throttle_enter.lua), else '0': only then can the call hold one to give
-- back. Run again with the same prefix (its reply was lost): {'ok',
-- throttled, the same owners}, and nothing journaled or counted twice.
local throttled = throttled_flag(redis.call('HGET', KEYS[1], 'throttled'))
local before = woken_before(KEYS[2], ARGV[6])
if before then
  -- The same answer again, its reply lost: the same owners, woken by message
  -- (a pass this script took for the caller re-enters its lock by its token).
  local again = {'ok', throttled}
  for owner in string.gmatch(before, '%S+') do table.insert(again, owner) end
  return again
end
local key = ARGV[3]
if redis.call('HGET', KEYS[2], 'ce:' .. key) ~= ARGV[1] then return {'stale'} end
local current = redis.call('HGET', KEYS[2], 'v:' .. key)
if current and not is_stale_failure(current, ARGV[1]) then return {'late'} end
-- A cancelled pass stepped over the call (step_over.lua): its answer is late.
if redis.call('HEXISTS', KEYS[2], 'so:v:' .. key) == 1 then return {'late'} end
redis.call('HSET', KEYS[2], 'v:' .. key, ARGV[4])
if journals_new(current, ARGV[4]) then made_progress(KEYS[1]) end
if string.sub(ARGV[4], 1, 1) == 'o' then redis.call('HINCRBY', KEYS[1], 'steps_done', 1) end
-- The running row call.lua wrote, settled (schema.StepRow).
local ok, row = pcall(cjson.decode, redis.call('HGET', KEYS[5], key) or '{}')
if not ok or type(row) ~= 'table' then row = {} end
local at = type(row['op']) == 'string' and row['op'] or ''
row['status'] = ARGV[5] == '' and 'completed' or 'failed'
row['finished_at'] = tonumber(ARGV[2])
if ARGV[5] ~= '' then row['error'] = ARGV[5] end
if redis.call('HDEL', KEYS[5], key) == 1 then redis.call('HINCRBY', KEYS[1], 'steps_running', -1) end
local text = cjson.encode(row)
redis.call('HSET', KEYS[6], key, text)
record_event(KEYS[1], KEYS[7], ARGV[5] == '' and 'call_completed' or 'call_failed', key, ARGV[2], text)
local function ours(wait)
  return wait['kind'] == 'call' and wait['name'] == key
end
-- The row says where the call waits ('op'): wake that wait without reading
-- every other (a fan-out of calls waits on thousands at once).
local owners = wake_call_wait(KEYS[1], KEYS[3], KEYS[4], ARGV[6], tonumber(ARGV[2]), at, ours)
if not owners then
  owners = wake_waits(KEYS[1], KEYS[3], KEYS[4], ARGV[6], tonumber(ARGV[2]), ours)
end
remember_woken(KEYS[2], ARGV[6], table.concat(owners, ' '))
if ARGV[7] and ARGV[7] ~= '' and #owners == 1 and owners[1] == 'm' then
  local activation = activate_run(KEYS[1], KEYS[8], KEYS[4], KEYS[2], ARGV[1], ARGV[7], ARGV[2], ARGV[8], ARGV[9],
    ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14], KEYS[7])
  if activation[1] ~= 'settled' and activation[1] ~= 'held' then
    local out = {'here', throttled}
    for _, item in ipairs(activation) do table.insert(out, item) end
    return out
  end
end
local out = {'ok', throttled}
for _, owner in ipairs(owners) do table.insert(out, owner) end
return out
