-- Looks at one run for the recovery sweep, or for a resume deciding whether
-- the attempt is alive: its status and its liveness (see _prelude.lua). For
-- the sweep it also fires the run's timers that are due: each is journaled
-- as ended (fire_timer), and their owners get a message each, which the
-- sweeper sends; a signal's wait whose time-out passed is woken alone (its
-- owner's wait.lua takes a signal that came by its time-out first).
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] waits, KEYS[4] journal, KEYS[5] history
-- ARGV[1] now (ms), ARGV[2] lease ttl (ms), ARGV[3] when each queue was last
-- found empty ("c=<ms>,s=<ms>,a=<ms>"), ARGV[4] '1' to fire due timers,
-- ARGV[5] prefix of the task ids that wake their owners ("<prefix>-<n>"),
-- ARGV[6] '1' when automatic recovery is off: a coordinator message lost
-- before it started, or lacking for a cancel or a pause (liveness's 'lost'),
-- is no death of the attempt, whose work is all in the run's records; the
-- main body is woken again at this epoch, one more owner to wake, in place of
-- the lost message, and the run is judged again (halting it would stop a
-- healthy run for a message its caller never sent)
-- Returns {status, epoch, workflow, verdict, detail, owner, owner, ...}: verdict
-- 'alive' or 'waiting' with the ms to look again ('' for never by itself),
-- or 'dead' with why; verdict '' for a run that is not pending or running;
-- then the owners to wake. {} when the run does not exist.
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'workflow')
if not f[1] then return {} end
if f[1] ~= 'pending' and f[1] ~= 'running' then return {f[1], f[2], f[3] or '', '', ''} end
local now = tonumber(ARGV[1])
local woken = {}
if ARGV[4] == '1' and f[1] == 'running' then
  woken = wake_waits(KEYS[1], KEYS[3], KEYS[2], ARGV[5], now, function(wait, at)
    if type(wait['until']) ~= 'number' or wait['until'] > now then return false end
    if wait['kind'] == 'timer' then fire_timer(KEYS[1], KEYS[4], KEYS[5], at, wait['until'], ARGV[1]) end
    return true
  end)
end
local spare = ARGV[6] == '1' and ARGV[5] ~= ''
local verdict, detail = liveness(KEYS[1], KEYS[2], KEYS[3], now, tonumber(ARGV[2]), parse_empty(ARGV[3]), spare)
-- Each turn takes a lost message out, or (none lost) wakes the main body,
-- which is then in flight; bounded all the same, as a script that loops
-- would stop the whole Redis.
for _ = 1, 64 do
  if verdict ~= 'lost' then break end
  if detail ~= '' then redis.call('HDEL', KEYS[2], detail) end
  local main = false
  for _, owner in ipairs(woken) do main = main or owner == 'm' end
  if not main then
    table.insert(woken, 'm')
    token_queued(KEYS[1], KEYS[2], ARGV[5] .. '-' .. #woken, 'c', now, now)
  end
  verdict, detail = liveness(KEYS[1], KEYS[2], KEYS[3], now, tonumber(ARGV[2]), parse_empty(ARGV[3]), spare)
end
if verdict == 'lost' then verdict, detail = 'dead', 'its lost messages could not all be replaced' end
local out = {f[1], f[2], f[3] or '', verdict, tostring(detail)}
for _, owner in ipairs(woken) do table.insert(out, owner) end
return out
