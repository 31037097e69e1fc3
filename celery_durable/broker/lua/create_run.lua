-- Creates a run record, refusing to overwrite one, with its first
-- coordinator message counted as queued (liveness in _prelude.lua).
-- Listing the run in its namespace is another script (another slot): until
-- the run is first activated its keys carry the retention TTL, so a start
-- that dies in between leaves nothing behind for good (activate.lua
-- persists them).
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] task id of the first coordinator message, ARGV[2] now (ms),
-- ARGV[3] retention (ms, 0 for none), ARGV[4..] field, value, field, value, ...
-- Returns 1 when the run was created, 0 when its record exists already.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('HSET', KEYS[1], 'incarnation', server_incarnation(), 'attempt', '1')
redis.call('DEL', KEYS[2])
token_queued(KEYS[1], KEYS[2], ARGV[1], 'c', ARGV[2], ARGV[2])
if tonumber(ARGV[3]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
