-- Deletes a schedule: its ticks stop. The runs it started are untouched,
-- and the list of them is kept for the run retention, so they can still be
-- listed by schedule.
-- KEYS[1] the schedule hash, KEYS[2] the schedules' due zset, KEYS[3] the
-- namespace's schedule ids, KEYS[4] its recent list, KEYS[5] its runs zset
-- ARGV[1] its due member, ARGV[2] its id, ARGV[3] the run retention (ms, 0: none)
-- Returns 1 when it was deleted, 0 when there was none.
local existed = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[5], ARGV[3]) end
return existed
