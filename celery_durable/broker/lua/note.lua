-- Leaves one system progress record on a run, said once per text: a note of
-- the runtime's about the run (start_workflow: no live worker serves its
-- workflow). It is an event of the run's history too (append_progress).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] history
-- ARGV[1] now (ms), ARGV[2] the message, ARGV[3] the run hash field that
-- marks it said ('noted:<what>')
-- Returns {'ok'} when written, {'said'} when it was already, {'missing'},
-- or {'closed'} for a run settled for good (completed or cancelled): its
-- records are final, and may be archived (archive_run.lua), which a record
-- written after would split in two.
local f = redis.call('HMGET', KEYS[1], 'epoch', ARGV[3], 'status')
if not f[1] then return {'missing'} end
if f[2] then return {'said'} end
if ARCHIVABLE[f[3]] then return {'closed'} end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[1])
append_progress(KEYS[1], KEYS[2], 'system', '', ARGV[2], f[1], ARGV[1], nil, KEYS[3])
return {'ok'}
