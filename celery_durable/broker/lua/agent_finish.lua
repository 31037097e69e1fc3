-- Journals an agent turn's outcome, releases its slot, adds its usage to the
-- run, and returns who must be woken.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] agent rows, KEYS[4] live, KEYS[5] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] agent id, ARGV[4] outcome
-- ("o<json>" or "e<epoch>|<json>"), ARGV[5] final row json, ARGV[6] credits
-- in nano-credits, ARGV[7] prompt tokens, ARGV[8] completion tokens,
-- ARGV[9] the task's id, ARGV[10] prefix of the task ids that wake the
-- waiters (each "<prefix>-<n>", n counting the waiters from 1)
-- Returns {'ok', waiters ("m" and/or "<call>/<branch>", space separated),
-- throttled ('1' when an op of the run ever asked a throttle for a slot, so
-- that the caller looks for the turn's to give back, else '0')} or
-- {refusal}; run again with the same prefix (its reply was lost), the same
-- answer, and nothing counted twice (woken_before).
local throttled = throttled_flag(redis.call('HGET', KEYS[1], 'throttled'))
local before = woken_before(KEYS[2], ARGV[10])
if before then return {'ok', before, throttled} end
local id = ARGV[3]
local current = redis.call('HGET', KEYS[2], 'a:' .. id)
if not current or is_stale_failure(current, ARGV[1]) then
  redis.call('HSET', KEYS[2], 'a:' .. id, ARGV[4])
  if journals_new(current, ARGV[4]) then made_progress(KEYS[1]) end
  local kind = string.sub(ARGV[4], 1, 1) == 'o' and 'agent_completed' or 'agent_failed'
  record_event(KEYS[1], KEYS[5], kind, id, ARGV[2], ARGV[5])
end
local running = tonumber(redis.call('HGET', KEYS[1], 'agents_running') or '0')
if running > 0 then redis.call('HINCRBY', KEYS[1], 'agents_running', -1) end
redis.call('HINCRBY', KEYS[1], 'agents_done', 1)
redis.call('HINCRBY', KEYS[1], 'credits_nano', ARGV[6])
redis.call('HINCRBY', KEYS[1], 'prompt_tokens', ARGV[7])
redis.call('HINCRBY', KEYS[1], 'completion_tokens', ARGV[8])
redis.call('HSET', KEYS[3], id .. '@' .. ARGV[1], ARGV[5])
check_limits(KEYS[1], tonumber(ARGV[2]))
local waiters = redis.call('HGET', KEYS[2], 'w:' .. id) or ''
redis.call('HDEL', KEYS[2], 'q:' .. id, 'qe:' .. id, 'w:' .. id)
local n = 0
for owner in string.gmatch(waiters, '%S+') do
  n = n + 1
  token_queued(KEYS[1], KEYS[4], ARGV[10] .. '-' .. n, owner_kind(owner), ARGV[2], ARGV[2])
end
token_done(KEYS[1], KEYS[4], ARGV[9], ARGV[2])
remember_woken(KEYS[2], ARGV[10], waiters)
return {'ok', waiters, throttled}
