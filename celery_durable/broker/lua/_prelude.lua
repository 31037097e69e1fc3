-- Prepended to every script (connection.py's Scripts does it at load time), so the fence
-- and the progress append exist once. Nothing here builds a key name.

-- Fields of a run hash read once per script however often it needs them:
-- 'id' and 'progress_max' never change once the run exists, 'attempt'
-- changes only through add_attempt and 'recoveries' through made_progress and
-- count_recovery, which keep this up to date. Keyed by run hash and field (a
-- few scripts touch several runs); false is a field found absent. The fence
-- reads them with the epoch and status: one HMGET, not four HGETs, in every
-- fenced script.
local RUN_FIELDS = {}

local function run_field(run_key, field)
  local name = run_key .. '\0' .. field
  local value = RUN_FIELDS[name]
  if value == nil then
    value = redis.call('HGET', run_key, field) or false
    RUN_FIELDS[name] = value
  end
  return value or nil
end

-- The attempt count users see (records, history events).
local function attempt_of(run_key)
  return run_field(run_key, 'attempt') or '1'
end

local function add_attempt(run_key, by)
  RUN_FIELDS[run_key .. '\0attempt'] = tostring(redis.call('HINCRBY', run_key, 'attempt', by))
end

-- The fencing check. Returns nil when the caller's epoch owns the run and the
-- run still accepts work, else the refusal: 'missing', 'stale' or 'settled'.
local function fence(run_key, epoch)
  local fields = redis.call('HMGET', run_key, 'epoch', 'status', 'id', 'attempt', 'progress_max', 'recoveries')
  if not fields[1] then return 'missing' end
  RUN_FIELDS[run_key .. '\0id'] = fields[3]
  RUN_FIELDS[run_key .. '\0attempt'] = fields[4]
  RUN_FIELDS[run_key .. '\0progress_max'] = fields[5]
  RUN_FIELDS[run_key .. '\0recoveries'] = fields[6]
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
-- learns of a cancellation, a pause or a limit reached without a read of
-- its own: {cancel '0'/'1', pause '0'/'1', limit reached '' or its name}.
local function flags(run_key)
  local f = redis.call('HMGET', run_key, 'cancel', 'pause', 'limit')
  return {f[1] or '0', f[2] or '0', f[3] or ''}
end

-- Active time of the run in ms: accumulated by settled attempts, plus the
-- running one's (time in pauses and between attempts does not count).
local function active_ms(run_key, now)
  local f = redis.call('HMGET', run_key, 'active_ms', 'active_since', 'status')
  local total = tonumber(f[1] or '0')
  if f[3] == 'running' and f[2] and f[2] ~= '' then total = total + now - tonumber(f[2]) end
  return total
end

-- Marks the first ceiling the run has reached (SPEC 6). Ceilings live in the
-- run hash as lim_* fields, written at start and resume. Returns the ceiling
-- reached ('' for none) and the run's flags as flags() gives them, read in
-- the same HMGET: a step's script ends with both, one read instead of two.
local function check_limits(run_key, now)
  local f = redis.call('HMGET', run_key, 'limit', 'lim_timeout_ms', 'lim_credits_nano', 'credits_nano', 'cancel',
    'pause')
  if f[1] and f[1] ~= '' then return f[1], {f[5] or '0', f[6] or '0', f[1]} end
  local reached = ''
  if f[2] and f[2] ~= '' and active_ms(run_key, now) > tonumber(f[2]) then
    reached = 'timeout_seconds'
  elseif f[3] and f[3] ~= '' and tonumber(f[4] or '0') > tonumber(f[3]) then
    reached = 'max_ai_credits'
  end
  if reached ~= '' then redis.call('HSET', run_key, 'limit', reached) end
  return reached, {f[5] or '0', f[6] or '0', reached}
end

-- Keeps the newest 'progress_max' records of a run (a run hash field set at
-- start from settings.progress_max_records; absent or 0 keeps all), so a
-- chatty workflow cannot fill Redis. Seqs are dense, so the records to drop
-- are those with seq <= newest - max: the stream's oldest entries, dropped
-- together with their phase index members so a page and its bounds never
-- disagree. A script that has no phase index key (a system record written by
-- finish, resume...) stops at the first record of a phase it cannot unindex;
-- the next append that has the key catches up (at most 100 per append).
local function trim_progress(run_key, stream_key, newest, phase_index_key)
  local keep = tonumber(run_field(run_key, 'progress_max') or '0') or 0
  if keep <= 0 or newest <= keep then return end
  local old = redis.call('XRANGE', stream_key, '-', (newest - keep) .. '-0', 'COUNT', 100)
  local last = nil
  for _, entry in ipairs(old) do
    local fields, phase_id = entry[2], ''
    for i = 1, #fields, 2 do
      if fields[i] == 'phase_id' then phase_id = fields[i + 1] end
    end
    local seq = tonumber(string.match(entry[1], '^%d+'))
    if phase_id ~= '' then
      if not phase_index_key then break end
      redis.call('ZREM', phase_index_key, phase_id .. '|' .. string.format('%015d', seq))
    end
    last = seq
  end
  if last then redis.call('XTRIM', stream_key, 'MINID', (last + 1) .. '-0') end
end

-- == The run's history (client/history.py; the format: schema/history.py) ========
-- Every event of a run's history is recorded by the script that makes it
-- happen, in that same script, numbered by the run's 'events' counter: the
-- history is in the order its writes reached Redis (a cause is written before
-- what it causes), an event's number never changes, and a page reads events
-- by number, whatever the run's size. <data> is a JSON object's text or ''.
-- pcall: a stream that refused the number (never, short of a hand-edited
-- store) loses that event rather than leave this script's writes half done.
local function record_event(run_key, history_key, kind, key, at, data)
  if not history_key then error('record_event: no history key for ' .. kind) end
  local n = redis.call('HINCRBY', run_key, 'events', 1)
  redis.pcall('XADD', history_key, n .. '-0', 'k', kind, 'y', key or '', 'a', attempt_of(run_key), 't', at,
    'd', data or '')
  return n
end

-- Says on the namespace's events channel that the run's status changed, and
-- to what: "<run_id> status <status>" (broker/events.py parses it), so a
-- wait for the run's end reads it again only once that status is an end.
-- Every script that changes a run's status says so here.
local function announce_status(run_key, channel)
  local f = redis.call('HMGET', run_key, 'id', 'status')
  redis.call('PUBLISH', channel, f[1] .. ' status ' .. f[2])
end

-- Appends one progress record with the next per-run seq; returns the seq.
-- Records carry the attempt count users see, not the fencing epoch.
-- A record of a phase is also entered in the run's phase index (a zset of
-- "<phase_id>|<seq, 15 digits>", compared lexicographically), here, so that
-- no record can miss it: a phase's records then page in O(log n + page).
-- Only phase-less (system) records may come without the index key; that is
-- checked before any write, as Redis does not undo a script that fails.
-- A system record is an event of the run's history too (record_event), so a
-- script writing one names the history key, or false when it records the
-- event itself in another form (signal.lua).
local function append_progress(run_key, stream_key, kind, phase_id, message, _epoch, at, phase_index_key, history_key)
  if phase_id ~= '' and not phase_index_key then
    error('append_progress: a record of a phase needs the phase index key')
  end
  if kind == 'system' and history_key == nil then
    error('append_progress: a system record needs the history key')
  end
  local seq = redis.call('HINCRBY', run_key, 'next_seq', 1)
  redis.call('XADD', stream_key, seq .. '-0',
    'kind', kind, 'phase_id', phase_id, 'message', message, 'attempt', attempt_of(run_key), 'at', at)
  if phase_id ~= '' then
    redis.call('ZADD', phase_index_key, 0, phase_id .. '|' .. string.format('%015d', seq))
  end
  trim_progress(run_key, stream_key, seq, phase_index_key)
  if kind == 'system' and history_key then
    record_event(run_key, history_key, 'system', '', at, cjson.encode({message = message}))
  end
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

