-- Reads several whole sequences of the journal in one round trip: the
-- sequences of the branches a branch task is about to run, each as
-- sequence_reply (_prelude.lua) gives it. It stops after the sequence that
-- spends the budget of entries (the first is always read), so a task whose
-- branches journaled long histories does not hold Redis with one read; the
-- caller reads the rest when it reaches them.
-- KEYS[1] journal
-- ARGV[1] budget of entries, ARGV[2..n] the sequences
-- Returns {reply of ARGV[2], reply of ARGV[3], ...}, perhaps fewer.
return sequence_replies(KEYS[1], ARGV, 2, tonumber(ARGV[1]))
