-- Deletes a run record that was created but lost its idempotency race, so a
-- refused start leaves nothing behind.
-- KEYS[1] run hash, KEYS[2] live
-- ARGV[1] epoch it was created with
-- Returns how many keys it deleted: 0 when the run is not the pending one
-- created with that epoch.
if redis.call('HGET', KEYS[1], 'epoch') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'status') == 'pending' then
  return redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
