-- Starts the retention clock of a run that has settled for good or for now
-- (completed, cancelled, error, halted; not paused): every key of the run
-- expires after settings.run_retention_seconds. The only way back from these
-- statuses to work is resume.lua, which persists the keys again in the same
-- script as the epoch bump, so a resumed run never carries a TTL.
-- KEYS[1] run hash, KEYS[2..] every other key of the run
-- ARGV[1] retention (ms)
-- Returns {namespace, idempotency key or ''} when the clock started, else {}.
local f = redis.call('HMGET', KEYS[1], 'status', 'namespace', 'idempotency_key')
local status = f[1]
if status ~= 'completed' and status ~= 'cancelled' and status ~= 'error' and status ~= 'halted' then
  return {}
end
for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
return {f[2] or '', f[3] or ''}
