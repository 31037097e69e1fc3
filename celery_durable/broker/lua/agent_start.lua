-- An agent task wants to run its turn: it gets a slot under the run's
-- concurrency ceiling, or is told to wait. The slot count lives in Redis, so
-- the ceiling holds across the whole fleet; a take-over resets it, which is
-- how a killed worker's slot is released.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] agent rows
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] agent id
-- Returns {'go', request json}, {'wait'}, {'done'} (already journaled), or
-- {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local id = ARGV[3]
local outcome = redis.call('HGET', KEYS[2], 'a:' .. id)
if outcome and not is_stale_failure(outcome, ARGV[1]) then return {'done'} end
local request = redis.call('HGET', KEYS[2], 'q:' .. id)
if not request or redis.call('HGET', KEYS[2], 'qe:' .. id) ~= ARGV[1] then return {'stale'} end
local row_key = id .. '@' .. ARGV[1]
local row = cjson.decode(redis.call('HGET', KEYS[3], row_key) or '{}')
if row['status'] == 'running' then
  -- A second delivery of a turn that is running (or whose worker died; the
  -- take-over will tell): never run one turn twice at once.
  return {'wait'}
end
local f = redis.call('HMGET', KEYS[1], 'lim_concurrent', 'agents_running')
if f[1] and f[1] ~= '' and tonumber(f[2] or '0') >= tonumber(f[1]) then return {'wait'} end
redis.call('HINCRBY', KEYS[1], 'agents_running', 1)
row['status'] = 'running'
row['started_at'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[3], row_key, cjson.encode(row))
return {'go', request}
