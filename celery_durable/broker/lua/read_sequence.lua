-- Reads one sequence of the journal in one round trip (sequence_reply in
-- _prelude.lua: its op entries, the values replay needs, its cut and its
-- progress high-water mark).
-- KEYS[1] journal
-- ARGV[1] sequence, ARGV[2] the first index to read (0: the whole sequence)
-- Returns {cut or '', hwm or '', entry<start>, value<start>, ...}; an
-- entry is "<epoch>:<identity>", a value is false when the op carries none.
return sequence_reply(KEYS[1], ARGV[1], ARGV[2])
