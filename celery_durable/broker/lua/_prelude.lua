-- Prepended to every script (scripts.py does it at load time), so the fence
-- and the progress append exist once. Nothing here builds a key name.

-- The fencing check. Returns nil when the caller's epoch owns the run and the
-- run still accepts work, else the refusal: 'missing', 'stale' or 'settled'.
local function fence(run_key, epoch)
  local fields = redis.call('HMGET', run_key, 'epoch', 'status')
  if not fields[1] then return 'missing' end
  if fields[1] ~= epoch then
    -- Counted, so tests and operators can see the fence at work.
    redis.call('HINCRBY', run_key, 'refused', 1)
    return 'stale'
  end
  local status = fields[2]
  if status ~= 'running' and status ~= 'pending' and status ~= 'paused' then
    return 'settled'
  end
  return nil
end

-- The run's control flags, returned by every fenced write so an attempt
-- learns of a cancellation without a read of its own.
local function flags(run_key)
  local f = redis.call('HMGET', run_key, 'cancel', 'pause')
  return {f[1] or '0', f[2] or '0'}
end

-- Appends one progress record with the next per-run seq; returns the seq.
-- Records carry the attempt count users see, not the fencing epoch.
local function append_progress(run_key, stream_key, kind, phase_id, message, _epoch, at)
  local seq = redis.call('HINCRBY', run_key, 'next_seq', 1)
  local attempt = redis.call('HGET', run_key, 'attempt') or '1'
  redis.call('XADD', stream_key, seq .. '-0',
    'kind', kind, 'phase_id', phase_id, 'message', message, 'attempt', attempt, 'at', at)
  return seq
end

-- A journaled outcome is stale when it is a failure of another attempt:
-- failures are deterministic within an attempt and retried after it.
local function is_stale_failure(outcome, epoch)
  if not outcome then return true end
  local tag = string.sub(outcome, 1, 1)
  if tag ~= 'e' and tag ~= 'f' then return false end
  local bar = string.find(outcome, '|', 2, true)
  if not bar then return false end
  return string.sub(outcome, 2, bar - 1) ~= epoch
end

-- Op entries read "<epoch>:<identity>". A sequence's cut "k:<seq>" =
-- "<N>:<i>" says attempt N re-ran a failed op at index i, so entries after i
-- written by attempts before N are an abandoned future: dead, not history.
local function entry_alive(journal_key, seq, index, raw)
  local cut = redis.call('HGET', journal_key, 'k:' .. seq)
  if not cut then return true end
  local c = string.find(cut, ':', 1, true)
  local e = string.find(raw, ':', 1, true)
  return not (tonumber(index) > tonumber(string.sub(cut, c + 1))
    and tonumber(string.sub(raw, 1, e - 1)) < tonumber(string.sub(cut, 1, c - 1)))
end

-- Forgets what belonged to an abandoned fan-out at <seq>:<index>: its
-- branches' outcomes, counters and histories must not be mistaken for those
-- of whatever op now stands at that index.
local function forget_fanout(journal_key, seq, index, width, epoch)
  local call = seq .. ':' .. index
  for j = 0, width - 1 do
    local branch = seq .. '.' .. index .. '.' .. j
    redis.call('HDEL', journal_key, 'r:' .. call .. ':' .. j, 'h:' .. branch)
    redis.call('HSET', journal_key, 'k:' .. branch, epoch .. ':-1')
  end
  redis.call('HDEL', journal_key, 'c:' .. call, 'd:' .. call)
end

-- Records op <index> of sequence <seq> with identity <ident>. Returns
-- (conflict, replaced): the live identity already there when it differs
-- (non-determinism), and the dead identity this write replaced, if any.
local function record_op(journal_key, seq, index, ident, epoch)
  local field = 'o:' .. seq .. ':' .. index
  local existing = redis.call('HGET', journal_key, field)
  if existing then
    local old = string.sub(existing, string.find(existing, ':', 1, true) + 1)
    if entry_alive(journal_key, seq, index, existing) then
      if old ~= ident then return old, nil end
      return nil, nil
    end
    redis.call('HSET', journal_key, field, epoch .. ':' .. ident)
    local kind = string.sub(old, 1, 1)
    if kind == 'p' or kind == 'l' then
      forget_fanout(journal_key, seq, index, tonumber(string.sub(old, 3)), epoch)
    end
    return nil, old
  end
  redis.call('HSET', journal_key, field, epoch .. ':' .. ident)
  local count_field = 'n:' .. seq
  local count = tonumber(redis.call('HGET', journal_key, count_field) or '0')
  if tonumber(index) + 1 > count then
    redis.call('HSET', journal_key, count_field, tonumber(index) + 1)
  end
  return nil, nil
end

-- Cuts sequence <seq> at op <index> for attempt <epoch>: entries after it
-- written by older attempts are abandoned. Progress records at or after
-- <position> (the position the op began at) are new from here on.
local function cut_sequence(journal_key, seq, index, epoch, position)
  redis.call('HSET', journal_key, 'k:' .. seq, epoch .. ':' .. index)
  local limit = tonumber(position) - 1
  local hwm = tonumber(redis.call('HGET', journal_key, 'h:' .. seq) or '-1')
  if hwm > limit then redis.call('HSET', journal_key, 'h:' .. seq, limit) end
end

-- Redis's run_id changes when the server restarts. An epoch bump that was
-- acknowledged but not yet fsynced can be lost in a restart, and handing the
-- same number out again would let two attempts pass the fence. So the first
-- bump of a run after a restart jumps past every number that can have been
-- issued before it. The jump must not be computed from stored state alone:
-- the jump itself can be lost to a second restart, and the same stored state
-- would then give the same number twice. So it lands on at least the server's
-- clock in ms, which a later restart has moved past. Returns the new epoch;
-- 'attempt' counts attempts for users.
local EPOCH_GAP = 1000
local function server_incarnation()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
end
local function next_epoch(run_key)
  local server = server_incarnation()
  local seen = redis.call('HGET', run_key, 'incarnation')
  local step = 1
  if seen and seen ~= server then
    local epoch = tonumber(redis.call('HGET', run_key, 'epoch'))
    local t = redis.call('TIME')
    local clock_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    step = math.max(EPOCH_GAP, clock_ms - epoch)
  end
  redis.call('HSET', run_key, 'incarnation', server)
  redis.call('HINCRBY', run_key, 'attempt', 1)
  return redis.call('HINCRBY', run_key, 'epoch', step)
end

-- Rows of steps still running when their attempt ends can no longer finish
-- under its epoch: they become interrupted, not phantom running rows.
local function interrupt_steps(run_key, running_key, steps_key)
  local rows = redis.call('HGETALL', running_key)
  for i = 1, #rows, 2 do
    redis.call('HSET', steps_key, rows[i], 'interrupted' .. string.sub(rows[i + 1], 8))
  end
  redis.call('DEL', running_key)
  redis.call('HSET', run_key, 'steps_running', '0')
end
