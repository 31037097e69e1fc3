-- Reads what a run's history is derived from, in one atomic snapshot (the
-- history is no log of its own: history.derive makes it from these).
-- KEYS[1] run hash, KEYS[2] journal, KEYS[3] steps, KEYS[4] running steps,
-- KEYS[5] agent rows, KEYS[6] signals, KEYS[7] children, KEYS[8] progress
-- Returns {} for a run that does not exist, else {run fields, journal
-- fields, settled step rows, running step rows, agent rows, signal fields,
-- children, system records}, each a flat list of field, value (the journal's
-- op identities but steps' and wait times only, not its values: a long run's results
-- are read for the page that shows them; the signals' times and takers, not
-- their payloads; a system record is seq, attempt, at, message).
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local journal = {}
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local name = raw[i]
  local p2, p3 = string.sub(name, 1, 2), string.sub(name, 1, 3)
  -- A step's op is left out: its row says all the history needs of it.
  local step_op = p2 == 'o:' and string.find(raw[i + 1], ':s|', 1, true) ~= nil
  if (p2 == 'o:' and not step_op) or p2 == 'x:' or p3 == 'wd:' or p3 == 'wt:' or p3 == 'wf:' then
    table.insert(journal, name)
    local value = raw[i + 1]
    if p2 == 'x:' and #value > 200 then value = string.sub(value, 1, 200) end
    table.insert(journal, value)
  end
end
local signals = {}
raw = redis.call('HGETALL', KEYS[6])
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
