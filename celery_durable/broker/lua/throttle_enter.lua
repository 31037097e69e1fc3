-- Writes an op's slot intent before its slot is asked for (fenced): a
-- settle or a take-over reads the run's intents to give back what its
-- attempt held or waited for (tasks/throttling.py).
-- KEYS[1] run hash, KEYS[2] the run's throttle intents
-- ARGV[1] epoch, ARGV[2] op, ARGV[3] throttle, ARGV[4] throttle key
-- Returns {'granted'} when this attempt was given the slot already (its
-- pass was woken for it), {'entered'}, or {refusal} (fence in _prelude.lua).
local current = redis.call('HGET', KEYS[2], ARGV[2])
if current and current == ARGV[1] .. '|g|' .. ARGV[3] .. '|' .. ARGV[4] then return {'granted'} end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1] .. '|w|' .. ARGV[3] .. '|' .. ARGV[4])
redis.call('HSET', KEYS[1], 'throttled', '1')
return {'entered'}
