-- Store-and-forward (src/forward/): per-sink delivery state beside the cursor of 0002, and
-- the dead-letter table.
--
-- `sinks.batch_seq` is the sequence number of the last batch the remote end acknowledged;
-- it moves in the same transaction as `cursor_chunk_id`, so a batch replayed after a crash
-- is sent again with the same number (MQTT consumers drop duplicates by it).
-- `forwarded_points`, `dead_letter_points`, `fallback_points` and `replayed_batches` are
-- monotonic counters for the status page.

ALTER TABLE sinks ADD COLUMN batch_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN forwarded_points INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN dead_letter_points INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN fallback_points INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN fallback_through_chunk_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN last_success_ns INTEGER NOT NULL DEFAULT 0;
-- Newest point time acknowledged: where a rollup fallback for an eviction gap starts.
ALTER TABLE sinks ADD COLUMN forwarded_ts_max INTEGER NOT NULL DEFAULT 0;
-- Last chunk id of the batches handed to the remote end and not acknowledged yet: above the
-- cursor at start-up means a batch was in flight when the agent stopped (it is sent again and
-- counted in `replayed_batches`).
ALTER TABLE sinks ADD COLUMN inflight_through_chunk_id INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN replayed_batches INTEGER NOT NULL DEFAULT 0;

-- Batches the remote end refused as bad data (HTTP 400/422): kept here, with the reason and
-- the uncompressed payload, instead of being retried forever. The cursor moved past them.
CREATE TABLE dead_letters (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    sink           TEXT NOT NULL,
    first_chunk_id INTEGER NOT NULL,
    last_chunk_id  INTEGER NOT NULL,
    points         INTEGER NOT NULL,
    status         INTEGER NOT NULL,   -- the HTTP status
    reason         TEXT NOT NULL,      -- the server's answer
    created_ns     INTEGER NOT NULL,
    payload        BLOB NOT NULL       -- the batch as sent, before compression
);
CREATE INDEX dead_letters_sink ON dead_letters (sink, id);
