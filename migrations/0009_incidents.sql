-- Incidents (src/alert/incident/): one row per alert instance that fired, with the
-- spike-triage snapshot taken at that moment. `labels` is the instance's labels as a JSON
-- object; `snapshot` the whole snapshot as JSON (ranked findings, processes, the windows it
-- compared); `top_finding` the first finding's sentence, for listings. `resolved_ns` is set
-- when the instance resolves, when the evaluator reports it.
CREATE TABLE IF NOT EXISTS incidents (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    rule            TEXT NOT NULL,
    labels          TEXT NOT NULL,
    value           REAL,
    threshold       REAL,
    active_since_ns INTEGER NOT NULL,
    fired_ns        INTEGER NOT NULL,
    resolved_ns     INTEGER,
    top_finding     TEXT,
    snapshot        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_by_fired ON incidents (fired_ns);
