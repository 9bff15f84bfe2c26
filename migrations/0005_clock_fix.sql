-- Devices without a real-time clock run on a wrong clock (1970, or a stale saved time)
-- until NTP sets it; everything stamped meanwhile is off by the step the clock takes then.
-- When the agent starts on a clock earlier than its floor (`[clock] min_valid`, default: the
-- build time) it records here this boot, the clock's offset from CLOCK_BOOTTIME, and the
-- first chunk id written on that clock. Rollup and forwarding stop before that chunk; once
-- the clock is set, the rollup job shifts those points by the step (new offset - old) and
-- deletes the row, and both carry on with corrected times. A row left by an earlier boot
-- cannot be corrected (its offset is gone with that boot) and is dropped, counted.
CREATE TABLE clock_fix (
    boot_id        TEXT PRIMARY KEY,
    offset_ns      INTEGER NOT NULL,
    first_chunk_id INTEGER NOT NULL,
    fixed_through  INTEGER NOT NULL DEFAULT 0,
    synced_ns      INTEGER NOT NULL DEFAULT 0,
    noted_ns       INTEGER NOT NULL
);
