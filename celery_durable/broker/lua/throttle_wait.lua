-- After a throttle queued a holder of this run: the owner waits for its
-- slot holding no worker (a wait of kind 'throttle' at "t:<op>", shown in
-- snapshot.waiting_for), unless the slot was given meanwhile. For the run's
-- own slot (op 'run') the pass's message ends here: the run waits pending.
-- History: wait_started (data kind 'throttle', name the throttle, until
-- None) when the wait is registered, once: a pass that finds it already
-- there (woken before its slot came, or replayed) says nothing new. Its key
-- is the op's (the step, call, agent turn or child), none for the run's slot.
-- KEYS[1] run hash, KEYS[2] the run's throttle intents, KEYS[3] waits,
-- KEYS[4] live, KEYS[5] history
-- ARGV[1] epoch, ARGV[2] op, ARGV[3] owner, ARGV[4] throttle, ARGV[5] the
-- pass's message ('' for none), ARGV[6] now (ms)
-- Returns {'granted'} (the slot is this attempt's: go on), {'waiting'}, or
-- {refusal} (fence in _prelude.lua).
local op = ARGV[2]
if op == 'run' then
  local slot = redis.call('HGET', KEYS[1], 'slot')
  if slot == ARGV[1] then return {'granted'} end
else
  local current = redis.call('HGET', KEYS[2], op) or ''
  if string.sub(current, 1, #ARGV[1] + 3) == ARGV[1] .. '|g|' then return {'granted'} end
end
local entry = cjson.encode({owner = ARGV[3], kind = 'throttle', name = ARGV[4]})
if redis.call('HSET', KEYS[3], 't:' .. op, entry) == 1 then
  local key = op == 'run' and '' or (string.match(op, '^%a/(.*)$') or op)
  record_event(KEYS[1], KEYS[5], 'wait_started', key, ARGV[6], cjson.encode({kind = 'throttle', name = ARGV[4], op = op}))
end
refresh_waiting(KEYS[1], KEYS[3])
token_done(KEYS[1], KEYS[4], ARGV[5], tonumber(ARGV[6]))
return {'waiting'}
