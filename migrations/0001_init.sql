-- Series dictionary and raw points.
--
-- A tag set is measurement + sorted tags, kept as its canonical line-protocol key
-- (`cpu,host=a`). A series is a tag set plus one field key, with the field's type fixed at
-- its first write. Raw points are stored in chunks: one row holds up to a few thousand
-- points of one tag set written in the same transaction, packed (see src/store/codec.rs),
-- which keeps one index entry per chunk instead of one per value. `id` is insertion
-- ordered: forwarders read by id cursor.

CREATE TABLE tagsets (
    id          INTEGER PRIMARY KEY,
    key         TEXT NOT NULL UNIQUE,
    measurement TEXT NOT NULL,
    tags        TEXT NOT NULL            -- JSON object of tag key -> value
);
CREATE INDEX tagsets_measurement ON tagsets (measurement);

CREATE TABLE series (
    id         INTEGER PRIMARY KEY,
    tagset_id  INTEGER NOT NULL REFERENCES tagsets (id),
    field      TEXT NOT NULL,
    kind       INTEGER NOT NULL,         -- 0 float, 1 int, 2 uint, 3 bool, 4 string
    created_ns INTEGER NOT NULL,
    UNIQUE (tagset_id, field)
);

CREATE TABLE chunks (
    id        INTEGER PRIMARY KEY,       -- insertion order
    tagset_id INTEGER NOT NULL,
    ts_min    INTEGER NOT NULL,          -- unix epoch nanoseconds
    ts_max    INTEGER NOT NULL,
    n         INTEGER NOT NULL,          -- points in the chunk
    data      BLOB NOT NULL
);
CREATE INDEX chunks_tagset_ts_max ON chunks (tagset_id, ts_max);

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_ns INTEGER NOT NULL
);
