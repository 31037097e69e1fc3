-- Branch messages about to be published count as queued from now
-- (liveness): counted before they exist, never after, so a message that
-- ran and ended before its sender got round to counting it can never be
-- counted again as one still queued. Sent by the execution that dispatched
-- the fan-out (no giver), or by a branch task handing on branches it holds
-- and has not begun (BranchWork in workflows/fanout.py): its record of what
-- it gave keeps a redelivery of its own message from running those beside
-- the tasks that now hold them.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>"), ARGV[3] the giver's task id
-- ('' for the dispatch), ARGV[4] what it gave ("<epoch>|<j>,<j>,...",
-- schema.handoff_value), ARGV[5] now (ms), ARGV[6..] the messages' task ids
-- Returns {'ok'} or {refusal}.
if not dispatched_in(KEYS[2], ARGV[2], ARGV[1]) then return {'stale'} end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'g:' .. ARGV[2] .. ':' .. ARGV[3], ARGV[4]) end
local now = tonumber(ARGV[5])
for i = 6, #ARGV do token_queued(KEYS[1], KEYS[3], ARGV[i], 's', now, now) end
return {'ok'}
