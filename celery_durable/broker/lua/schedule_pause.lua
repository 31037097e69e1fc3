-- Pauses or unpauses a schedule. Paused, it leaves the due zset: it fires
-- nothing, and the ticks it passes are not caught up, since unpausing sets
-- its next tick from now. Either bumps its rev, so a sweeper firing it
-- meanwhile records nothing (schedule_record.lua).
-- KEYS[1] the schedule hash, KEYS[2] the schedules' due zset
-- ARGV[1] its due member, ARGV[2] '1' to pause, '0' to unpause, ARGV[3] now
-- (ms), ARGV[4] its next tick when unpaused (ms, '' for none), ARGV[5] '1'
-- when ARGV[6] is a note to set
-- Returns {'ok', rev} | {'missing'}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local rev = redis.call('HINCRBY', KEYS[1], 'rev', 1)
redis.call('HSET', KEYS[1], 'paused', ARGV[2], 'updated_at', ARGV[3])
if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'note', ARGV[6]) end
if ARGV[2] == '1' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[1], 'next_ms', ARGV[4])
  if ARGV[4] == '' then redis.call('ZREM', KEYS[2], ARGV[1]) else redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1]) end
end
return {'ok', rev}
