-- Records the code hash a pass runs, when it differs from the one the run
-- last ran (a deploy since): the run's detail shows it beside the hash the
-- run started with, and a run that stops on nondeterminism keeps the hash of
-- the code that diverged, which resume compares with (SPEC §8). Passes whose
-- code is the run's never call it.
-- KEYS[1] run hash
-- ARGV[1] epoch, ARGV[2] code hash
-- Returns {'ok'} or {refusal}.
redis.call('HSET', KEYS[1], 'attempt_code_hash', ARGV[2])
return {'ok'}
