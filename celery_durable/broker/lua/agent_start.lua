-- An agent task wants to run its turn: it gets a slot under the run's
-- concurrency ceiling, or is told to wait (its message comes back later,
-- queued again). The slot count lives in Redis, so the ceiling holds across
-- the whole fleet; a take-over resets it, which is how a killed worker's
-- slot is released.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] agent rows, KEYS[4] live
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] agent id, ARGV[4] the task's id,
-- ARGV[5] lease ttl (ms), ARGV[6] task id of the message that comes back
-- on 'wait', ARGV[7] ms until that message is due
-- Returns {'go', request json}, {'wait'}, {'done'} (already journaled),
-- {'running'} (this very message runs the turn already), {'stale'} (the turn
-- was not asked for by this attempt), or {refusal}.
local now = tonumber(ARGV[2])
local id = ARGV[3]
local outcome = redis.call('HGET', KEYS[2], 'a:' .. id)
if outcome and not is_stale_failure(outcome, ARGV[1]) then
  token_done(KEYS[1], KEYS[4], ARGV[4], now)
  return {'done'}
end
local request = redis.call('HGET', KEYS[2], 'q:' .. id)
if not request or redis.call('HGET', KEYS[2], 'qe:' .. id) ~= ARGV[1] then
  token_done(KEYS[1], KEYS[4], ARGV[4], now)
  return {'stale'}
end
local row_key = id .. '@' .. ARGV[1]
local row = cjson.decode(redis.call('HGET', KEYS[3], row_key) or '{}')
-- The broker delivered this message again while its first delivery's turn
-- runs, or after the worker running it died: RabbitMQ gives a dead worker's
-- unacknowledged messages back at once (Redis after its visibility timeout).
-- Its running entry, the same task id, is left to its heartbeat: renewed, the
-- first delivery finishes the turn; stale, the attempt is dead and a take-over
-- runs the turn again. Replacing it with a message queued for later would keep
-- a dead turn looking alive for ever.
if row['status'] == 'running' and string.sub(redis.call('HGET', KEYS[4], ARGV[4]) or '', 1, 2) == 'x|' then
  return {'running'}
end
local f = redis.call('HMGET', KEYS[1], 'lim_concurrent', 'agents_running')
-- A second delivery of a turn that is running (or whose worker died; the
-- take-over will tell) never runs one turn twice at once; at the ceiling, a
-- turn waits for a slot.
if row['status'] == 'running' or (f[1] and f[1] ~= '' and tonumber(f[2] or '0') >= tonumber(f[1])) then
  token_done(KEYS[1], KEYS[4], ARGV[4], now)
  token_queued(KEYS[1], KEYS[4], ARGV[6], 'a', now + tonumber(ARGV[7]), now)
  return {'wait'}
end
redis.call('HINCRBY', KEYS[1], 'agents_running', 1)
row['status'] = 'running'
row['started_at'] = now
redis.call('HSET', KEYS[3], row_key, cjson.encode(row))
token_running(KEYS[1], KEYS[4], ARGV[4], now + tonumber(ARGV[5]), now)
return {'go', request}
