-- A child run ended (completed, error or cancelled): its end is journaled in
-- its parent under the child's key, and the sequence waiting for it is
-- woken. Run for the child's settling (and again by the sweep, should the
-- worker die first), or by the parent itself when it finds the child already
-- ended; each journals the same end, and the first write wins. A failure is
-- tagged with the parent's epoch (a later attempt looks at the child again).
-- A child whose call timed out (child.lua marked its entry 'timed_out' at
-- the op that waits for it) is ended by the parent alone: its settling's
-- end is late and journals nothing, so an attempt that takes over from one
-- that died inside the time-out ends the call by the time-out as the first
-- did, never by the cancelled child's end.
-- KEYS[1] run hash (the parent's), KEYS[2] journal, KEYS[3] waits, KEYS[4]
-- live, KEYS[5] children, KEYS[6] history
-- ARGV[1] now (ms), ARGV[2] key, ARGV[3] the child's run id, ARGV[4] outcome
-- tag ('o' a value, 'e' a failure), ARGV[5] its payload
-- (schema.outcome_payload), ARGV[6] prefix of the task id that wakes the
-- waiter ("<prefix>-1"), or '' when the caller is the waiter itself and goes
-- on, ARGV[7] the epoch the caller runs as ('' for a child's settling, which
-- tells whichever attempt of the parent runs), ARGV[8] events channel,
-- ARGV[9] the child's status (for the history's child_settled)
-- Returns {'ok', epoch, workflow, outcome, throttled, owner?} (the parent's
-- workflow; throttled '1' when an op of the parent ever asked a throttle for
-- a slot, so that the caller looks for one to give back, else '0'; the owner
-- to wake, when a wait was ended and a prefix given), {'late',
-- epoch, workflow, outcome} (the key has a live
-- outcome already), {'detached'} (ctx.start_child's: nothing waits for it),
-- {'unknown'} (no such child of this run) or {refusal}: 'missing', 'stale'
-- (not the caller's epoch), 'settled'. Run again with the same prefix (its
-- reply lost): the same reply, nothing journaled or counted twice.
local f = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'id', 'workflow', 'throttled')
if not f[1] then return {'missing'} end
if ARGV[7] ~= '' and f[1] ~= ARGV[7] then return {'stale'} end
if f[2] ~= 'running' and f[2] ~= 'pending' and f[2] ~= 'paused' then return {'settled'} end
local epoch, key, now = f[1], ARGV[2], tonumber(ARGV[1])
local throttled = throttled_flag(f[5])
if ARGV[6] ~= '' then
  local before = woken_before(KEYS[2], ARGV[6])
  if before then
    local journaled = redis.call('HGET', KEYS[2], 'v:' .. key) or ''
    local again = {'ok', epoch, f[4], journaled, throttled}
    for owner in string.gmatch(before, '%S+') do table.insert(again, owner) end
    return again
  end
end
local raw = redis.call('HGET', KEYS[5], key)
if not raw then return {'unknown'} end
local ok, entry = pcall(cjson.decode, raw)
if not ok or type(entry) ~= 'table' or entry['run_id'] ~= ARGV[3] then return {'unknown'} end
if entry['mode'] ~= 'wait' then return {'detached'} end
local current = redis.call('HGET', KEYS[2], 'v:' .. key)
if current and not is_stale_failure(current, epoch) then return {'late', epoch, f[4], current} end
-- A cancelled pass stepped over the wait for it (step_over.lua): its end is late.
if redis.call('HEXISTS', KEYS[2], 'so:v:' .. key) == 1 then return {'late', epoch, f[4], ''} end
-- Its call timed out: the parent ends it (child.lua answers 'due'), not the child's settling.
if ARGV[7] == '' and entry['timed_out'] ~= nil and entry['timed_out'] == entry['at'] then
  return {'late', epoch, f[4], ''}
end
local outcome
if ARGV[4] == 'o' then outcome = 'o' .. ARGV[5] else outcome = ARGV[4] .. epoch .. '|' .. ARGV[5] end
redis.call('HSET', KEYS[2], 'v:' .. key, outcome)
if journals_new(current, outcome) then made_progress(KEYS[1]) end
record_event(KEYS[1], KEYS[6], 'child_settled', key, ARGV[1], cjson.encode({
  op = type(entry['at']) == 'string' and entry['at'] or '', run_id = ARGV[3], workflow = entry['workflow'],
  waited = true, status = ARGV[9] or ''}))
local out = {'ok', epoch, f[4], outcome, throttled}
local at = type(entry['at']) == 'string' and entry['at'] or ''
local wait_raw = at ~= '' and redis.call('HGET', KEYS[3], at) or nil
if wait_raw then
  local parsed, wait = pcall(cjson.decode, wait_raw)
  if parsed and type(wait) == 'table' and wait['kind'] == 'child' and wait['name'] == ARGV[3] then
    end_child_wait(KEYS[1], KEYS[3], at, ARGV[3])
    if ARGV[6] ~= '' then
      local owner = tostring(wait['owner'])
      token_queued(KEYS[1], KEYS[4], ARGV[6] .. '-1', owner_kind(owner), now, now)
      table.insert(out, owner)
    end
  end
end
if ARGV[6] ~= '' then remember_woken(KEYS[2], ARGV[6], out[6] or '') end
redis.call('PUBLISH', ARGV[8], f[3] .. ' progress')
return out
