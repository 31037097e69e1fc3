-- Journals the outcome of one branch and says whether the coordinator must
-- be woken: when it was the last outstanding branch, or a fatal one. A
-- branch task journaling the last branch it holds ends its message here too
-- (task_end.lua, one round trip fewer; while a pause is asked for, that
-- also wakes the coordinator), unless the coordinator must be woken: then
-- the message stays running until the caller has sent the wake and ends it
-- itself, so a worker that dies in between leaves a running message whose
-- lease runs out, not only a wake that was never sent. The branch's last
-- step, held back by replay, may come along (commit_call in _prelude.lua, as
-- record_op.lua): when another execution journaled that step first, nothing
-- of the branch is written and the caller runs the branch again with the
-- journaled value.
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] live, KEYS[4] steps,
-- KEYS[5] running steps, KEYS[6] history
-- ARGV[1] epoch, ARGV[2] call ("<seq>:<i>"), ARGV[3] branch index,
-- ARGV[4] outcome ("o<json>", "e<epoch>|<json>" or "f<epoch>|<json>"),
-- ARGV[5] task id of the coordinator message sent on wake ('' for none),
-- ARGV[6] now (ms), ARGV[7] the task id of the message that ends ('' for none),
-- ARGV[8] the held step's sequence ('' for none), then as record_op.lua's
-- ARGV[4..9]: ARGV[9] op index, ARGV[10] identity, ARGV[11] value field,
-- ARGV[12] value, ARGV[13] step key, ARGV[14] row to leave
-- Returns {'ok', wake}, {'winner', value}, {'conflict', identity} or {refusal}.
if not dispatched_in(KEYS[2], ARGV[2], ARGV[1]) then return {'stale'} end
if (ARGV[8] or '') ~= '' then
  local verdict, detail = commit_call(KEYS[1], KEYS[2], KEYS[4], KEYS[5], ARGV[1], ARGV[8], ARGV[9], ARGV[10],
                                      ARGV[11], ARGV[12], ARGV[13], ARGV[14], KEYS[6], ARGV[6])
  if verdict ~= 'ok' then return {verdict, detail} end
end
local wake = branch_outcome(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[1])
local ending = ARGV[7] or ''
if ending ~= '' then
  local f = redis.call('HMGET', KEYS[1], 'status', 'pause')
  wake = wake or (f[1] == 'running' and f[2] == '1' and ARGV[5] ~= '')
end
if wake then
  token_queued(KEYS[1], KEYS[3], ARGV[5], 'c', ARGV[6], ARGV[6])
  return {'ok', 1}
end
if ending ~= '' then token_done(KEYS[1], KEYS[3], ending, ARGV[6]) end
return {'ok', 0}
