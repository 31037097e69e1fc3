-- Reads several whole sequences of the journal in one round trip: the
-- sequences of the branches a branch task is about to run, each as
-- sequence_reply (_prelude.lua) gives it.
-- KEYS[1] journal
-- ARGV[1..n] the sequences
-- Returns {reply of ARGV[1], reply of ARGV[2], ...}.
local out = {}
for i = 1, #ARGV do
  out[i] = sequence_reply(KEYS[1], ARGV[i], 0)
end
return out
