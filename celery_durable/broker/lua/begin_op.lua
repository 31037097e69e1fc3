-- Runs before every call a workflow makes: flushes its buffered progress
-- records (dropping those an earlier replay already wrote) and, for a step,
-- shows the step as running.
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] journal, KEYS[4] running steps,
-- KEYS[5] progress phase index
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] events channel, ARGV[4] sequence,
-- ARGV[5] '' or "<op index>:<position>": this op re-runs a failure of an
-- older attempt, so what that attempt journaled after it is abandoned and
-- progress from <position> on is new (see cut_sequence),
-- ARGV[6] step key or '', ARGV[7] step row or '', ARGV[8] record count,
-- then per record: position, kind, phase id, message
-- Returns {'ok', cancel, pause, outcome}: outcome is the step's live
-- journaled outcome when another sequence (or an attempt that died before
-- recording this op) already journaled the key, else ''. Or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
if ARGV[5] ~= '' then
  local colon = string.find(ARGV[5], ':', 1, true)
  cut_sequence(KEYS[3], ARGV[4], string.sub(ARGV[5], 1, colon - 1), ARGV[1], string.sub(ARGV[5], colon + 1))
end
local hwm_field = 'h:' .. ARGV[4]
local hwm = tonumber(redis.call('HGET', KEYS[3], hwm_field) or '-1')
local start = hwm
local wrote = false
local count = tonumber(ARGV[8])
for i = 0, count - 1 do
  local base = 9 + i * 4
  local pos = tonumber(ARGV[base])
  if pos > hwm then
    local kind, phase_id, message = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
    append_progress(KEYS[1], KEYS[2], kind, phase_id, message, ARGV[1], ARGV[2], KEYS[5])
    if kind == 'phase' then
      local previous = redis.call('HGET', KEYS[1], 'phase_id')
      if previous and previous ~= '' and previous ~= phase_id then
        redis.call('HSET', KEYS[1], 'pe:' .. previous, ARGV[2])
      end
      redis.call('HSET', KEYS[1], 'phase', message, 'phase_id', phase_id)
      redis.call('HSETNX', KEYS[1], 'ps:' .. phase_id, ARGV[2])
    end
    hwm = pos
    wrote = true
  end
end
if hwm ~= start then redis.call('HSET', KEYS[3], hwm_field, hwm) end
local outcome = ''
if ARGV[6] ~= '' then
  local current = redis.call('HGET', KEYS[3], 'v:' .. ARGV[6])
  if current and not is_stale_failure(current, ARGV[1]) then outcome = current end
end
if ARGV[6] ~= '' and outcome == '' then
  if redis.call('HSET', KEYS[4], ARGV[6], ARGV[7]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'steps_running', 1)
  end
end
if wrote then
  redis.call('PUBLISH', ARGV[3], redis.call('HGET', KEYS[1], 'id') .. ' progress')
end
check_limits(KEYS[1], tonumber(ARGV[2]))
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3], outcome}
