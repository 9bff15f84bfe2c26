-- Bandwidth-aware forwarding (src/forward/rollup.rs): a sink with `forward = "rollup:1m"`
-- sends the rows of a rollup tier instead of raw chunks. Its place in that feed lives beside
-- its raw cursor, so switching a sink between modes keeps both.
--
-- `rollup_tier`: the tier the sink forwards (its resolution in seconds, as `rollups.tier`);
-- 0 = raw (`cursor_chunk_id` is its cursor). A rollup-mode sink holds no raw chunks: raw
-- eviction does not count against it and chunk merging does not wait for its raw cursor.
-- `rollup_cursor_bucket`: start (ns) of the last bucket whose rows the remote end
-- acknowledged (buckets are sent whole, in order); NULL before the sink first ran in rollup
-- mode (it is then set from `forwarded_ts_max`, or to the oldest row). `rollup_inflight_bucket`:
-- last bucket of the batches handed to the remote end and not acknowledged yet (above the
-- cursor at start-up: counted in `replayed_batches`, as `inflight_through_chunk_id`).
-- `rollup_evicted_rows`: tier rows retention or the budget deleted before the sink sent them.
ALTER TABLE sinks ADD COLUMN rollup_tier INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sinks ADD COLUMN rollup_cursor_bucket INTEGER;
ALTER TABLE sinks ADD COLUMN rollup_inflight_bucket INTEGER;
ALTER TABLE sinks ADD COLUMN rollup_evicted_rows INTEGER NOT NULL DEFAULT 0;
