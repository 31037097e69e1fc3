-- Looks at one run for the recovery sweep, or for a resume deciding whether
-- the attempt is alive: its status and its liveness (see _prelude.lua).
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] waits
-- ARGV[1] now (ms), ARGV[2] lease ttl (ms), ARGV[3] when each queue was last
-- found empty ("c=<ms>,s=<ms>,a=<ms>")
-- Returns {status, epoch, verdict, detail}: verdict 'alive' or 'waiting'
-- with the ms to look again ('' for never by itself), or 'dead' with why;
-- verdict '' for a run that is not pending or running; {} when the run
-- does not exist.
local f = redis.call('HMGET', KEYS[1], 'status', 'epoch')
if not f[1] then return {} end
if f[1] ~= 'pending' and f[1] ~= 'running' then return {f[1], f[2], '', ''} end
local verdict, detail = liveness(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]),
  parse_empty(ARGV[3]))
return {f[1], f[2], verdict, tostring(detail)}
