-- Write wear: tier rows are keyed by series (`rollups`: tier, series_id, bucket), so each
-- fold, which writes one new row per active series, dirtied about one page per series and
-- tier (160 of a commit's ~250 pages with 600 series). Rows of recent buckets now go to
-- `rollups_recent`, keyed by time, where one fold's rows fill a few adjacent pages; the
-- rollup job moves final buckets into `rollups` in bulk (once at least an hour of them, or
-- six buckets of a coarse tier, are waiting: a page per series per move instead of per fold).
-- `rollup_state.settled_through` is the newest bucket moved: a tier's rows with a bucket at
-- or below it are in `rollups`, newer ones in `rollups_recent` (src/store/tiers.rs).
CREATE TABLE rollups_recent (
    tier      INTEGER NOT NULL,
    bucket    INTEGER NOT NULL,
    series_id INTEGER NOT NULL,
    count     INTEGER NOT NULL,
    sum       REAL NOT NULL,
    min       REAL NOT NULL,
    max       REAL NOT NULL,
    first_ts  INTEGER NOT NULL,
    first     REAL NOT NULL,
    last_ts   INTEGER NOT NULL,
    last      REAL NOT NULL,
    sketch    BLOB NOT NULL,
    PRIMARY KEY (tier, bucket, series_id)
) WITHOUT ROWID;
ALTER TABLE rollup_state ADD COLUMN settled_through INTEGER NOT NULL DEFAULT -9223372036854775808;
-- Every existing row stays where it is: each tier is settled through its newest bucket.
UPDATE rollup_state SET settled_through =
    COALESCE((SELECT MAX(bucket) FROM rollups r WHERE r.tier = rollup_state.tier), -9223372036854775808);
