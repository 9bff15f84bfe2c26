-- Write wear: the index on (tagset_id, ts_max) cost every commit one index leaf per tag set
-- in it (about 25 of a commit's 12-40 pages on a Jetson's workload). New chunks now go in
-- unindexed (`indexed = 0`, ids above `chunk_tail.indexed_through`); the writer indexes the
-- whole tail at once every 30 s or 1,000 chunks, one leaf per tag set per 30 s instead of
-- per second. Readers of one tag set read the index and the short unindexed tail by rowid
-- (src/store/chunks.rs `Scan::sql`). Every existing chunk counts as indexed.
ALTER TABLE chunks ADD COLUMN indexed INTEGER NOT NULL DEFAULT 1;
DROP INDEX chunks_tagset_ts_max;
CREATE INDEX chunks_tagset_ts_max ON chunks (tagset_id, ts_max) WHERE indexed = 1;
CREATE TABLE chunk_tail (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    -- Every chunk with an id at or below this is indexed; every one above it is not.
    indexed_through INTEGER NOT NULL
);
INSERT INTO chunk_tail (id, indexed_through) VALUES (1, (SELECT COALESCE(MAX(id), 0) FROM chunks));
