-- A wake sent to a worker's home queue (tasks/home.py) and not started in
-- time goes again to the coordinator queue, under a new id, as Temporal's
-- sticky queues fall back: the home worker has stopped, died, or every one
-- of its threads is busy. The home wake's entry goes, so liveness judges the
-- new message by the coordinator queue as any other; should the home worker
-- still take the old one, that is one more pass of the run, fenced as any.
-- Nothing happens once the wake has started, or for another attempt, or for
-- a run that is not running (a pause waits for no wake).
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch, ARGV[2] the home wake's id, ARGV[3] the new message's id,
-- ARGV[4] now (ms)
-- Returns 1 when the caller sends the new message, else 0.
local run = redis.call('HMGET', KEYS[1], 'epoch', 'status')
if run[1] ~= ARGV[1] or run[2] ~= 'running' then return 0 end
local value = redis.call('HGET', KEYS[2], ARGV[2])
if not value or string.sub(value, 1, 2) ~= 'q|' then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
token_queued(KEYS[1], KEYS[2], ARGV[3], 'c', ARGV[4], ARGV[4])
return 1
