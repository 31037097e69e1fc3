-- Records what became of a schedule's ticks: its next tick and when the
-- sweep looks at it again, the tick buffered, the last run it started, its
-- recent actions (trimmed) and the runs it started (for listing by
-- schedule). A sweeper's record is a compare-and-set on what it read (rev,
-- next tick, buffered tick): a schedule changed, paused, or fired by another
-- sweeper meanwhile is left as it is ('stale'), and its ticks are looked at
-- again; the runs any of them started have ids derived from their ticks, so
-- none is started twice. A trigger or a backfill records without those
-- checks (ARGV[2] '', ARGV[3] '*'), and a trigger that buffers sets the buffered
-- tick only where none is (ARGV[6] ''), and has the sweep look no later than
-- its due score (ARGV[5]), which releases the tick once the last run settled.
-- KEYS[1] the schedule hash, KEYS[2] the schedules' due zset, KEYS[3] its
-- recent list, KEYS[4] its runs zset
-- ARGV[1] its due member, ARGV[2] the rev read ('' : any), ARGV[3] the next
-- tick read ('*' : leave next tick alone, and due but for ARGV[5], '' : none),
-- ARGV[4] the new next tick ('' : none), ARGV[5] its due score ('' : out of
-- due; with ARGV[3] '*', '' : leave due alone, else due no later), ARGV[6] the buffered
-- tick read ('*' : leave it alone, '' : none), ARGV[7] the new buffered tick
-- ('' : none), ARGV[8] the last run started ('' : none), ARGV[9] its tick,
-- ARGV[10] recent actions kept, ARGV[11] runs older than this tick (ms) leave
-- the runs zset, ARGV[12] n, the number of actions, ARGV[13..12+n] actions
-- (JSON, oldest first), then run id, tick pairs of runs started
-- Returns {'ok'} | {'missing'} | {'stale'}
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local state = redis.call('HMGET', KEYS[1], 'rev', 'next_ms', 'buffered', 'last_tick')
if ARGV[2] ~= '' and state[1] ~= ARGV[2] then return {'stale'} end
if ARGV[3] ~= '*' and (state[2] or '') ~= ARGV[3] then return {'stale'} end
if ARGV[6] ~= '*' and (state[3] or '') ~= ARGV[6] then return {'stale'} end
if ARGV[3] ~= '*' then
  redis.call('HSET', KEYS[1], 'next_ms', ARGV[4])
  if ARGV[5] == '' then redis.call('ZREM', KEYS[2], ARGV[1]) else redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1]) end
elseif ARGV[5] ~= '' then
  local due = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '')
  if not due or tonumber(ARGV[5]) < due then redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1]) end
end
if ARGV[6] ~= '*' then redis.call('HSET', KEYS[1], 'buffered', ARGV[7]) end
if ARGV[8] ~= '' and tonumber(ARGV[9]) >= (tonumber(state[4] or '') or -1) then
  redis.call('HSET', KEYS[1], 'last_run', ARGV[8], 'last_tick', ARGV[9])
end
local n = tonumber(ARGV[12])
for i = 13, 12 + n do redis.call('LPUSH', KEYS[3], ARGV[i]) end
if n > 0 then redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[10]) - 1) end
for i = 13 + n, #ARGV, 2 do redis.call('ZADD', KEYS[4], ARGV[i + 1], ARGV[i]) end
if #ARGV >= 13 + n then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[11]) end
return {'ok'}
