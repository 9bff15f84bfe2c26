-- Write wear: indexing the unindexed tail (0012) flipped `chunks.indexed` on every tail row,
-- so every page of raw data was written twice (once when inserted, once when indexed), and
-- the tail was indexed every 30 s. The `(tagset_id, ts_max)` index is now a table of its
-- own, `chunk_index`, filled by the writer from the tail without touching the chunk rows;
-- the tail is read by rowid until then (src/store/chunks.rs `Scan::sql`), now for longer.
-- Triggers keep the entries true when a chunk is deleted (eviction, merging) or retimed
-- (merging, the clock hold); chunks above `chunk_tail.indexed_through` have no entry yet.
-- `chunks.indexed` is no longer read or written (dropping it would rewrite every row).
CREATE TABLE chunk_index (
    tagset_id INTEGER NOT NULL,
    ts_max    INTEGER NOT NULL,
    id        INTEGER NOT NULL,
    PRIMARY KEY (tagset_id, ts_max, id)
) WITHOUT ROWID;
INSERT INTO chunk_index (tagset_id, ts_max, id)
    SELECT tagset_id, ts_max, id FROM chunks
     WHERE id <= (SELECT indexed_through FROM chunk_tail)
     ORDER BY tagset_id, ts_max, id;
DROP INDEX chunks_tagset_ts_max;
CREATE TRIGGER chunk_index_delete AFTER DELETE ON chunks
BEGIN
    DELETE FROM chunk_index
     WHERE tagset_id = old.tagset_id AND ts_max = old.ts_max AND id = old.id;
END;
CREATE TRIGGER chunk_index_retime AFTER UPDATE OF tagset_id, ts_max ON chunks
    WHEN new.tagset_id IS NOT old.tagset_id OR new.ts_max IS NOT old.ts_max
BEGIN
    UPDATE chunk_index SET tagset_id = new.tagset_id, ts_max = new.ts_max
     WHERE tagset_id = old.tagset_id AND ts_max = old.ts_max AND id = old.id;
END;
