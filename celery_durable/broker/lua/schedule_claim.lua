-- Hands due schedules to one sweeper, as claim_due.lua hands due runs: each
-- one returned is given a claim score (the claim's end plus half a
-- millisecond) in the same script, so sweepers working together fire each
-- tick once. A sweeper that dies holding a claim leaves the schedule due
-- again once the claim runs out; the next claim fires the same tick, whose
-- run already exists if it was made (its id is derived from the tick).
-- KEYS[1] the schedules' due zset
-- ARGV[1] now (ms), ARGV[2] most schedules to claim, ARGV[3] ms a claim lasts
-- Returns {next due score or '', the claim's score, member, score, member,
-- score, ...}: the schedules now due, each with the score it had (its next
-- tick, or a claim that ran out: then a sweeper saw the tick due at that
-- claim's start and died), and when the next one not claimed here falls due.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local claim = tonumber(ARGV[1]) + tonumber(ARGV[3]) + 0.5
for i = 1, #due, 2 do redis.call('ZADD', KEYS[1], claim, due[i]) end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local out = {next_due[2] or '', string.format('%.1f', claim)}
for _, item in ipairs(due) do table.insert(out, item) end
return out
