-- Live row count per tier, kept in `counters` as `rows_<tier resolution in s>`: the rollup
-- job adds the rows it inserts and retention/budget subtract the rows they delete, in the
-- same transaction, so `/api/v1/status` reads it instead of counting the table (a full
-- index scan: ~60 ms for a million rows, on every status and /metrics request).
-- Existing rows are counted once here.
INSERT INTO counters (name, value)
    SELECT 'rows_' || tier, COUNT(*) FROM rollups WHERE true GROUP BY tier
    ON CONFLICT (name) DO UPDATE SET value = excluded.value;
