-- A message of the run reached a worker that does not know the run's
-- workflow (another team's engine on the same queues, a worker of an older
-- deploy): it goes back to its queue, under a new id, for a worker that
-- knows it, as Temporal retries a workflow task no worker of its type took.
-- The old entry goes and the new one is queued from its due time, so
-- liveness judges the new message like any other and the run stays alive
-- while it waits for such a worker. The first time (since a pass of the run
-- last ran) it also records when, and a system progress record says so.
-- Nothing happens for another attempt, for a run that no longer runs, or
-- for a message that is not queued (one that started is no longer to pass on).
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] progress stream
-- ARGV[1] epoch, ARGV[2] the message's id, ARGV[3] the new message's id,
-- ARGV[4] now (ms), ARGV[5] the new message's queue kind (c, s or a),
-- ARGV[6] when it is due (ms), ARGV[7] the system record's message
-- Returns {sent, first}: sent 1 when the caller sends the new message,
-- first 1 when this is the first such message since a pass last ran.
local run = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'unserved_since')
if run[1] ~= ARGV[1] or (run[2] ~= 'running' and run[2] ~= 'pending') then return {0, 0} end
local value = redis.call('HGET', KEYS[2], ARGV[2])
if not value or string.sub(value, 1, 2) ~= 'q|' then return {0, 0} end
redis.call('HDEL', KEYS[2], ARGV[2])
token_queued(KEYS[1], KEYS[2], ARGV[3], ARGV[5], ARGV[6], ARGV[4])
if run[3] and run[3] ~= '' then return {1, 0} end
redis.call('HSET', KEYS[1], 'unserved_since', ARGV[4])
append_progress(KEYS[1], KEYS[3], 'system', '', ARGV[7], ARGV[1], ARGV[4])
return {1, 1}
