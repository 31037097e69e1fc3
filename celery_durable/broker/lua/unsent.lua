-- Messages the caller counted in flight, and could not publish: the broker
-- refused them. Counted and never sent, they would keep the run looking
-- alive (behind a backlog the empty-queue rule never judges them, and the
-- active-time clock runs on), or get a healthy run taken over once their
-- queue is seen empty. Forgotten, the run is judged by what it really has in
-- flight, and the sweep (told to look now) takes over a run left with
-- nothing to move it. Undone too, as the caller says: a branch task's
-- record of what it handed on (it runs those itself), a task call's
-- publication by this attempt (so that the call is published again). (A
-- fan-out's dispatch needs no undoing: the pass that failed to send it runs
-- again as a new execution, which dispatches what is missing.)
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live
-- ARGV[1] epoch, ARGV[2] now (ms), ARGV[3] fan-out call ("<seq>:<i>") or '',
-- ARGV[4] the giver's task id or '', ARGV[5] a task call's key or '',
-- ARGV[6..] the messages' task ids
-- Returns {'ok', how many were forgotten} or {refusal}.
local forgotten = 0
for i = 6, #ARGV do
  local value = redis.call('HGET', KEYS[3], ARGV[i])
  if value and string.sub(value, 1, 2) == 'q|' then
    token_done(KEYS[1], KEYS[3], ARGV[i], ARGV[2])
    forgotten = forgotten + 1
  end
end
if ARGV[3] ~= '' and ARGV[4] ~= '' then redis.call('HDEL', KEYS[2], 'g:' .. ARGV[3] .. ':' .. ARGV[4]) end
if ARGV[5] ~= '' and redis.call('HGET', KEYS[2], 'ce:' .. ARGV[5]) == ARGV[1] then
  redis.call('HDEL', KEYS[2], 'ce:' .. ARGV[5])
end
return {'ok', forgotten}
