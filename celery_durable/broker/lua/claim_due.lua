-- Hands due runs to one sweeper: each run returned is rescheduled a little
-- later in the same script, so sweepers working together look at each run
-- once, and Redis does the work of one sweep however many workers sweep.
-- A claim's score is the claim's end plus half a millisecond: every other
-- look is a whole millisecond, so the sweep can tell a run left as it
-- claimed it from one somebody asked a look of since (look.lua, looked.lua).
-- KEYS[1] the sweep's due zset
-- ARGV[1] now (ms), ARGV[2] most runs to claim, ARGV[3] ms a claim lasts
-- Returns {next due score or '', the claim's score, run id, run id, ...}: the
-- runs now due, and when the next one not claimed here falls due (so the
-- sweeper can sleep).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local claim = tonumber(ARGV[1]) + tonumber(ARGV[3]) + 0.5
for _, run_id in ipairs(due) do redis.call('ZADD', KEYS[1], claim, run_id) end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local out = {next_due[2] or '', string.format('%.1f', claim)}
for _, run_id in ipairs(due) do table.insert(out, run_id) end
return out
