-- A branch task starts, and reads in the same round trip what it would
-- otherwise read in five: the run record (load_run), its own message counted
-- running with its lease starting now (a branch that waited in a busy queue
-- renews its run at once), the outcomes of the branches it holds, what an
-- earlier delivery of it handed on, and the sequences it replays first
-- (read_sequences.lua, with the same budget).
-- A message of another attempt, of another workflow, or for a run that
-- settled changes nothing; nor does one the run did not send: its task id
-- must be one the run counts in flight (every branch message is counted
-- before it is published), and every branch it names one of its fan-out's
-- (Flower shows real task ids and their arguments, and a branch index past
-- the fan-out's width would end the run as nondeterministic). Every field
-- name comes from the caller (schema/journal.py builds them).
-- KEYS[1] run hash, KEYS[2] live, KEYS[3] journal
-- ARGV[1] epoch, ARGV[2] workflow, ARGV[3] the task's id, ARGV[4] now (ms),
-- ARGV[5] lease ttl (ms), ARGV[6] the task's hand-off field, ARGV[7] budget
-- of entries, ARGV[8] n, ARGV[9..8+n] the branches' outcome fields, then the
-- sequences to read
-- Returns {refusal} ('missing', 'stale', 'forged', 'settled', or 'unknown':
-- not in flight, a message delivered again after it ended or one never sent), or
-- {'ok', cancel, pause, limit, the run hash (flat), the hand-off or false,
--  {outcome or false, ...}, {sequence_reply, ...} (perhaps fewer)}.
local f = redis.call('HMGET', KEYS[1], 'epoch', 'status', 'workflow')
if not f[1] then return {'missing'} end
if f[1] ~= ARGV[1] then return {'stale'} end
if f[3] ~= ARGV[2] then return {'forged'} end
if f[2] ~= 'running' and f[2] ~= 'paused' then return {'settled'} end
local n = tonumber(ARGV[8])
local in_flight = redis.call('HGET', KEYS[2], ARGV[3])
if not in_flight then return {'unknown'} end
local call = string.match(ARGV[9] or '', '^r:(.+):%d+$')
local op = call and redis.call('HGET', KEYS[3], 'o:' .. call)
local width = op and tonumber(string.match(op, '|(%d+)$'))
if not width then return {'forged'} end
for i = 1, n do
  local of, j = string.match(ARGV[8 + i], '^r:(.+):(%d+)$')
  if of ~= call or tonumber(j) >= width then return {'forged'} end
end
local now = tonumber(ARGV[4])
token_running(KEYS[1], KEYS[2], ARGV[3], now + tonumber(ARGV[5]), now)
-- A worker that knows the workflow serves the run: messages passed on for
-- want of one (requeue.lua) back off from their first delay again.
redis.call('HDEL', KEYS[1], 'unserved_passes')  -- no write where none was counted
check_limits(KEYS[1], now)
local fl = flags(KEYS[1])
local outcomes = {}
for i = 1, n do
  outcomes[i] = redis.call('HGET', KEYS[3], ARGV[8 + i]) or false
end
local sequences = sequence_replies(KEYS[3], ARGV, 9 + n, tonumber(ARGV[7]))
local handed = redis.call('HGET', KEYS[3], ARGV[6]) or false
local record = redis.call('HGETALL', KEYS[1])
return {'ok', fl[1], fl[2], fl[3], record, handed, outcomes, sequences}
