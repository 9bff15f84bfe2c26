-- Write wear: each writer commit holding journaled writes rewrote `chunk_tail`'s page for its
-- `journal_seq` (0013): one WAL page per commit that does nothing else (about 3 MB/h of the
-- reference workload's WAL). The number now lives in a row of `sqlite_sequence`, the page
-- every writer commit already writes for the `chunks` id (AUTOINCREMENT). SQLite documents
-- that table as ordinary rows that INSERT and UPDATE may change, and reads only the rows
-- named after its AUTOINCREMENT tables; the row's name cannot be a table's without quotes.
-- `chunk_tail.journal_seq` is no longer read or written.
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'edgewatch.journal', journal_seq FROM chunk_tail WHERE id = 1;
