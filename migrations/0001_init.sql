-- Series dictionary and raw points.
--
-- A tag set is measurement + sorted tags, kept as its canonical line-protocol key
-- (`cpu,host=a`). A series is a tag set plus one field key, with the field's type fixed at
-- its first write. Raw points are stored one row per input line: the row's `data` packs
-- every field value of that line (see src/store/codec.rs), which keeps one index entry per
-- line instead of one per value. `id` is insertion ordered: forwarders read by id cursor.

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

CREATE TABLE points (
    id        INTEGER PRIMARY KEY,       -- insertion order
    tagset_id INTEGER NOT NULL,
    ts        INTEGER NOT NULL,          -- unix epoch nanoseconds
    data      BLOB NOT NULL
);
CREATE INDEX points_tagset_ts ON points (tagset_id, ts);

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_ns INTEGER NOT NULL
);