-- One sequence of the journal from index <start> on, as replay reads it:
-- {cut or '', hwm or '', entry<start>, value<start>, ...}; an entry is
-- "<epoch>:<identity>", a value is false when the op carries none. Parsed by
-- schema.parse_sequence (read_sequence.lua, and the tail activate.lua reads).
-- The journal field that holds the value of op <index> of <seq>, whose
-- entry is <entry>; nil for an op that carries none (a fan-out, a patch).
local function value_field(seq, index, entry)
  local ident = string.sub(entry, string.find(entry, ':', 1, true) + 1)
  local kind = string.sub(ident, 1, 1)
  if kind == 's' or kind == 'c' or kind == 'k' then return 'v:' .. string.sub(ident, 3) end
  if kind == 'a' then return 'a:' .. string.sub(ident, 3) end
  if kind == 't' or kind == 'u' or kind == 'z' or kind == 'g' or kind == 'd' then
    -- now()/uuid4() values, how a wait ended (false while it has not), a
    -- started child's run id (false until the child exists)
    return 'x:' .. seq .. ':' .. index
  end
  return nil
end

-- <fields> of hash <key> in HMGETs of at most 1000 (unpack's stack has
-- room for a few thousand values): one round trip into Redis for a whole
-- sequence's entries, one for their values, instead of one per field.
local function hash_values(key, fields)
  local out = {}
  for from = 1, #fields, 1000 do
    local got = redis.call('HMGET', key, unpack(fields, from, math.min(from + 999, #fields)))
    for i = 1, #got do out[from + i - 1] = got[i] end
  end
  return out
end

-- One sequence as replay reads it: {cut or '', high-water or '', last
-- compensation ('<epoch>:<index>', record_op.lua) or '', entry, value or
-- false, ...} from entry <start> (schema.parse_sequence).
local function sequence_reply(journal_key, seq, start, any_stepped)
  local head = redis.call('HMGET', journal_key, 'n:' .. seq, 'k:' .. seq, 'h:' .. seq, 'stepped', 'u:' .. seq)
  local count = tonumber(head[1] or '0')
  if any_stepped == nil then any_stepped = head[4] ~= false end
  local out = {head[2] or '', head[3] or '', head[5] or ''}
  local first = tonumber(start or '0')
  local names = {}
  for i = first, count - 1 do names[#names + 1] = 'o:' .. seq .. ':' .. i end
  local entries = hash_values(journal_key, names)
  -- Each op's value field and, in a journal with ops stepped over
  -- ('stepped'), its mark: an op a cancelled pass stepped over
  -- (step_over.lua) has no answer, ever.
  local wanted, at = {}, {}
  for n = 1, #names do
    local entry = entries[n] or '0:'
    entries[n] = entry
    local field = value_field(seq, first + n - 1, entry)
    if field then
      wanted[#wanted + 1] = field
      at[n] = #wanted
      if any_stepped then wanted[#wanted + 1] = 'so:' .. field end
    end
  end
  local values = hash_values(journal_key, wanted)
  for n = 1, #names do
    local value = false
    local k = at[n]
    if k and not (any_stepped and values[k + 1] == entries[n]) then value = values[k] end
    table.insert(out, entries[n])
    table.insert(out, value)
  end
  return out
end

-- Whole sequences args[first..] as sequence_reply gives them, stopping after
-- the one that spends the budget of entries (the first is always read), so
-- a task whose branches journaled long histories does not hold Redis with
-- one read (read_sequences.lua, branch_start.lua).
local function sequence_replies(journal_key, args, first, budget)
  local out = {}
  local any_stepped = redis.call('HEXISTS', journal_key, 'stepped') == 1  -- once for them all
  for i = first, #args do
    local reply = sequence_reply(journal_key, args[i], 0, any_stepped)
    out[#out + 1] = reply
    budget = budget - (#reply - 3) / 2
    if budget <= 0 then break end
  end
  return out
end

-- Forgets what belonged to an abandoned fan-out at <seq>:<index>: its
-- branches' outcomes, counters and histories must not be mistaken for those
-- of whatever op now stands at that index.
local function forget_fanout(journal_key, seq, index, width, epoch)
  local call = seq .. ':' .. index
  for j = 0, width - 1 do
    local branch = seq .. '.' .. index .. '.' .. j
    redis.call('HDEL', journal_key, 'r:' .. call .. ':' .. j, 'h:' .. branch, 'u:' .. branch)
    redis.call('HSET', journal_key, 'k:' .. branch, epoch .. ':-1')
  end
  redis.call('HDEL', journal_key, 'c:' .. call, 'd:' .. call, 's:' .. call)
end

-- Records op <index> of sequence <seq> with identity <ident>. Returns
-- (conflict, replaced, fresh, also): the live identity already there when it
-- differs (non-determinism), the dead identity this write replaced, if any,
-- whether the op is written here (not found journaled and alive), and the
-- journal field <also> (nil: none), read in the same HMGET (false: absent;
-- nothing here writes a 'v:' or 'x:' field).
local function record_op(journal_key, seq, index, ident, epoch, also)
  local field, count_field = 'o:' .. seq .. ':' .. index, 'n:' .. seq
  local read
  if also then
    read = redis.call('HMGET', journal_key, field, count_field, also)
  else
    read = redis.call('HMGET', journal_key, field, count_field)
  end
  local existing = read[1]
  if existing then
    local old = string.sub(existing, string.find(existing, ':', 1, true) + 1)
    if entry_alive(journal_key, seq, index, existing) then
      if old ~= ident then return old, nil end
      return nil, nil, nil, read[3]
    end
    redis.call('HSET', journal_key, field, epoch .. ':' .. ident)
    local kind = string.sub(old, 1, 1)
    if kind == 'p' or kind == 'l' then
      forget_fanout(journal_key, seq, index, tonumber(string.sub(old, 3)), epoch)
    end
    return nil, old, true, read[3]
  end
  if tonumber(index) + 1 > tonumber(read[2] or '0') then
    redis.call('HSET', journal_key, field, epoch .. ':' .. ident, count_field, tonumber(index) + 1)
  else
    redis.call('HSET', journal_key, field, epoch .. ':' .. ident)
  end
  return nil, nil, true, read[3]
end

-- Cuts sequence <seq> at op <index> for attempt <epoch>: entries after it
-- written by older attempts are abandoned. Progress records at or after
-- <position> (the position the op began at) are new from here on.
local function cut_sequence(journal_key, seq, index, epoch, position)
  local cut = epoch .. ':' .. index
  if redis.call('HGET', journal_key, 'k:' .. seq) ~= cut then
    redis.call('HSET', journal_key, 'k:' .. seq, cut)
    -- A cut can give signals back (claim_alive): the floors take_signal keeps are void.
    redis.call('HINCRBY', journal_key, 'cuts', 1)
  end
  local limit = tonumber(position) - 1
  local hwm = tonumber(redis.call('HGET', journal_key, 'h:' .. seq) or '-1')
  if hwm > limit then redis.call('HSET', journal_key, 'h:' .. seq, limit) end
end

-- Enters op <index> of sequence <seq> for attempt <epoch>, as a call and a
-- child start do: fenced; the older attempt's failure it re-runs cut first
-- (<cut>: '' or "<op index>:<position>", see cut_sequence); its identity
-- recorded, a replaced entry's wait due time cleared. Returns the script's
-- reply when it must stop there ({'conflict', identity}; the fence rule ran
-- before the script), else
-- nil, the op's place "<seq>:<index>", and the dead identity the op replaced
-- there (nil when none: see record_op).
local function enter_op(journal_key, epoch, seq, index, ident, cut)
  if cut ~= '' then
    local colon = string.find(cut, ':', 1, true)
    cut_sequence(journal_key, seq, string.sub(cut, 1, colon - 1), epoch, string.sub(cut, colon + 1))
  end
  local conflict, replaced = record_op(journal_key, seq, index, ident, epoch)
  if conflict then return {'conflict', conflict} end
  local at = seq .. ':' .. index
  if replaced then redis.call('HDEL', journal_key, 'wd:' .. at) end
  return nil, at, replaced
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
  add_attempt(run_key, 1)
  return redis.call('HINCRBY', run_key, 'epoch', step)
end

-- Rows of steps still running when their attempt ends can no longer finish
-- under its epoch: they become interrupted, not phantom running rows. Rows
-- are JSON objects (schema.StepRow); only their status changes here, and a
-- row that does not decode (corrupted) moves over as it is.
local function interrupt_steps(run_key, running_key, steps_key, history_key, now)
  local rows = redis.call('HGETALL', running_key)
  for i = 1, #rows, 2 do
    local ok, row = pcall(cjson.decode, rows[i + 1])
    if ok and type(row) == 'table' then
      row['status'] = 'interrupted'
      local text = cjson.encode(row)
      redis.call('HSET', steps_key, rows[i], text)
      record_event(run_key, history_key, 'step_interrupted', rows[i], now, text)
    else
      redis.call('HSET', steps_key, rows[i], rows[i + 1])
    end
  end
  redis.call('DEL', running_key)
  redis.call('HSET', run_key, 'steps_running', '0')
end

-- Agent turns queued or running when their attempt ends can no longer
-- finish under its epoch: no phantom live agents are left behind.
local function interrupt_agents(agents_key)
  local rows = redis.call('HGETALL', agents_key)
  for i = 1, #rows, 2 do
    -- A row that is not JSON (corrupted) is left as it is: it must not keep
    -- the run from settling or from being resumed.
    local ok, row = pcall(cjson.decode, rows[i + 1])
    if ok and type(row) == 'table' and (row['status'] == 'running' or row['status'] == 'queued') then
      row['status'] = 'interrupted'
      redis.call('HSET', agents_key, rows[i], cjson.encode(row))
    end
  end
end

-- == The namespace's indexes (index_run.lua, index_sync.lua) =============
-- A run's 'ixv' counts the changes of what its namespace's indexes hold of
-- it (its status, its waiting summary): bumped in the same script as the
-- change, so an index write carrying the version it read can never undo a
-- newer one (on a Redis Cluster the indexes are written apart: run_index.py).
local function index_touch(run_key)
  redis.call('HINCRBY', run_key, 'ixv', 1)
end

-- Sets the run's 'waiting' summary, counting a change for the indexes.
local function set_waiting(run_key, value)
  if (redis.call('HGET', run_key, 'waiting') or '') ~= value then
    redis.call('HSET', run_key, 'waiting', value)
    index_touch(run_key)
  end
end

-- Sets the run's status (and more fields: name, value, ...), counting the change.
local function set_status(run_key, status, ...)
  redis.call('HSET', run_key, 'status', status, ...)
  index_touch(run_key)
end

-- A run's place in its namespace's start order: "<created ms, 13 digits>
-- <start counter, 15 digits>", compared as text.
local function index_ord(created_ms, counter)
  return string.format('%013d%015d', tonumber(created_ms) or 0, tonumber(counter) or 0)
end

-- The index members of one run (layout: keys.py, broker/indexes.py), all
-- scored 0 in the namespace's lexicographic index, so one filter's runs are
-- one range of text, in start order. <waiting> is '1' when the run waits.
local function index_members(ord, status, workflow, waiting, wait_name, run_id)
  local tail = ord .. '|' .. run_id
  local members = {'t|' .. tail, 's|' .. status .. '|' .. tail, 'w|' .. workflow .. '|' .. tail,
    'sw|' .. status .. '|' .. workflow .. '|' .. tail, 'i|' .. run_id}
  if waiting == '1' then
    table.insert(members, 'a|' .. tail)
    if wait_name ~= '' then table.insert(members, 'n|' .. wait_name .. '|' .. tail) end
  end
  return members
end

-- A run's entry in the namespace's index state hash:
-- "<version>|<ord>|<status>|<workflow>|<waiting 0/1>|<wait name>".
local function index_state_parse(raw)
  if not raw then return nil end
  local v, ord, status, workflow, waiting, wait_name =
    string.match(raw, '^(%d+)|(%d+)|([^|]*)|([^|]*)|([01])|(.*)$')
  if not v then return nil end
  return {v = tonumber(v), ord = ord, status = status, workflow = workflow, waiting = waiting, wait_name = wait_name}
end

-- Takes one run out of every index and forgets its state.
local function index_drop(index_key, state_key, run_id)
  local old = index_state_parse(redis.call('HGET', state_key, run_id))
  redis.call('ZREM', index_key, 'i|' .. run_id)
  if old then
    for _, member in ipairs(index_members(old.ord, old.status, old.workflow, old.waiting, old.wait_name, run_id)) do
      redis.call('ZREM', index_key, member)
    end
  end
  redis.call('HDEL', state_key, run_id)
end

-- Puts one run's index members where its state says, unless the state the
-- index holds has a newer version. <waiting_json> is the run's 'waiting'
-- summary ('' or its JSON). Returns 'applied', 'same' or 'older'.
local function index_apply(index_key, state_key, run_id, version, ord, status, workflow, waiting_json)
  local waiting, wait_name = '0', ''
  if waiting_json and waiting_json ~= '' then
    waiting = '1'
    local ok, summary = pcall(cjson.decode, waiting_json)
    if ok and type(summary) == 'table' and type(summary['name']) == 'string' then wait_name = summary['name'] end
  end
  local new = version .. '|' .. ord .. '|' .. status .. '|' .. workflow .. '|' .. waiting .. '|' .. wait_name
  local raw = redis.call('HGET', state_key, run_id)
  if raw == new then return 'same' end
  local old = index_state_parse(raw)
  if old and old.v > tonumber(version) then return 'older' end
  local members, add = index_members(ord, status, workflow, waiting, wait_name, run_id), {}
  for _, member in ipairs(members) do add[member] = true end
  if old then
    for _, member in ipairs(index_members(old.ord, old.status, old.workflow, old.waiting, old.wait_name, run_id)) do
      if add[member] then add[member] = false else redis.call('ZREM', index_key, member) end
    end
  end
  for _, member in ipairs(members) do
    if add[member] then redis.call('ZADD', index_key, 0, member) end
  end
  redis.call('HSET', state_key, run_id, new)
  return 'applied'
end

-- A run settled for good or for now (completed, cancelled, error, halted;
-- not paused) starts its retention clock in the script that settles it:
-- every key of the run (all of KEYS, in the scripts that settle) expires
-- after <ttl> ms (0: kept for ever). resume.lua persists them again. Returns
-- the run's idempotency key ('' for none), which lives in its namespace's
-- slot and is expired by the caller.
-- <streams> (the run's progress and history) are compacted first: a
-- stream's last node keeps the room Redis sets aside for appends (up to
-- stream-node-max-bytes, 4 KB a stream), which a settled run never uses, so
-- DUMP and RESTORE write the same entries, ids and counters back at their
-- size (a 22-record stream: 4.7 KB -> 1.7 KB). A long stream is left as it
-- is: that room is a small part of it, and its copy would hold Redis longer.
-- A run settled for good is not compacted: its caller folds both streams
-- into its archive next (archive_run.lua).
local COMPACT_MAX_ENTRIES = 512
-- The statuses of a run settled for good (schema/archive.py: ARCHIVABLE):
-- it can never be resumed, and no script writes it again but its archive.
local ARCHIVABLE = {completed = true, cancelled = true}
local function retain_run(run_key, ttl, streams)
  if ARCHIVABLE[redis.call('HGET', run_key, 'status')] then streams = {} end
  for _, key in ipairs(streams) do
    if redis.call('XLEN', key) <= COMPACT_MAX_ENTRIES then
      local dumped = redis.call('DUMP', key)
      if dumped then redis.call('RESTORE', key, 0, dumped, 'REPLACE') end
    end
  end
  if tonumber(ttl) > 0 then
    for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  return redis.call('HGET', run_key, 'idempotency_key') or ''
end

local function made_progress(run_key)
  if run_field(run_key, 'recoveries') then
    redis.call('HDEL', run_key, 'recoveries')
    RUN_FIELDS[run_key .. '\0recoveries'] = false
  end
end

-- One more take-over with no journal entry since the last (made_progress).
local function count_recovery(run_key)
  RUN_FIELDS[run_key .. '\0recoveries'] = tostring(redis.call('HINCRBY', run_key, 'recoveries', 1))
end

-- Whether journaling <outcome> in a field that held <previous> (nil or false:
-- absent) is a new journal entry, the progress that starts the take-over
-- count again (SPEC 8): a field that was absent, or a value ('o', see
-- schema/outcomes.py). A failure in place of another is not: failures are
-- retried by every attempt, so a pass that re-runs a failed step, catches
-- its failure and then dies journals it again each time, and were that
-- progress such a run would be taken over for ever, never recovery_limit.
-- <outcome> nil: a field that holds no outcome (a now()/uuid4() value, in
-- place of the value of an op a cut abandoned: the next attempt replaces
-- it again), new only where it was absent.
local function journals_new(previous, outcome)
  return not previous or (outcome ~= nil and string.sub(outcome, 1, 1) == 'o')
end

-- A script that wakes owners runs twice for one call when its reply was lost
-- on the way (the caller retries on a broken connection, with the same
-- arguments): counted twice, or answered 'late' with no one to wake while the
-- first run's wake-ups wait in the live hash, never sent. The wake prefix is
-- new for each call, so the owners it woke are kept under it, and a second
-- run with that prefix answers what the first did and changes nothing.
local function woken_before(journal_key, prefix)
  return redis.call('HGET', journal_key, 'wk:' .. prefix)
end

local function remember_woken(journal_key, prefix, owners)
  redis.call('HSET', journal_key, 'wk:' .. prefix, owners)
end

-- == Branch outcomes (complete_branch.lua, complete_begin.lua) ==========
-- Was fan-out <call> dispatched in attempt <epoch>? Outcomes of any other
-- attempt's dispatch are refused ('stale').
local function dispatched_in(journal_key, call, epoch)
  local stamp = redis.call('HGET', journal_key, 'd:' .. call) or ''
  return string.sub(stamp, 1, #epoch + 1) == epoch .. ':'
end

-- Journals the outcome of branch <index> of <call>; true when the
-- coordinator must be woken: it was the last outstanding branch, or a fatal
-- one. A second delivery writes nothing and wakes again when everything is
-- in, in case the first died between journaling and waking the coordinator.
local function branch_outcome(run_key, journal_key, call, index, outcome, epoch)
  local field = 'r:' .. call .. ':' .. index
  local counter = 'c:' .. call
  local current = redis.call('HGET', journal_key, field)
  if current and not is_stale_failure(current, epoch) then
    return tonumber(redis.call('HGET', journal_key, counter) or '0') <= 0
  end
  redis.call('HSET', journal_key, field, outcome)
  if journals_new(current, outcome) then made_progress(run_key) end
  local left = redis.call('HINCRBY', journal_key, counter, -1)
  return left <= 0 or string.sub(outcome, 1, 1) == 'f'
end

-- == Liveness: the run's work in flight ==================================
-- The live hash (KEYS "live" of a run) holds one entry per Celery message
-- of the current attempt that has not finished, by task id:
--   'q|<kind>|<due ms>'  sent, not started yet: it waits in queue <kind>
--                        ('c' coordinator, 's' steps, 'a' agents) and is
--                        due at <due> (later than sent for a countdown);
--                        '|gone <ms>' is appended once the queue was found
--                        empty after <due> (see liveness)
--   'l|<ms>'             held by a worker found dead at <ms>: lost
--   'x|<expiry ms>'      running on a worker, whose heartbeat renews it
-- An entry is added in the same script that decides to send its message,
-- turned 'x' by the script that starts the task, renewed by its heartbeat
-- and deleted by the script that ends it. So a run is alive while some
-- entry is (see liveness), and the active-time clock runs while any exists:
-- a run with nothing in flight is waiting for the outside world (a timer,
-- a signal, a task of the fleet), and waiting is not active time (SPEC 6).

local function clock_start(run_key, now)
  local f = redis.call('HMGET', run_key, 'status', 'active_since')
  if f[1] == 'running' and (not f[2] or f[2] == '') then
    redis.call('HSET', run_key, 'active_since', now)
  end
end

local function clock_stop(run_key, now)
  local f = redis.call('HMGET', run_key, 'active_ms', 'active_since')
  if f[2] and f[2] ~= '' then
    redis.call('HSET', run_key, 'active_ms', tonumber(f[1] or '0') + tonumber(now) - tonumber(f[2]),
      'active_since', '')
  end
end

local function token_queued(run_key, live_key, id, kind, due, now)
  if id == '' then return end
  if redis.call('HLEN', live_key) == 0 then clock_start(run_key, now) end
  redis.call('HSET', live_key, id, 'q|' .. kind .. '|' .. due)
end

local function token_running(run_key, live_key, id, expiry, now)
  if id == '' then return end
  if redis.call('HLEN', live_key) == 0 then clock_start(run_key, now) end
  redis.call('HSET', live_key, id, 'x|' .. expiry)
  local lease = tonumber(redis.call('HGET', run_key, 'lease_until') or '0')
  if tonumber(expiry) > lease then redis.call('HSET', run_key, 'lease_until', expiry) end
end

local function token_done(run_key, live_key, id, now)
  if id == '' then return end
  if redis.call('HDEL', live_key, id) == 1 and redis.call('HLEN', live_key) == 0 then
    clock_stop(run_key, now)
  end
end

-- A run's work is all gone: it settled, or a new attempt takes over (whose
-- replay registers again what it still waits for).
local function tokens_clear(run_key, live_key, waits_key, now)
  clock_stop(run_key, now)
  redis.call('DEL', live_key, waits_key)
  set_waiting(run_key, '')
end

-- The end of a dead attempt's active time: the moment its lease ran out (it
-- renewed it while it worked), or now when that is sooner (a forced take-over
-- of a live attempt). The time the run then lay dead, until a recovery or a
-- resume found it, is time between attempts, not active time (SPEC 6). Never
-- before the clock last started (a message that died queued, its lease older).
local function attempt_end(run_key, now)
  local f = redis.call('HMGET', run_key, 'lease_until', 'active_since')
  local lease, since = tonumber(f[1] or ''), tonumber(f[2] or '')
  if not lease or lease >= now then return now end
  if since and since > lease then return math.min(since, now) end
  return lease
end

-- The queue a message of an owner goes to: the coordinator's, or a branch's.
local function owner_kind(owner)
  if owner == 'm' then return 'c' end
  return 's'
end

-- Is the attempt alive? Returns 'alive' or 'waiting' with the ms the sweep
-- should look again ('' for never by itself), or 'dead' with why:
--  * a message held by a worker that stopped beating (mark_lost.lua): it
--    died with that worker, queued in its prefetch or running;
--  * a running message whose heartbeat stopped: its worker died (its work
--    is lost even if other messages of the run are still alive);
--  * a queued message that left its queue and never started: <empty> maps a
--    queue kind to the last ms the sweep found that queue empty in the
--    broker. Empty after the message was due means some worker took it; a
--    live worker starts what it takes at once (Celery's prefetch limit is
--    its free slots), so a message still not started START_MARGIN_MS after
--    it was first found gone (the entry is marked '|gone <ms>') died with the
--    worker that took it. A queue that stays busy (a backlog) never makes a
--    message look lost, however long it waits. A message its worker said it
--    received ('|held <ms>', received.lua) is not judged so: it may wait for
--    its countdown or a slot. It is dead when it has not started a lease
--    after it was received (or due): a live worker starts what it holds
--    within that, and Celery's prefork pool has been seen to lose a job it
--    handed to a child. If its worker dies, its silence marks it lost first;
--  * nothing in flight and nothing waited for: the attempt ended without
--    passing the run on (it died between two writes), or the message that
--    would have passed it on was never sent (unsent.lua);
--  * nothing in flight, and a cancel or a pause asked for: the coordinator
--    message that would act on it was never sent, and waiting for a timer or
--    a signal would leave the request unheard (the take-over keeps it).
-- Only waits remain: the run waits for the outside world, which is not death.
-- With <spare> (the sweep, automatic recovery off: examine.lua) a coordinator
-- message lost before it started (queued or held, as above), or the one a
-- cancel or pause with nothing in flight lacks, is no death of the attempt:
-- the verdict is 'lost' with that message's id ('' for none), for a wake at
-- the same epoch, unless a death above is found too. A branch or agent
-- message carries what only its sender knows: its loss stays a death.
-- A message is counted before it is published, so the empty-queue rule
-- judges it only by a look at its queue made SEND_MARGIN_MS after it was
-- due: a look between the count and the publish saw no message that was
-- about to be there.
local START_MARGIN_MS = 5000
local SEND_MARGIN_MS = 2000
local function liveness(run_key, live_key, waits_key, now, lease_ms, empty, spare)
  local entries = redis.call('HGETALL', live_key)
  local next_check, lost = nil, nil
  for i = 1, #entries, 2 do
    local id, value = entries[i], entries[i + 1]
    local check
    if string.sub(value, 1, 2) == 'l|' then
      return 'dead', 'the worker holding task ' .. id .. ' died'
    elseif string.sub(value, 1, 2) == 'x|' then
      local expiry = tonumber(string.sub(value, 3)) or 0
      if expiry <= now then return 'dead', 'its worker stopped renewing task ' .. id end
      check = expiry
    else
      local kind, due, rest = string.match(value, '^q|(%a)|(%d+)(.*)$')
      due = tonumber(due or '0')
      local gone = tonumber(string.match(rest or '', '^|gone (%d+)$') or '')
      local held = tonumber(string.match(rest or '', '^|held (%d+)$') or '')
      local resend = spare and kind == 'c'
      if held then
        local since = math.max(held, due)
        if now - since < lease_ms then
          check = since + lease_ms
        elseif resend then
          lost = lost or id
        else
          return 'dead', 'task ' .. id .. ' was received and never started'
        end
      elseif gone and now - gone >= START_MARGIN_MS then
        if not resend then return 'dead', 'task ' .. id .. ' left its queue and never started' end
        lost = lost or id
      else
        if not gone and tonumber(empty[kind or ''] or '0') > due + SEND_MARGIN_MS then
          gone = now
          redis.call('HSET', live_key, id, 'q|' .. kind .. '|' .. due .. '|gone ' .. now)
        end
        if gone then check = gone + START_MARGIN_MS else check = math.max(due + SEND_MARGIN_MS, now + lease_ms) end
      end
    end
    if check and (not next_check or check < next_check) then next_check = check end
  end
  if lost then return 'lost', lost end
  local waits = redis.call('HVALS', waits_key)
  local due = nil
  for _, raw in ipairs(waits) do
    local ok, wait = pcall(cjson.decode, raw)
    if ok and type(wait) == 'table' and type(wait['until']) == 'number' then
      if not due or wait['until'] < due then due = wait['until'] end
    end
  end
  if next_check then
    if due and due < next_check then next_check = due end
    return 'alive', next_check
  end
  local f = redis.call('HMGET', run_key, 'lease_until', 'cancel', 'pause')
  if #waits == 0 then
    if tonumber(f[1] or '0') > now then return 'alive', tonumber(f[1]) end
    return 'dead', 'nothing of it is in flight'
  end
  if f[2] == '1' or f[3] == '1' then
    if spare then return 'lost', '' end
    return 'dead', 'a ' .. (f[2] == '1' and 'cancel' or 'pause') .. ' it was asked for has nothing in flight to act on it'
  end
  return 'waiting', due or ''
end

-- <empty> as the sweep passes it: "c=<ms>,s=<ms>,a=<ms>", when each queue
-- was last found empty.
local function parse_empty(text)
  local empty = {}
  for kind, ms in string.gmatch(text or '', '(%a)=(%d+)') do empty[kind] = ms end
  return empty
end

-- Journals op <ident> at <index> of sequence <seq> and, with a value field,
-- its value ("v:<key>" a step outcome, "x:<seq>:<i>" a now()/uuid4() value);
-- for a step, settles its row (''  deletes it). The body of record_op.lua,
-- and of commit_begin.lua's first half.
-- Returns ('conflict', live identity) for non-determinism, ('winner', value)
-- when the value field already held a live outcome (first write wins, and
-- the caller must use that one), else ('ok', '').
local function commit_call(run_key, journal_key, steps_key, running_key, epoch, seq, index, ident,
                           value_field, value, step_key, step_row, history_key, now)
  local conflict, replaced, fresh, current = record_op(journal_key, seq, index, ident, epoch,
                                                     value_field ~= '' and value_field or nil)
  if conflict then return 'conflict', conflict end
  if fresh and string.sub(ident, 1, 2) == 'v|' then
    record_event(run_key, history_key, 'patched', string.sub(ident, 3), now,
      cjson.encode({op = seq .. ':' .. index}))
  end
  local winner = ''
  if value_field ~= '' then
    local previous = current
    local is_step = string.sub(value_field, 1, 2) == 'v:'
    -- A now()/uuid4() value of an abandoned op is not this op's value.
    if current and not is_step and replaced then current = nil end
    if current and not (is_step and is_stale_failure(current, epoch)) then
      winner = current
    else
      redis.call('HSET', journal_key, value_field, value)
      if journals_new(previous, is_step and value or nil) then made_progress(run_key) end
      if step_key ~= '' and string.sub(value, 1, 1) == 'o' then
        redis.call('HINCRBY', run_key, 'steps_done', 1)
      end
      if is_step and step_key ~= '' and step_row ~= '' then
        local kind = string.sub(value, 1, 1) == 'o' and 'step_completed' or 'step_failed'
        record_event(run_key, history_key, kind, step_key, now, step_row)
      end
    end
  end
  if step_key ~= '' then
    if redis.call('HDEL', running_key, step_key) == 1 then
      redis.call('HINCRBY', run_key, 'steps_running', -1)
    end
    if step_row == '' then
      redis.call('HDEL', steps_key, step_key)
    else
      redis.call('HSET', steps_key, step_key, step_row)
    end
  end
  if winner ~= '' then return 'winner', winner end
  return 'ok', ''
end

-- Runs before a call of sequence <seq>: flushes its buffered progress
-- records (dropping those an earlier replay already wrote) and, for a step,
-- shows the step as running. <cut> is '' or "<op index>:<position>" (see
-- cut_sequence); <records> is a flat list of position, kind, phase id,
-- message, from <first> on, <count> records. The body of begin_op.lua, and
-- of commit_begin.lua's second half.
-- Returns the step's live journaled outcome when another sequence (or an
-- attempt that died before recording this op) already journaled the key,
-- else '' (also when a pause holds the main body's step back); and the run's
-- flags, as flags() gives them (read with the ceilings, check_limits).
local function begin_call(run_key, progress_key, journal_key, running_key, phases_key, epoch, now, channel,
                          seq, cut, step_key, step_row, records, first, count, history_key)
  if cut ~= '' then
    local colon = string.find(cut, ':', 1, true)
    cut_sequence(journal_key, seq, string.sub(cut, 1, colon - 1), epoch, string.sub(cut, colon + 1))
  end
  local hwm_field = 'h:' .. seq
  local hwm = tonumber(redis.call('HGET', journal_key, hwm_field) or '-1')
  local start = hwm
  local wrote = false
  for i = 0, count - 1 do
    local base = first + i * 4
    local pos = tonumber(records[base])
    if pos > hwm then
      local kind, phase_id, message = records[base + 1], records[base + 2], records[base + 3]
      append_progress(run_key, progress_key, kind, phase_id, message, epoch, now, phases_key, history_key)
      if kind == 'phase' then
        local previous = redis.call('HGET', run_key, 'phase_id')
        if previous and previous ~= '' and previous ~= phase_id then
          redis.call('HSET', run_key, 'pe:' .. previous, now)
          -- A phase entered again is active again: the end of its last stay is no end.
          redis.call('HDEL', run_key, 'pe:' .. phase_id)
        end
        redis.call('HSET', run_key, 'phase', message, 'phase_id', phase_id)
        redis.call('HSETNX', run_key, 'ps:' .. phase_id, now)
      end
      hwm = pos
      wrote = true
    end
  end
  if hwm ~= start then redis.call('HSET', journal_key, hwm_field, hwm) end
  local _, f = check_limits(run_key, tonumber(now))
  -- A pause stops the main body before its next step: that step does not
  -- show as running (the attempt sees the flag and settles as paused).
  if seq == 'm' and step_key ~= '' and f[2] == '1' then step_key = '' end
  local outcome = ''
  if step_key ~= '' then
    local current = redis.call('HGET', journal_key, 'v:' .. step_key)
    if current and not is_stale_failure(current, epoch) then outcome = current end
  end
  if step_key ~= '' and outcome == '' then
    if redis.call('HSET', running_key, step_key, step_row) == 1 then
      redis.call('HINCRBY', run_key, 'steps_running', 1)
    end
  end
  if wrote then
    redis.call('PUBLISH', channel, run_field(run_key, 'id') .. ' progress')
  end
  return outcome, f
end

-- == Durable waits: timers and signals ====================================
-- A sequence that waits for the outside world (ctx.sleep, wait_for_signal,
-- ctx.call: a task of the fleet, whose worker may know nothing of runs)
-- leaves an entry in the run's waits hash, by the op's "<seq>:<i>":
-- {"owner", "kind" ('timer', 'signal', 'call' or 'child'), "name", "until" (ms, or
-- absent)}.
-- Its owner is woken (a queued message, see token_queued) when the timer is
-- due (examine.lua) or the signal arrives (signal.lua), which journal the
-- wait's outcome as they wake it (end_wait, below), or else its replay does
-- (wait.lua). The run hash's 'waiting' field
-- sums the waits up for snapshot.waiting_for: the one due first, a wait
-- without a time only when none has one.
local function refresh_waiting(run_key, waits_key)
  local best, best_due = nil, nil
  for _, raw in ipairs(redis.call('HVALS', waits_key)) do
    local ok, wait = pcall(cjson.decode, raw)
    -- A task call (kind 'call') is work of the fleet, not a wait for the
    -- outside world: it has its own step row, and no place in waiting_for.
    if ok and type(wait) == 'table' and wait['kind'] ~= 'call' then
      local due = type(wait['until']) == 'number' and wait['until'] or nil
      if not best or (due and (not best_due or due < best_due)) then best, best_due = wait, due end
    end
  end
  if not best then
    set_waiting(run_key, '')
    return
  end
  local summary = {kind = best['kind'], name = best['name']}
  if best_due then summary['until'] = best_due end
  set_waiting(run_key, cjson.encode(summary))
end

-- Signals of a run live in its signals hash, per name, in arrival order:
-- 'n:<name>' how many arrived, 'p:<name>:<k>' the k-th one's JSON payload,
-- 't:<name>:<k>' when it arrived, 'k:<name>:<k>' the wait op ("<seq>:<i>")
-- that took it. A claim counts only while that op still stands in the
-- journal as a live wait for <name> whose outcome names signal k: a wait
-- abandoned by a newer attempt (a cut) gives its signal back, so no signal
-- is ever lost to a future that did not happen.
local function claim_alive(journal_key, at, name, k)
  local colon = string.find(at, ':[^:]*$')
  if not colon then return false end
  local seq, index = string.sub(at, 1, colon - 1), string.sub(at, colon + 1)
  local entry = redis.call('HGET', journal_key, 'o:' .. at)
  if not entry then return false end
  local ident = string.sub(entry, string.find(entry, ':', 1, true) + 1)
  if ident ~= 'g|' .. name or not entry_alive(journal_key, seq, index, entry) then return false end
  local outcome = redis.call('HGET', journal_key, 'x:' .. at)
  return outcome ~= false and outcome ~= nil and string.find(outcome, '"index":' .. k .. ',', 1, true) ~= nil
end

-- The first signal of <name> no live wait has taken, claimed for the wait
-- op <at>: its outcome JSON, or nil when none is left. Given <due> (ms: the
-- time-out of a wait that began before), it takes only a signal that
-- arrived by then: one that came later came after the time-out passed
-- (SPEC 5: received is false), though the wait ends only now (its run was
-- paused, halted or down, or the sweep had not fired it yet), and is kept
-- for the next wait. Signals of a name arrive in order: none after it is due
-- either. A wait as it begins takes what is there (its due time is the
-- worker's clock, a signal's time its sender's).
-- Signals 1..k of a name all claimed by live waits stay so until a cut gives
-- one back, and cuts are counted ('cuts' in the journal): 'f:<name>' keeps
-- "<cuts>:<k>", so a wait looks from k + 1 on while no cut came since,
-- instead of walking every signal of the name the run ever received.
local function take_signal(journal_key, signals_key, name, at, due)
  local received = tonumber(redis.call('HGET', signals_key, 'n:' .. name) or '0')
  local cuts = redis.call('HGET', journal_key, 'cuts') or '0'
  local floor_cuts, floor = string.match(redis.call('HGET', signals_key, 'f:' .. name) or '', '^(%d+):(%d+)$')
  local first = floor_cuts == cuts and tonumber(floor) + 1 or 1
  local claimed = first - 1  -- signals 1..claimed are all taken by live waits
  local taken = nil
  for k = first, received do
    local claim = redis.call('HGET', signals_key, 'k:' .. name .. ':' .. k)
    -- A claim naming this very op is a replaced op's (wait.lua takes a
    -- signal only for an op without an outcome, and writes both together).
    if not claim or claim == at or not claim_alive(journal_key, claim, name, k) then
      if due and tonumber(redis.call('HGET', signals_key, 't:' .. name .. ':' .. k) or '0') > due then break end
      redis.call('HSET', signals_key, 'k:' .. name .. ':' .. k, at)
      local payload = redis.call('HGET', signals_key, 'p:' .. name .. ':' .. k) or 'null'
      taken = '{"received":true,"index":' .. k .. ',"payload":' .. payload .. '}'
    end
    if claimed == k - 1 then claimed = k end
    if taken then break end
  end
  if claimed >= first then redis.call('HSET', signals_key, 'f:' .. name, cuts .. ':' .. claimed) end
  return taken
end

-- Wakes the owner of a call's wait at field <at> (found by the call's row)
-- if <match> picks it, as wake_waits would: a call's wait has no place in
-- the 'waiting' summary, so nothing else is read. Returns {owner}, or nil
-- when no matching wait is there (the caller then looks through them all).
local function wake_call_wait(run_key, waits_key, live_key, prefix, now, at, match)
  if at == '' then return nil end
  local raw = redis.call('HGET', waits_key, at)
  if not raw then return nil end
  local ok, wait = pcall(cjson.decode, raw)
  if not ok or type(wait) ~= 'table' or not match(wait) then return nil end
  redis.call('HDEL', waits_key, at)
  local owner = tostring(wait['owner'])
  token_queued(run_key, live_key, prefix .. '-1', owner_kind(owner), now, now)
  return {owner}
end

-- Wakes the owners of the waits that <match>(wait, its field "<seq>:<i>")
-- picks (removing the waits); each gets a queued coordinator or branch
-- message "<prefix>-<n>". Returns the owners, in the order of their messages.
local function wake_waits(run_key, waits_key, live_key, prefix, now, match)
  local entries = redis.call('HGETALL', waits_key)
  local owners, seen, summarized = {}, {}, false
  for i = 1, #entries, 2 do
    local ok, wait = pcall(cjson.decode, entries[i + 1])
    if ok and type(wait) == 'table' and match(wait, entries[i]) then
      redis.call('HDEL', waits_key, entries[i])
      summarized = summarized or wait['kind'] ~= 'call'
      local owner = tostring(wait['owner'])
      if not seen[owner] then
        seen[owner] = true
        table.insert(owners, owner)
        token_queued(run_key, live_key, prefix .. '-' .. #owners, owner_kind(owner), now, now)
      end
    end
  end
  if summarized then refresh_waiting(run_key, waits_key) end
  return owners
end

-- How a timer ends (wait.lua, fire_timer): its outcome in the journal.
local TIMER_FIRED = '{"fired":true}'

-- Whether the op at <at> ("<seq>:<i>") is a wait of identity <ident>, alive
-- and not ended: one the script that wakes its owner may end itself, as
-- wait.lua would once the owner's replay reached it. Not so, and left to the
-- replay that reaches that index, as before: what a cut abandoned, what a
-- cancelled pass stepped over (step_over.lua: no answer, ever), any wait of
-- a run asked to cancel (its pass never reaches a wait again), and an entry
-- that cannot be read (the pass settles the run corrupt; the sweep goes on).
local function open_wait(run_key, journal_key, at, ident)
  if redis.call('HGET', run_key, 'cancel') == '1' then return false end
  local seq, index = string.match(at, '^(.*):(%d+)$')
  local entry = seq and redis.call('HGET', journal_key, 'o:' .. at)
  if not entry or string.match(entry, '^%d+:(.*)$') ~= ident then return false end
  if redis.call('HGET', journal_key, 'so:x:' .. at) == entry then return false end
  local ok, alive = pcall(entry_alive, journal_key, seq, index, entry)
  return ok and alive and redis.call('HEXISTS', journal_key, 'x:' .. at) == 0
end

-- A wake that carries its wait's end (a due timer, examine.lua; a signal,
-- signal.lua) writes it as wait.lua writes it: the owner's pass then finds
-- it in the sequence it reads with its lock (the tail activate.lua reads)
-- and makes no round trip for the wait.
local function end_wait(run_key, journal_key, at, outcome, now_arg)
  redis.call('HSET', journal_key, 'x:' .. at, outcome, 'wf:' .. at, now_arg)
  made_progress(run_key)
end

local function fire_timer(run_key, journal_key, history_key, at, due, now_arg)
  if not open_wait(run_key, journal_key, at, 'z|') then return end
  end_wait(run_key, journal_key, at, TIMER_FIRED, now_arg)
  record_event(run_key, history_key, 'timer_fired', at, now_arg, cjson.encode({op = at, ['until'] = due}))
end

-- A signal of <name> came for the wait at <at>: it takes the first signal
-- of that name no live wait has taken (take_signal) and ends. Returns true
-- (taken: wake its owner), false (none left for it: it waits on, unwoken)
-- or nil (not a wait this script may end: wake its owner, whose replay decides).
local function signal_wait(run_key, journal_key, signals_key, name, at, now_arg)
  if not open_wait(run_key, journal_key, at, 'g|' .. name) then return nil end
  local outcome = take_signal(journal_key, signals_key, name, at,
    tonumber(redis.call('HGET', journal_key, 'wd:' .. at) or ''))
  if not outcome then return false end
  end_wait(run_key, journal_key, at, outcome, now_arg)
  return true
end

-- == Child runs (ctx.child) ==============================================
-- A sequence waiting for a child run leaves a wait of kind 'child', named
-- by the child's run id, at the op's "<seq>:<i>" (child.lua). The 'waiting'
-- summary follows such waits in O(1), as refresh_waiting would leave it (a
-- fan-out of children waits on thousands, and every child's end would read
-- them all): a new wait takes the summary when none is there or it is due
-- first; only the end of the wait the summary names reads the others again.
local function summarize_child_wait(run_key, wait)
  local raw = redis.call('HGET', run_key, 'waiting')
  if raw and raw ~= '' then
    local ok, current = pcall(cjson.decode, raw)
    if ok and type(current) == 'table' then
      if not wait['until'] then return end
      if type(current['until']) == 'number' and current['until'] <= wait['until'] then return end
    end
  end
  local summary = {kind = 'child', name = wait['name']}
  if wait['until'] then summary['until'] = wait['until'] end
  set_waiting(run_key, cjson.encode(summary))
end

local function end_child_wait(run_key, waits_key, at, child_id)
  if redis.call('HDEL', waits_key, at) == 0 then return end
  local summary = redis.call('HGET', run_key, 'waiting') or ''
  if string.find(summary, child_id, 1, true) then refresh_waiting(run_key, waits_key) end
end

-- Takes the activation lock of a run for one coordinator pass (activate.lua,
-- and call_done.lua when the main body's pass runs where the answer came),
-- the caller's fence already checked. <token> is the pass's task id; <resend>
-- the id of the message that comes back if another pass holds the lock; with
-- <seq>, the tail of that sequence from <start> on is read once the lock is
-- taken. With <soft> ('1'), a lock another pass holds is left as it is: the
-- caller waits for that pass where it runs, and activates after it.
-- Returns {'ok', cancel, pause, limit, tail...}, {'busy', ms until the
-- resend is due}, {'held'} (soft, and busy) or {'settled'} (paused).
local function activate_run(run_key, progress_key, live_key, journal_key, epoch, token, now_arg, lock_ms, lease_ms,
                            channel, resend, seq, start, soft, history_key)
  local now = tonumber(now_arg)
  if redis.call('HGET', run_key, 'status') == 'paused' then return {'settled'} end
  local lock = redis.call('HMGET', run_key, 'lock', 'lock_until')
  if lock[1] and lock[1] ~= '' and lock[1] ~= token and tonumber(lock[2] or '0') > now then
    if soft == '1' then return {'held'} end
    redis.call('HSET', run_key, 'wake', '1')
    local wait = tonumber(lock[2]) - now + 100
    token_done(run_key, live_key, token, now)
    token_queued(run_key, live_key, resend, 'c', now + wait, now)
    return {'busy', wait}
  end
  -- A pass runs: a worker that knows the workflow has it (see requeue.lua).
  redis.call('HSET', run_key, 'lock', token, 'lock_until', now + tonumber(lock_ms), 'wake', '0', 'unserved_since', '',
    'unserved_passes', '0')
  if redis.call('HGET', run_key, 'status') == 'pending' then
    set_status(run_key, 'running', 'started_at', now_arg, 'updated_at', now_arg, 'active_since', '')
    append_progress(run_key, progress_key, 'system', '', 'Attempt ' .. attempt_of(run_key) .. ' started', epoch,
      now_arg, nil, history_key)
    announce_status(run_key, channel)
    clock_start(run_key, now)
    redis.call('PERSIST', run_key)  -- see create_run.lua
    redis.call('PERSIST', live_key)
  end
  token_running(run_key, live_key, token, now + tonumber(lease_ms), now)
  local f = flags(run_key)
  local reply = {'ok', f[1], f[2], f[3]}
  if seq and seq ~= '' then
    for _, item in ipairs(sequence_reply(journal_key, seq, start)) do table.insert(reply, item) end
  end
  return reply
end

-- == Throttles (throttle_*.lua; the layout: keys.py) ======================
-- A throttle's keys are all in its own slot, passed in KEYS from <first> on
-- in the order of keys.ThrottleKeys. A waiter is a holder "<run id>|<op>" of
-- attempt <epoch>; its rank orders the queue (priority, then arrival), its
-- key is its throttle key ('' for none). Admission is O(log n) per waiter
-- admitted, whatever the number of waiters and keys.
local function throttle_keys(first)
  return {conf = KEYS[first], holders = KEYS[first + 1], waiters = KEYS[first + 2], queue = KEYS[first + 3],
    ready = KEYS[first + 4], keys = KEYS[first + 5], taken = KEYS[first + 6], ktaken = KEYS[first + 7],
    later = KEYS[first + 8]}
end

local function throttle_conf(T)
  local f = redis.call('HMGET', T.conf, 'concurrency', 'rate_n', 'rate_ms', 'pk_concurrency', 'pk_rate_n', 'pk_rate_ms')
  return {c = tonumber(f[1] or ''), rn = tonumber(f[2] or ''), rms = tonumber(f[3] or ''),
    kc = tonumber(f[4] or ''), krn = tonumber(f[5] or ''), krms = tonumber(f[6] or '')}
end

-- "<epoch>|<since>|<rank>|<key>" of a waiter, "<epoch>|<since>|<key>" of a holder.
local function throttle_waiter(raw)
  return string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
end

local function throttle_holder(raw)
  return string.match(raw, '^([^|]*)|([^|]*)|(.*)$')
end

-- Offers the first waiter of <key> to the ready set (whether it may go is
-- checked when it comes up: a key full or rate-bound drops out then).
local function throttle_offer(T, key)
  local head = redis.call('ZRANGEBYLEX', T.queue, '[' .. key .. '\0', '(' .. key .. '\1', 'LIMIT', 0, 1)[1]
  if head then redis.call('ZADD', T.ready, 0, string.sub(head, #key + 2)) end
end

local function throttle_key_full(T, conf, key)
  return conf.kc ~= nil and tonumber(redis.call('HGET', T.keys, key) or '0') >= conf.kc
end

-- When <key> may take its next slot under its own rate: nil for now.
local function throttle_key_later(T, conf, key, now)
  if not conf.krn then return nil end
  redis.call('ZREMRANGEBYLEX', T.ktaken, '[' .. key .. '\0', '(' .. key .. '\0' .. string.format('%013d', now - conf.krms + 1))
  local from, to = '[' .. key .. '\0', '(' .. key .. '\1'
  if redis.call('ZLEXCOUNT', T.ktaken, from, to) < conf.krn then return nil end
  local oldest = redis.call('ZRANGEBYLEX', T.ktaken, from, to, 'LIMIT', 0, 1)[1]
  return tonumber(string.sub(oldest, #key + 2, #key + 14)) + conf.krms
end

-- A waiter enters the queue; offered at once unless its key may not go.
local function throttle_enqueue(T, holder, epoch, key, priority, now)
  local seq = redis.call('HINCRBY', T.conf, 'seq', 1)
  local rank = string.format('%010d%015d', 1000000000 - tonumber(priority), seq)
  redis.call('HSET', T.waiters, holder, epoch .. '|' .. now .. '|' .. rank .. '|' .. key)
  redis.call('ZADD', T.queue, 0, key .. '\0' .. rank .. '|' .. holder)
  if not redis.call('ZSCORE', T.later, key) then redis.call('ZADD', T.ready, 0, rank .. '|' .. holder) end
end

-- Takes holder out of the queue (a cancelled waiter, a dead attempt's).
local function throttle_dequeue(T, holder, raw)
  local _, _, rank, key = throttle_waiter(raw)
  redis.call('HDEL', T.waiters, holder)
  redis.call('ZREM', T.queue, key .. '\0' .. rank .. '|' .. holder)
  redis.call('ZREM', T.ready, rank .. '|' .. holder)
  throttle_offer(T, key)
end

-- Gives holder's slot back: its key may take another.
local function throttle_give_back(T, holder, raw)
  local _, _, key = throttle_holder(raw)
  redis.call('HDEL', T.holders, holder)
  if redis.call('HINCRBY', T.keys, key, -1) <= 0 then redis.call('HDEL', T.keys, key) end
  throttle_offer(T, key)
end

-- Gives slots to waiters while the throttle allows, in rank order. Returns
-- the admitted {holder, epoch, ...} and when the next admission may be
-- possible by time alone (a rate's window, a key's rate), or nil.
local function throttle_admit(T, now)
  local conf = throttle_conf(T)
  local granted = {}
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', T.later, '-inf', now)) do
    redis.call('ZREM', T.later, key)
    throttle_offer(T, key)
  end
  local next_due = nil
  while true do
    if conf.c and redis.call('HLEN', T.holders) >= conf.c then break end
    if conf.rn then
      redis.call('ZREMRANGEBYSCORE', T.taken, '-inf', now - conf.rms)
      if redis.call('ZCARD', T.taken) >= conf.rn then
        if redis.call('HLEN', T.waiters) > 0 then
          next_due = tonumber(redis.call('ZRANGE', T.taken, 0, 0, 'WITHSCORES')[2]) + conf.rms
        end
        break
      end
    end
    local member = redis.call('ZRANGEBYLEX', T.ready, '-', '+', 'LIMIT', 0, 1)[1]
    if not member then break end
    redis.call('ZREM', T.ready, member)
    local holder = string.sub(member, 27)
    local raw = redis.call('HGET', T.waiters, holder)
    if raw then
      local epoch, _, rank, key = throttle_waiter(raw)
      if rank == string.sub(member, 1, 25) and not throttle_key_full(T, conf, key) then
        local later = throttle_key_later(T, conf, key, now)
        if later then
          redis.call('ZADD', T.later, later, key)
        else
          redis.call('HDEL', T.waiters, holder)
          redis.call('ZREM', T.queue, key .. '\0' .. member)
          redis.call('HSET', T.holders, holder, epoch .. '|' .. now .. '|' .. key)
          redis.call('HINCRBY', T.keys, key, 1)
          if conf.rn then redis.call('ZADD', T.taken, now, now .. '|' .. holder) end
          if conf.krn then redis.call('ZADD', T.ktaken, 0, key .. '\0' .. string.format('%013d', now) .. '|' .. holder) end
          table.insert(granted, holder)
          table.insert(granted, epoch)
          throttle_offer(T, key)
        end
      end
    end
  end
  local later = redis.call('ZRANGE', T.later, 0, 0, 'WITHSCORES')[2]
  if later and (not next_due or tonumber(later) < next_due) then next_due = tonumber(later) end
  return granted, next_due
end

-- A run hash's 'throttled' field (set by throttle_enter.lua once an op of
-- the run asks a throttle for a slot) as the scripts that end an op or a run
-- reply it: '1', else '0'; only then does their caller look for a slot to
-- give back (replies.shape.throttled_flag reads it).
local function throttled_flag(raw)
  return raw == '1' and '1' or '0'
end

-- The reply of a script that may admit: {verdict, next due or '', holder, epoch, ...}.
local function throttle_reply(verdict, granted, next_due)
  local out = {verdict, next_due and tostring(next_due) or ''}
  for _, item in ipairs(granted) do table.insert(out, item) end
  return out
end

-- == The fence rule (ops.py: the `fenced` column) ========================
-- The one fencing rule: a script whose row is fenced runs only for the
-- attempt whose epoch (ARGV[1]) owns the run (KEYS[1]) while the run accepts
-- work; the loader sets FENCED from the row (connection.py), so no script
-- carries the check itself, and it runs before the script's first line, in
-- the same script as the writes it guards. Scripts whose row says why not
-- check their own condition (an expected epoch and status, a lock token, a
-- holder's epoch), in their own header.
if FENCED then
  local refusal = fence(KEYS[1], ARGV[1])
  if refusal then return {refusal} end
end
