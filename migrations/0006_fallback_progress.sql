-- Progress through an eviction-fallback span (src/forward/): while a sink sends, in several
-- batches, the rollup rows that stand in for raw data evicted before it forwarded them, each
-- acknowledged batch records here how far it got, in the transaction that counts its points
-- and its sequence number. After a crash the span resumes after the last acknowledged row
-- instead of starting over: only the batches in flight are sent again (with their numbers).
--
-- One row per sink while a span is in progress (deleted when the gap is covered).
-- `span_from`: where the span starts (the bucket of the newest point the sink acknowledged),
-- which names the span: a position recorded for another span is ignored. `bucket`,
-- `series_id`: the last rollup row acknowledged, in the order the span is sent (bucket, then
-- series id); NULL before the first acknowledgement. `inflight`: batches of the span handed
-- to the remote end and not acknowledged yet (counted in `sinks.replayed_batches` at the next
-- start when the agent stopped with any).
--
-- `IF NOT EXISTS`: a store rolled back to an older `user_version` for a test replays this
-- file without losing the rows.
CREATE TABLE IF NOT EXISTS sink_fallback (
    sink      TEXT PRIMARY KEY,
    span_from INTEGER,
    bucket    INTEGER,
    series_id INTEGER,
    inflight  INTEGER NOT NULL DEFAULT 0
);
