-- Writes a schedule's specification: creates it, or changes it (update, or
-- a create with replace=True, which keeps its paused state unless told,
-- its firing state and its recent actions). A change bumps its rev, so a
-- sweeper firing it under the old specification records nothing
-- (schedule_record.lua) and its claim is replaced by the new next tick.
-- KEYS[1] the schedule hash, KEYS[2] the schedules' due zset, KEYS[3] the
-- namespace's schedule ids
-- ARGV[1] 'create' (refused when it exists) or 'update' (refused when it is
-- missing, or its rev is not ARGV[6]), ARGV[2] its due member, ARGV[3] its
-- id, ARGV[4] now (ms), ARGV[5] its next tick (ms, '' for none), ARGV[6] the
-- rev the caller read ('' for a create), ARGV[7] paused: '1', '0', or '' to
-- keep it, ARGV[8..] field, value pairs of its specification
-- Returns {'ok', rev} | {'exists'} | {'missing'} | {'conflict'}
local exists = redis.call('EXISTS', KEYS[1]) == 1
if ARGV[1] == 'create' then
  if exists then return {'exists'} end
  redis.call('HSET', KEYS[1], 'created_at', ARGV[4], 'paused', '0', 'rev', '0')
else
  if not exists then return {'missing'} end
  local rev_read = redis.call('HGET', KEYS[1], 'rev')
  if rev_read ~= ARGV[6] then return {'conflict'} end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'paused', ARGV[7]) end
local rev = redis.call('HINCRBY', KEYS[1], 'rev', 1)
redis.call('HSET', KEYS[1], 'updated_at', ARGV[4], 'next_ms', ARGV[5])
if redis.call('HGET', KEYS[1], 'paused') == '1' or ARGV[5] == '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
end
redis.call('ZADD', KEYS[3], 0, ARGV[3])
return {'ok', rev}
