-- Write wear: small-chunk merging (src/store/compact.rs) took one tag set at a time, and a tag
-- set's small chunks lie one per commit across every leaf of the hour, so each bounded step
-- rewrote nearly every chunk leaf of the hour again (about 20 MB/h of the reference
-- workload's 60 MB/h). A step now merges every tag set's small chunks in one range of ids,
-- the next range after this cursor, so each leaf is rewritten once; a tag set's last, partial
-- chunk of a range is carried into its next range's first run. Every chunk at or below
-- `merged_through` has been through a merge step.
CREATE TABLE merge_state (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    merged_through INTEGER NOT NULL
);
INSERT INTO merge_state (id, merged_through) VALUES (1, 0);
