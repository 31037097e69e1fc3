-- Creates or replaces throttle T's settings, which apply at once to what
-- waits: the ready set is rebuilt from the queue (a key's limit may have
-- changed) and whoever may go now is admitted.
-- KEYS[1..9] the throttle's keys (keys.ThrottleKeys)
-- ARGV[1] now (ms), ARGV[2] concurrency, ARGV[3] rate n, ARGV[4] rate
-- period ms, ARGV[5] per-key concurrency, ARGV[6] per-key rate n, ARGV[7]
-- per-key rate period ms ('' for each limit not set)
-- Returns {'created'|'updated', next due ms or '', holder, epoch, ...}: the
-- holders admitted, whose runs the caller tells (throttle_granted.lua).
local T = throttle_keys(1)
local now = tonumber(ARGV[1])
local verdict = redis.call('EXISTS', T.conf) == 1 and 'updated' or 'created'
local names = {'concurrency', 'rate_n', 'rate_ms', 'pk_concurrency', 'pk_rate_n', 'pk_rate_ms'}
for i, name in ipairs(names) do
  local value = ARGV[i + 1]
  if value == '' then redis.call('HDEL', T.conf, name) else redis.call('HSET', T.conf, name, value) end
end
redis.call('HSETNX', T.conf, 'created_at', ARGV[1])
redis.call('HSET', T.conf, 'updated_at', ARGV[1])
redis.call('DEL', T.ready, T.later)
local last = nil
for _, member in ipairs(redis.call('ZRANGEBYLEX', T.queue, '-', '+')) do
  local zero = string.find(member, '\0', 1, true)
  local key = string.sub(member, 1, zero - 1)
  if key ~= last then
    redis.call('ZADD', T.ready, 0, string.sub(member, zero + 1))
    last = key
  end
end
local granted, next_due = throttle_admit(T, now)
return throttle_reply(verdict, granted, next_due)
