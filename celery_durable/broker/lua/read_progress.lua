-- Reads one page of a run's progress records together with the bounds and
-- the revision it is relative to, in one atomic snapshot, so a page and its
-- has_more flags never disagree. A phase's records come from the phase
-- index (see append_progress): O(log n + page), never a scan of the run.
-- A run archived (archive_run.lua) has neither: its records are in the
-- archive, which the caller pages as this script would (schema/archive.py).
-- KEYS[1] run hash, KEYS[2] progress stream, KEYS[3] progress phase index,
-- KEYS[4] archive
-- ARGV[1] phase id, '' for the whole run, ARGV[2] 'after', 'before' or
-- 'newest', ARGV[3] cursor seq (0 <= seq < 10^15; unused for 'newest'),
-- ARGV[4] page size
-- Returns {revision, oldest seq or '', newest seq or '', entry, entry, ...}
-- with entries as XRANGE gives them ({"<seq>-0", {field, value, ...}}), in
-- ascending seq; oldest and newest are the run's, or the phase's; or
-- {revision, 'archived'} for an archived run.
local revision = redis.call('HGET', KEYS[1], 'next_seq') or '0'
if redis.call('EXISTS', KEYS[4]) == 1 then return {revision, 'archived'} end
local phase, mode, cursor, count = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local out = {revision, '', ''}

local function reversed(list)
  local result = {}
  for i = #list, 1, -1 do table.insert(result, list[i]) end
  return result
end

if phase == '' then
  local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
  if #first == 0 then return out end
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  out[2] = string.match(first[1][1], '^%d+')
  out[3] = string.match(last[1][1], '^%d+')
  local rows
  if mode == 'after' then
    rows = redis.call('XRANGE', KEYS[2], '(' .. cursor .. '-0', '+', 'COUNT', count)
  elseif mode == 'before' then
    if tonumber(cursor) <= 1 then return out end
    rows = reversed(redis.call('XREVRANGE', KEYS[2], '(' .. cursor .. '-0', '-', 'COUNT', count))
  else
    rows = reversed(redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', count))
  end
  for _, row in ipairs(rows) do table.insert(out, row) end
  return out
end

-- Members are "<phase>|<seq, 15 digits>": '[' .. prefix is the first member
-- of the phase, '(' .. prefix .. ':' lies just past its last (':' follows '9').
-- Seqs are handled as digit strings: Lua 5.1 would print a large number in
-- exponent form.
local prefix = phase .. '|'
local function seq_of(member)
  return string.match(string.sub(member, #prefix + 1), '^0*(%d+)$')
end
local low, high = '[' .. prefix, '(' .. prefix .. ':'
local first = redis.call('ZRANGEBYLEX', KEYS[3], low, high, 'LIMIT', 0, 1)
if #first == 0 then return out end
local last = redis.call('ZREVRANGEBYLEX', KEYS[3], high, low, 'LIMIT', 0, 1)
out[2] = seq_of(first[1])
out[3] = seq_of(last[1])
local at = '(' .. prefix .. string.format('%015d', tonumber(cursor))
local members
if mode == 'after' then
  members = redis.call('ZRANGEBYLEX', KEYS[3], at, high, 'LIMIT', 0, count)
elseif mode == 'before' then
  members = reversed(redis.call('ZREVRANGEBYLEX', KEYS[3], at, low, 'LIMIT', 0, count))
else
  members = reversed(redis.call('ZREVRANGEBYLEX', KEYS[3], high, low, 'LIMIT', 0, count))
end
for _, member in ipairs(members) do
  local id = seq_of(member) .. '-0'
  local row = redis.call('XRANGE', KEYS[2], id, id)
  if row[1] then table.insert(out, row[1]) end
end
return out
