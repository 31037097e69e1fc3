-- Tells a run a throttle gave its holder a slot (or was deleted under it):
-- the intent is marked granted (the run's own slot: 'slot' = the epoch) and
-- the owner waiting for it is woken, a message counted in flight
-- "<prefix>-1". Idempotent; the sweep tells again what a caller that died
-- did not (tasks/throttling.py).
-- KEYS[1] run hash, KEYS[2] the run's throttle intents, KEYS[3] waits,
-- KEYS[4] live
-- ARGV[1] op, ARGV[2] epoch of the holder, ARGV[3] wake prefix, ARGV[4] now
-- Returns {'woken', owner, workflow}, {'marked'} (nothing waited yet: the
-- op goes on when it asks), or {'gone'}: the run, the attempt or the
-- intent is no more, and the caller gives the slot back.
local run = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'workflow')
if run[1] ~= ARGV[2] or (run[2] ~= 'running' and run[2] ~= 'pending') then return {'gone'} end
local op = ARGV[1]
if op == 'run' then
  redis.call('HSET', KEYS[1], 'slot', ARGV[2])
else
  local current = redis.call('HGET', KEYS[2], op)
  if not current or string.sub(current, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return {'gone'} end
  redis.call('HSET', KEYS[2], op, ARGV[2] .. '|g|' .. string.sub(current, #ARGV[2] + 4))
end
local raw = redis.call('HGET', KEYS[3], 't:' .. op)
if not raw then return {'marked'} end
redis.call('HDEL', KEYS[3], 't:' .. op)
refresh_waiting(KEYS[1], KEYS[3])
local owner = tostring(cjson.decode(raw)['owner'])
local now = tonumber(ARGV[4])
token_queued(KEYS[1], KEYS[4], ARGV[3] .. '-1', owner_kind(owner), now, now)
return {'woken', owner, run[3]}
