-- Reads events of a run's history by number (record_event in _prelude.lua
-- wrote each with its seq as the entry id): a page costs its size, not the
-- run's.
-- KEYS[1] run hash, KEYS[2] history
-- ARGV[1] 'after' (the events with seq > ARGV[2], oldest first) or 'tail'
-- (the newest, newest first), ARGV[2] a seq (for 'after'), ARGV[3] how many
-- Returns {} for a run that does not exist, else {events given so far
-- (the run's 'events' counter), {entry, ...}}, each entry as XRANGE gives it.
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local total = redis.call('HGET', KEYS[1], 'events') or '0'
local entries
if ARGV[1] == 'tail' then
  entries = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', ARGV[3])
else
  entries = redis.call('XRANGE', KEYS[2], (tonumber(ARGV[2]) + 1) .. '-0', '+', 'COUNT', ARGV[3])
end
return {total, entries}
