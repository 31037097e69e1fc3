-- Reads what a run's history is derived from, in one atomic snapshot (the
-- history is no log of its own: history.derive makes it from these).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] steps, KEYS[4] running steps,
-- KEYS[5] agent rows, KEYS[6] signals, KEYS[7] children, KEYS[8] progress
-- Returns {} for a run that does not exist, else {run fields, journal
-- fields, settled step rows, running step rows, agent rows, signal fields,
-- children, system records}, each a flat list:
-- * journal: field, value of its op identities (but steps': their rows say
--   all the history needs of them) and wait times; an x: field's name only
--   (value ''). No values: a long run's results are read for the page that
--   shows them (history_facts.read_values).
-- * step rows whole, as stored: decoding them here (cjson) costs Redis more
--   than sending them costs both sides (a run of 10,000 steps: ~30 ms of
--   the server's time against ~10 ms sending ~1 MB; see benchmarks/NOTES.md).
-- * signals: their times and takers (t:, k:), not their payloads.
-- * a system record: seq, attempt, at, message.
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
-- The journal's names only (its values hold every result), then the values
-- of the op and wait-time fields; byte compares: a run has tens of thousands.
local wanted, journal = {}, {}
for _, name in ipairs(redis.call('HKEYS', KEYS[2])) do
  local b1, b2, b3 = string.byte(name, 1, 3)
  if b2 == 58 and b1 == 111 then -- o:
    wanted[#wanted + 1] = name
  elseif b2 == 58 and b1 == 120 then -- x:
    journal[#journal + 1] = name
    journal[#journal + 1] = ''
  elseif b1 == 119 and b3 == 58 and (b2 == 100 or b2 == 116 or b2 == 102) then -- wd: wt: wf:
    wanted[#wanted + 1] = name
  end
end
for first = 1, #wanted, 1000 do
  local last = math.min(first + 999, #wanted)
  local values = redis.call('HMGET', KEYS[2], unpack(wanted, first, last))
  for i = first, last do
    local name, value = wanted[i], values[i - first + 1]
    -- A step's op is left out: its row says all the history needs of it.
    if value and not (string.byte(name, 1) == 111 and string.find(value, ':s|', 1, true)) then
      journal[#journal + 1] = name
      journal[#journal + 1] = value
    end
  end
end
local signals = {}
local raw = redis.call('HGETALL', KEYS[6])
for i = 1, #raw, 2 do
  local p2 = string.sub(raw[i], 1, 2)
  if p2 == 't:' or p2 == 'k:' then
    table.insert(signals, raw[i])
    table.insert(signals, raw[i + 1])
  end
end
local system = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[8], '-', '+')) do
  local fields, kind, attempt, at, message = entry[2], '', '', '', ''
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == 'kind' then kind = fields[i + 1]
    elseif name == 'attempt' then attempt = fields[i + 1]
    elseif name == 'at' then at = fields[i + 1]
    elseif name == 'message' then message = fields[i + 1] end
  end
  if kind == 'system' then
    table.insert(system, string.match(entry[1], '^%d+'))
    table.insert(system, attempt)
    table.insert(system, at)
    table.insert(system, message)
  end
end
return {redis.call('HGETALL', KEYS[1]), journal, redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[5]), signals, redis.call('HGETALL', KEYS[7]), system}
