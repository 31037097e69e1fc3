-- Delivers a signal to a run: kept in the run's signals hash (in arrival
-- order, whatever the run is doing now), and taken here for a wait of its
-- name (the first the waits hash lists) as that wait's wait.lua would take
-- it (signal_wait): a wait that takes one ends, and its owner is woken; a
-- wait left with none waits on. A run that can no longer continue refuses it.
-- KEYS[1] run hash, KEYS[2] signals, KEYS[3] waits, KEYS[4] live,
-- KEYS[5] progress stream, KEYS[6] history, KEYS[7] journal
-- ARGV[1] now (ms), ARGV[2] name, ARGV[3] payload json, ARGV[4] prefix of
-- the task ids that wake the waiters ("<prefix>-<n>"), ARGV[5] events channel
-- Returns {'ok', epoch, owner, owner, ...} (the owners to wake, in the order
-- of their messages), {'refused', status} or {'missing'}.
local f = redis.call('HMGET', KEYS[1], 'status', 'can_resume', 'epoch', 'id')
if not f[1] then return {'missing'} end
local status = f[1]
if ARCHIVABLE[status] or (status == 'error' and f[2] ~= '1') then
  return {'refused', status}
end
local name, now = ARGV[2], tonumber(ARGV[1])
local n = redis.call('HINCRBY', KEYS[2], 'n:' .. name, 1)
redis.call('HSET', KEYS[2], 'p:' .. name .. ':' .. n, ARGV[3], 't:' .. name .. ':' .. n, ARGV[1])
-- A settled run (halted, paused, a resumable error) already counts down its
-- retention: the signals it keeps go with it.
local ttl = redis.call('PTTL', KEYS[1])
-- The signal is its history's event (its payload read for the page that shows it).
record_event(KEYS[1], KEYS[6], 'signal_received', name, ARGV[1], cjson.encode({index = n}))
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[6], ttl)
end
append_progress(KEYS[1], KEYS[5], 'system', '', 'Signal ' .. name .. ' received', f[3], ARGV[1], nil, false)
local owners = {}
if status == 'running' or status == 'pending' then
  owners = wake_waits(KEYS[1], KEYS[3], KEYS[4], ARGV[4], now, function(wait, at)
    if wait['kind'] ~= 'signal' or wait['name'] ~= name then return false end
    return signal_wait(KEYS[1], KEYS[7], KEYS[2], name, at, ARGV[1]) ~= false
  end)
end
redis.call('PUBLISH', ARGV[5], f[4] .. ' signal')
local out = {'ok', f[3]}
for _, owner in ipairs(owners) do table.insert(out, owner) end
return out
