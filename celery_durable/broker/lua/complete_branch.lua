-- Journals the outcome of one branch and says whether the coordinator must
-- be woken: when it was the last outstanding branch, or a fatal one.
-- KEYS[1] run hash, KEYS[2] journal
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>"), ARGV[3] branch index,
-- ARGV[4] outcome ("o<json>", "e<epoch>|<json>" or "f<epoch>|<json>")
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
  return {'ok', left <= 0 and 1 or 0}
end
redis.call('HSET', KEYS[2], field, ARGV[4])
made_progress(KEYS[1])
local left = redis.call('HINCRBY', KEYS[2], counter, -1)
local fatal = string.sub(ARGV[4], 1, 1) == 'f'
return {'ok', (left <= 0 or fatal) and 1 or 0}
