-- Journals the outcome of one branch and says whether the coordinator must
-- be woken: when it was the last outstanding branch, or a fatal one.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>"), ARGV[3] branch index,
-- ARGV[4] outcome ("o<json>", "e<epoch>|<json>" or "f<epoch>|<json>"),
-- ARGV[5] task id of the coordinator message sent on wake ('' for none),
-- ARGV[6] now (ms)
-- Returns {'ok', wake} or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local stamp = redis.call('HGET', KEYS[2], 'd:' .. ARGV[2]) or ''
if string.sub(stamp, 1, #ARGV[1] + 1) ~= ARGV[1] .. ':' then return {'stale'} end
local field = 'r:' .. ARGV[2] .. ':' .. ARGV[3]
local counter = 'c:' .. ARGV[2]
local current = redis.call('HGET', KEYS[2], field)
if current and not is_stale_failure(current, ARGV[1]) then
  -- A second delivery: wake again when everything is in, in case the first
  -- delivery died between journaling and waking the coordinator.
  local left = tonumber(redis.call('HGET', KEYS[2], counter) or '0')
  if left <= 0 then
    token_queued(KEYS[1], KEYS[3], ARGV[5], 'c', ARGV[6], ARGV[6])
    return {'ok', 1}
  end
  return {'ok', 0}
end
redis.call('HSET', KEYS[2], field, ARGV[4])
made_progress(KEYS[1])
local left = redis.call('HINCRBY', KEYS[2], counter, -1)
local fatal = string.sub(ARGV[4], 1, 1) == 'f'
if left <= 0 or fatal then
  token_queued(KEYS[1], KEYS[3], ARGV[5], 'c', ARGV[6], ARGV[6])
  return {'ok', 1}
end
return {'ok', 0}
