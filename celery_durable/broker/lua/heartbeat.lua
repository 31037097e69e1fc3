-- Keeps a running task's message alive (and, for a coordinator pass, its
-- lock), and checks the run's ceilings. A ceiling newly reached wakes the
-- coordinator, so a run whose only live code never calls the context (a
-- branch spinning in a loop) still settles.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch, ARGV[2] the task's id, ARGV[3] now (ms),
-- ARGV[4] lock ttl (ms), ARGV[5] lease ttl (ms), ARGV[6] task id of a
-- coordinator message to send if a ceiling was newly reached, ARGV[7] '1'
-- when the task is a coordinator pass (it may hold the lock)
-- Returns {'ok', cancel, pause, limit, wake (0/1)} or {refusal}.
local now = tonumber(ARGV[3])
-- Only a task still in flight is renewed: a run that settled (a pause) or
-- was taken over cleared the entries, and they must not come back.
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then
  token_running(KEYS[1], KEYS[2], ARGV[2], now + tonumber(ARGV[5]), now)
end
if ARGV[7] == '1' and redis.call('HGET', KEYS[1], 'lock') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'lock_until', now + tonumber(ARGV[4]))
end
local before = redis.call('HGET', KEYS[1], 'limit') or ''
local reached = check_limits(KEYS[1], now)
local wake = 0
if before == '' and reached ~= '' and ARGV[6] ~= '' and ARGV[7] ~= '1' then
  token_queued(KEYS[1], KEYS[2], ARGV[6], 'c', now, now)
  wake = 1
end
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3], wake}
