-- A sequence reaches a durable wait (ctx.sleep, ctx.wait_for_signal): the op
-- is journaled, its due time fixed the first time it is reached, and the
-- wait ends now (a signal that already arrived, a due time that passed) or
-- is registered for its owner to be woken (see _prelude.lua).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] waits, KEYS[4] signals, KEYS[5] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity ("z|" or "g|<name>"), ARGV[6] kind ('timer' or
-- 'signal'), ARGV[7] name, ARGV[8] due (ms) or '' for none, ARGV[9] owner,
-- ARGV[10] events channel
-- Returns {'done', cancel, pause, limit, outcome json}, {'wait', cancel,
-- pause, limit, due or ''}, {'conflict', identity} or {refusal}.
-- History: timer_set when a timer's due time is fixed, timer_fired when it
-- fires, wait_started the first time the wait is registered (not for a
-- wait that ends as it is reached: a signal already there). A timer the
-- sweep found due was journaled as fired there (fire_timer, examine.lua):
-- its owner's replay usually finds it so and never comes here for it.
local conflict, replaced = record_op(KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[1])
if conflict then return {'conflict', conflict} end
local at = ARGV[3] .. ':' .. ARGV[4]
local outcome_field, due_field = 'x:' .. at, 'wd:' .. at
-- What an abandoned op left at this index is not this wait's.
if replaced then redis.call('HDEL', KEYS[2], outcome_field, due_field, 'wt:' .. at, 'wf:' .. at) end
local f
local done = redis.call('HGET', KEYS[2], outcome_field)
if done then
  f = flags(KEYS[1])
  return {'done', f[1], f[2], f[3], done}
end
local due = redis.call('HGET', KEYS[2], due_field)
local first = not due
local timer = ARGV[6] == 'timer'
if first then
  due = ARGV[8]
  -- When the wait was set (timeline and waiting_for's since).
  redis.call('HSET', KEYS[2], due_field, due, 'wt:' .. at, ARGV[2])
  if timer then
    record_event(KEYS[1], KEYS[5], 'timer_set', at, ARGV[2], cjson.encode({op = at, ['until'] = tonumber(due)}))
  end
end
local now = tonumber(ARGV[2])
local outcome = nil
if ARGV[6] == 'signal' then
  outcome = take_signal(KEYS[2], KEYS[4], ARGV[7], at, (not first) and tonumber(due) or nil)
end
if not outcome and due ~= '' and now >= tonumber(due) then
  if ARGV[6] == 'signal' then outcome = '{"received":false,"payload":null}' else outcome = TIMER_FIRED end
end
if outcome then
  redis.call('HSET', KEYS[2], outcome_field, outcome, 'wf:' .. at, ARGV[2])
  if timer then
    record_event(KEYS[1], KEYS[5], 'timer_fired', at, ARGV[2], cjson.encode({op = at, ['until'] = tonumber(due)}))
  elseif string.sub(outcome, 1, 17) == '{"received":false' then
    -- A signal wait whose timeout passed first ends in the history too (its
    -- key the signal's name, as wait_started's; a signal taken is signal_received).
    record_event(KEYS[1], KEYS[5], 'signal_timed_out', ARGV[7], ARGV[2],
      cjson.encode({op = at, ['until'] = tonumber(due)}))
  end
  if redis.call('HDEL', KEYS[3], at) == 1 then refresh_waiting(KEYS[1], KEYS[3]) end
  made_progress(KEYS[1])
  f = flags(KEYS[1])
  return {'done', f[1], f[2], f[3], outcome}
end
local entry = {owner = ARGV[9], kind = ARGV[6], name = ARGV[7]}
if due ~= '' then entry['until'] = tonumber(due) end
redis.call('HSET', KEYS[3], at, cjson.encode(entry))
if first then
  local started = {kind = ARGV[6], name = ARGV[7], op = at}
  if due ~= '' then started['until'] = tonumber(due) end
  record_event(KEYS[1], KEYS[5], 'wait_started', timer and at or ARGV[7], ARGV[2], cjson.encode(started))
end
refresh_waiting(KEYS[1], KEYS[3])
redis.call('PUBLISH', ARGV[10], run_field(KEYS[1], 'id') .. ' waiting')
f = flags(KEYS[1])
return {'wait', f[1], f[2], f[3], due}
