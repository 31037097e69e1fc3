-- A saga registered a compensation (ctx.saga): the run is marked, so that a
-- pass that finds it cancelled replays it up to where it stands and runs its
-- compensations before it settles (passes.main_pass), instead of settling at
-- once.
-- KEYS[1] run hash
-- ARGV[1] epoch
-- Returns {'ok', cancel, pause, limit} or {refusal}.
redis.call('HSET', KEYS[1], 'compensates', '1')
local f = flags(KEYS[1])
return {'ok', f[1], f[2], f[3]}
