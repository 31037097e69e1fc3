-- A queued message of the run goes to its queue again, under a new id,
-- before it has started:
--  * a wake sent to a worker's home queue (tasks/home.py) and not started in
--    time goes to the coordinator queue, as Temporal's sticky queues fall
--    back: the home worker has stopped, died, or every thread is busy;
--  * a message that reached a worker which does not know the run's workflow
--    (tasks/messages.py) goes back for one that does, as Temporal retries a
--    workflow task no worker of its type took, after a backoff that doubles
--    with each such pass (the run hash counts them, 'unserved_passes', until
--    a pass of the run runs: activate_run) up to a cap, jittered: never a
--    busy loop (SPEC 3).
-- The old entry goes and the new one is queued from its due time, so
-- liveness judges the new message like any other; should the old one still
-- run, that is one more pass of the run, fenced as any. With a note, the
-- first such message since a pass of the run last ran records when
-- ('unserved_since') and a system progress record says so.
-- Nothing happens for another attempt, for a run that no longer runs (a
-- pause waits for no wake), or for a message that has started.
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] progress stream, KEYS[4] history
-- ARGV[1] epoch, ARGV[2] the message's id, ARGV[3] the new message's id,
-- ARGV[4] now (ms), ARGV[5] the new message's queue kind (c, s or a),
-- ARGV[6] when it is due (ms), ARGV[7] the system record's note ('' for none),
-- ARGV[8] the backoff's first delay (ms; '' or '0' for none: due at ARGV[6]),
-- ARGV[9] its cap (ms), ARGV[10] its jitter: a factor the delay is multiplied by
-- Returns {sent, first, delay}: sent 1 when the caller sends the new message,
-- first 1 when the note was recorded, delay the ms the new message waits
-- before it is due (its countdown).
local run = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'unserved_since')
if run[1] ~= ARGV[1] or (run[2] ~= 'running' and run[2] ~= 'pending') then return {0, 0, 0} end
local value = redis.call('HGET', KEYS[2], ARGV[2])
if not value or string.sub(value, 1, 2) ~= 'q|' then return {0, 0, 0} end
local now, due = tonumber(ARGV[4]), tonumber(ARGV[6])
local base = tonumber(ARGV[8] or '') or 0
if base > 0 then
  local passes = redis.call('HINCRBY', KEYS[1], 'unserved_passes', 1)
  local delay = math.min(tonumber(ARGV[9]), base * 2 ^ math.min(passes - 1, 30))
  due = now + math.floor(delay * tonumber(ARGV[10]))
end
redis.call('HDEL', KEYS[2], ARGV[2])
token_queued(KEYS[1], KEYS[2], ARGV[3], ARGV[5], due, now)
if ARGV[7] == '' or (run[3] and run[3] ~= '') then return {1, 0, due - now} end
redis.call('HSET', KEYS[1], 'unserved_since', ARGV[4])
append_progress(KEYS[1], KEYS[3], 'system', '', ARGV[7], ARGV[1], ARGV[4], nil, KEYS[4])
return {1, 1, due - now}
