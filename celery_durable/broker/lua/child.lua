-- A sequence starts a child run (ctx.child, ctx.start_child): the op is
-- journaled under its key, as a step's, and the child is entered in the
-- run's children hash the first time (a key names one child: a later call
-- under the key that asks for another workflow gets the journaled child,
-- and a system progress record says so, once). A waited-for child's end is
-- journaled by child_done.lua; until then the op waits for it: a wait of
-- kind 'child', due at the call's time-out, fixed the first time it is
-- reached. Nothing of the child's own run is touched here (another slot).
-- The first 'due' marks the child's entry timed out at this op ('timed_out'
-- = the op's place): from then on the op never waits for the child again
-- (its due is fixed and past), so the child's end, told by its settling, is
-- not journaled (child_done.lua): the cancel that follows is the time-out's,
-- and every attempt that reaches the op ends it the same way, by the
-- time-out (or the child's result, had it completed first). An op that
-- replaces an abandoned one at the same place starts afresh: its due and
-- the mark are cleared.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] waits, KEYS[4] children,
-- KEYS[5] progress stream, KEYS[6] history
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity ("k|<key>" or "d|<key>"), ARGV[6] key, ARGV[7] owner,
-- ARGV[8] due (ms) or '', ARGV[9] '' or "<op index>:<position>" when this op
-- re-runs an older attempt's failure (see cut_sequence), ARGV[10] the
-- child's run id, ARGV[11] the workflow asked for, ARGV[12] 'wait'
-- (ctx.child) or 'start' (ctx.start_child), ARGV[13] events channel
-- Returns {verdict, cancel, pause, limit, the child's workflow, detail}:
-- 'start' (ctx.start_child: the child is entered), 'hit' (its end is
-- journaled: detail is the outcome), 'pending' (it waits: detail is the due
-- time or ''), 'due' (its time-out passed with no end journaled: the caller
-- cancels the child and journals the time-out); or {'conflict', identity}
-- or {refusal}.
local seq, index, key, now = ARGV[3], ARGV[4], ARGV[6], tonumber(ARGV[2])
local stop, at, replaced = enter_op(KEYS[2], ARGV[1], seq, index, ARGV[5], ARGV[9])
if stop then return stop end
local entry = nil
local raw = redis.call('HGET', KEYS[4], key)
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' then entry = decoded end
end
if not entry then
  entry = {run_id = ARGV[10], workflow = ARGV[11], mode = ARGV[12]}
  redis.call('HINCRBY', KEYS[1], 'children', 1)
  record_event(KEYS[1], KEYS[6], 'child_started', key, ARGV[2],
    cjson.encode({op = at, run_id = ARGV[10], workflow = ARGV[11], waited = ARGV[12] == 'wait'}))
elseif entry['workflow'] ~= ARGV[11] and entry['warned'] ~= ARGV[11] then
  entry['warned'] = ARGV[11]
  append_progress(KEYS[1], KEYS[5], 'system', '',
    'Child key ' .. key .. ' already names run ' .. tostring(entry['run_id']) .. ' of workflow ' ..
    tostring(entry['workflow']) .. ': that child is used, and workflow ' .. ARGV[11] .. ' is not started',
    ARGV[1], ARGV[2], nil, KEYS[6])
end
if ARGV[12] == 'wait' then
  entry['mode'] = 'wait'
  entry['at'] = at
end
if replaced and entry['timed_out'] == at then entry['timed_out'] = nil end
redis.call('HSET', KEYS[4], key, cjson.encode(entry))
local workflow = tostring(entry['workflow'])
local f = flags(KEYS[1])
if ARGV[12] ~= 'wait' then return {'start', f[1], f[2], f[3], workflow, ''} end
local outcome = redis.call('HGET', KEYS[2], 'v:' .. key)
if outcome and not is_stale_failure(outcome, ARGV[1]) then
  end_child_wait(KEYS[1], KEYS[3], at, tostring(entry['run_id']))
  return {'hit', f[1], f[2], f[3], workflow, outcome}
end
local due = redis.call('HGET', KEYS[2], 'wd:' .. at)
local first = not due
if first then
  due = ARGV[8]
  redis.call('HSET', KEYS[2], 'wd:' .. at, due)
end
if due ~= '' and now >= tonumber(due) then
  if entry['timed_out'] ~= at then
    entry['timed_out'] = at
    redis.call('HSET', KEYS[4], key, cjson.encode(entry))
  end
  return {'due', f[1], f[2], f[3], workflow, due}
end
local wait = {owner = ARGV[7], kind = 'child', name = entry['run_id']}
if due ~= '' then wait['until'] = tonumber(due) end
if redis.call('HSET', KEYS[3], at, cjson.encode(wait)) == 1 then summarize_child_wait(KEYS[1], wait) end
if first then
  local started = {kind = 'child', name = entry['run_id'], op = at, workflow = workflow}
  if due ~= '' then started['until'] = tonumber(due) end
  record_event(KEYS[1], KEYS[6], 'wait_started', key, ARGV[2], cjson.encode(started))
end
redis.call('PUBLISH', ARGV[13], run_field(KEYS[1], 'id') .. ' waiting')
return {'pending', f[1], f[2], f[3], workflow, due}
