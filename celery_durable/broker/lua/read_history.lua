-- Reads events of a run's history by number (record_event in _prelude.lua
-- wrote each with its seq as the entry id): a page costs its size, not the
-- run's.
-- A run archived (archive_run.lua) has its events in the archive, which the
-- caller pages as this script would (schema/archive.py).
-- KEYS[1] run hash, KEYS[2] history, KEYS[3] archive
-- ARGV[1] 'after' (the events with seq > ARGV[2], oldest first) or 'tail'
-- (the newest, newest first), ARGV[2] a seq (for 'after'), ARGV[3] how many
-- Returns {} for a run that does not exist, else {events given so far
-- (the run's 'events' counter), {entry, ...}}, each entry as XRANGE gives it,
-- or {events given, 'archived'} for an archived run.
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local total = redis.call('HGET', KEYS[1], 'events') or '0'
if redis.call('EXISTS', KEYS[3]) == 1 then return {total, 'archived'} end
local entries
if ARGV[1] == 'tail' then
  entries = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', ARGV[3])
else
  -- Exclusive of ARGV[2] as given: a Lua number past 1e14 prints as 1e+14, no stream id.
  entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[2] .. '-0', '+', 'COUNT', ARGV[3])
end
return {total, entries}
