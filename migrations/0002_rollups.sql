-- Downsampling tiers, their cursors, eviction counters and forwarder sink cursors.
--
-- `rollups` holds one row per tier, series and bucket: count, sum, min, max, first and last
-- (with their timestamps, so late points merge correctly) and a DDSketch BLOB
-- (src/store/sketch.rs) from which any percentile over any set of buckets is read by merging.
-- `tier` is the tier's resolution in seconds (60, 3600); `bucket` is the bucket start in
-- unix epoch nanoseconds, aligned to the resolution.
--
-- `rollup_state.cursor` is the id of the last chunk folded into a tier; it is updated in the
-- same transaction as that tier's bucket rows, so every chunk is rolled up exactly once.
-- `watermark_ns` is the newest point time the tier has seen (capped at the wall clock).

CREATE TABLE rollups (
    tier      INTEGER NOT NULL,
    series_id INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    sum       REAL NOT NULL,
    min       REAL NOT NULL,
    max       REAL NOT NULL,
    first_ts  INTEGER NOT NULL,
    first     REAL NOT NULL,
    last_ts   INTEGER NOT NULL,
    last      REAL NOT NULL,
    sketch    BLOB NOT NULL,
    PRIMARY KEY (tier, series_id, bucket)
) WITHOUT ROWID;
CREATE INDEX rollups_tier_bucket ON rollups (tier, bucket);

CREATE TABLE rollup_state (
    tier         INTEGER PRIMARY KEY,    -- resolution in seconds
    cursor       INTEGER NOT NULL,       -- last chunks.id folded into this tier
    watermark_ns INTEGER NOT NULL,       -- newest point time seen (<= wall clock)
    late_points  INTEGER NOT NULL,       -- points merged into buckets already final
    updated_ns   INTEGER NOT NULL
);

-- Monotonic counters kept across restarts and processes (`edgewatch maintain` and the
-- agent both add to them): evicted raw chunks/points and rows per tier.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);

-- Forwarder sinks: how far each has forwarded (by chunk id), and how much raw data it had
-- not forwarded yet when retention or the disk budget evicted it, so it can fall back to
-- rollups for chunk ids up to `evicted_through_chunk_id`.
CREATE TABLE sinks (
    name                        TEXT PRIMARY KEY,
    cursor_chunk_id             INTEGER NOT NULL DEFAULT 0,
    evicted_unforwarded_chunks  INTEGER NOT NULL DEFAULT 0,
    evicted_unforwarded_points  INTEGER NOT NULL DEFAULT 0,
    evicted_through_chunk_id    INTEGER NOT NULL DEFAULT 0
);

-- Rebuild `chunks` with AUTOINCREMENT: SQLite may otherwise reuse the id of a deleted
-- newest row, and a reused id at or below a rollup or forwarder cursor would never be read.
-- Eviction deletes chunks, so ids must be strictly increasing forever. One-time copy.
CREATE TABLE chunks_v2 (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,  -- insertion order, never reused
    tagset_id INTEGER NOT NULL,
    ts_min    INTEGER NOT NULL,
    ts_max    INTEGER NOT NULL,
    n         INTEGER NOT NULL,
    data      BLOB NOT NULL
);
INSERT INTO chunks_v2 (id, tagset_id, ts_min, ts_max, n, data)
    SELECT id, tagset_id, ts_min, ts_max, n, data FROM chunks ORDER BY id;
DROP TABLE chunks;
ALTER TABLE chunks_v2 RENAME TO chunks;
CREATE INDEX chunks_tagset_ts_max ON chunks (tagset_id, ts_max);
