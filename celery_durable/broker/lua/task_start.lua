-- A branch task starts: its message is running, its lease begins now (a
-- branch that waited in a busy queue renews its run at once), and it learns
-- the run's flags.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch, ARGV[2] the task's id, ARGV[3] now (ms), ARGV[4] lease ttl (ms)
-- Returns {'ok', cancel, pause, limit} or {refusal}.
local refusal = fence(KEYS[1], ARGV[1])
if refusal then return {refusal} end
local now = tonumber(ARGV[3])
token_running(KEYS[1], KEYS[2], ARGV[2], now + tonumber(ARGV[4]), now)
check_limits(KEYS[1], now)
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3]}
