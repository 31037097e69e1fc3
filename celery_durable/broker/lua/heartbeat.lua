-- Keeps an attempt's lease (and, for a coordinator pass, its lock) alive.
-- KEYS[1] run hash
-- ARGV[1] epoch, ARGV[2] lock token or '', ARGV[3] now (ms),
-- ARGV[4] lock ttl (ms), ARGV[5] lease ttl (ms)
-- Returns {'ok', cancel, pause} or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local now = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'lease_until', now + lease_ms(KEYS[1], ARGV[5]))
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'lock') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'lock_until', now + tonumber(ARGV[4]))
end
check_limits(KEYS[1], now)
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3]}
