-- A workflow asks for an agent turn: journals the op in its sequence and
-- returns the memoized outcome, or registers the caller as waiting for a
-- turn already in flight, or dispatches a new turn (within the ceilings).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] agent rows, KEYS[4] live
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] sequence, ARGV[4] op index,
-- ARGV[5] op identity "a|<agent id>", ARGV[6] agent id, ARGV[7] request
-- json, ARGV[8] owner to wake ("m" or "<call>/<branch>"), ARGV[9] queued row
-- json, ARGV[10] '' or "<op index>:<position>" when this op re-runs an older
-- attempt's failed turn (see cut_sequence), ARGV[11] task id of the agent
-- message sent on 'dispatch'
-- Returns {'hit', cancel, pause, limit, outcome}, {'pending', ...flags},
-- {'dispatch', ...flags}, {'limit', ...flags}, {'conflict', identity} or
-- {refusal}.
if ARGV[10] ~= '' then
  local colon = string.find(ARGV[10], ':', 1, true)
  cut_sequence(KEYS[2], ARGV[3], string.sub(ARGV[10], 1, colon - 1), ARGV[1], string.sub(ARGV[10], colon + 1))
end
local conflict = record_op(KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[1])
if conflict then return {'conflict', conflict} end
local id = ARGV[6]
local outcome = redis.call('HGET', KEYS[2], 'a:' .. id)
local f
if outcome and not is_stale_failure(outcome, ARGV[1]) then
  f = flags(KEYS[1])
  return {'hit', f[1], f[2], f[3], outcome}
end
-- This very call again, its reply lost: it dispatched the turn, whose message
-- the caller has still to send.
local sent = redis.call('HGET', KEYS[4], ARGV[11])
if sent and string.sub(sent, 1, 4) == 'q|a|' and redis.call('HGET', KEYS[2], 'qe:' .. id) == ARGV[1] then
  f = flags(KEYS[1])
  return {'dispatch', f[1], f[2], f[3]}
end
-- Someone already asked for this turn in this attempt: wait for it too.
if redis.call('HGET', KEYS[2], 'qe:' .. id) == ARGV[1] then
  local waiters = redis.call('HGET', KEYS[2], 'w:' .. id) or ''
  if not string.find(' ' .. waiters .. ' ', ' ' .. ARGV[8] .. ' ', 1, true) then
    redis.call('HSET', KEYS[2], 'w:' .. id, waiters .. ' ' .. ARGV[8])
  end
  f = flags(KEYS[1])
  return {'pending', f[1], f[2], f[3]}
end
-- A turn an earlier attempt dispatched that never ended (its attempt died
-- with it queued or running) was counted against max_total_subagents then:
-- dispatched again it is not counted twice, so a resume with a higher ceiling
-- gets past the turns its last attempt left queued. A failed turn run again is.
local counted = not outcome and redis.call('HEXISTS', KEYS[2], 'q:' .. id) == 1
local now = tonumber(ARGV[2])
local reached = check_limits(KEYS[1], now)
if reached == '' and not counted then
  local lim = redis.call('HMGET', KEYS[1], 'lim_total', 'subagents_used')
  if lim[1] and lim[1] ~= '' and tonumber(lim[2] or '0') >= tonumber(lim[1]) then
    reached = 'max_total_subagents'
    redis.call('HSET', KEYS[1], 'limit', reached)
  end
end
if reached ~= '' then
  f = flags(KEYS[1])
  return {'limit', f[1], f[2], f[3]}
end
redis.call('HSET', KEYS[2], 'q:' .. id, ARGV[7], 'qe:' .. id, ARGV[1], 'w:' .. id, ARGV[8])
if not counted then redis.call('HINCRBY', KEYS[1], 'subagents_used', 1) end
-- One row per turn and attempt: a turn interrupted with its attempt keeps its row.
redis.call('HSET', KEYS[3], id .. '@' .. ARGV[1], ARGV[9])
token_queued(KEYS[1], KEYS[4], ARGV[11], 'a', now, now)
f = flags(KEYS[1])
return {'dispatch', f[1], f[2], f[3]}
