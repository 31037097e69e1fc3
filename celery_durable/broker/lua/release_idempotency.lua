-- Frees an idempotency key whose run has expired (run retention), so the
-- next start with that key starts a new run instead of naming a lost one.
-- KEYS[1] idempotency key
-- ARGV[1] the run id it must still name
-- Returns 1 when the key was freed, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
