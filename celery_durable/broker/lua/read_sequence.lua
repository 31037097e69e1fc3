-- Reads one sequence of the journal in one round trip: sequence_reply in
-- _prelude.lua (which owns the reply's shape, parsed by schema.parse_sequence).
-- KEYS[1] journal
-- ARGV[1] sequence, ARGV[2] the first index to read (0: the whole sequence)
-- Returns {cut or '', hwm or '', entry, value, entry, value, ...} from that index.
return sequence_reply(KEYS[1], ARGV[1], ARGV[2])
