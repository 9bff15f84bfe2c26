-- Write wear: a small acknowledged write no longer costs a synced SQLite commit of its own.
-- The writer appends it to `edgewatch.journal` beside the database (one synced append),
-- answers, and stores it in the next commit with everything else held (src/store/journal.rs).
-- Each commit records here the sequence number of the newest journal record it holds, in
-- the same transaction as the chunks, so a restart replays exactly the records after it.
ALTER TABLE chunk_tail ADD COLUMN journal_seq INTEGER NOT NULL DEFAULT 0;
