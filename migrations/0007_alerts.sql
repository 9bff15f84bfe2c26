-- Alert state (src/alert/): one row per alert instance that is pending or firing, keyed by
-- its rule and fingerprint (the rule name and the instance's group labels), so that after a
-- restart a firing instance is still firing with its original start and its resolve is
-- still sent. An instance that goes back to inactive loses its row; `alert_history` keeps
-- every transition with the value that caused it. Times are Unix ns; `labels` is the
-- instance's group labels as a JSON object.
CREATE TABLE IF NOT EXISTS alert_instances (
    rule            TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    labels          TEXT NOT NULL,
    state           TEXT NOT NULL,
    active_since_ns INTEGER,
    fired_ns        INTEGER,
    last_true_ns    INTEGER,
    value           REAL,
    incident_id     INTEGER,
    updated_ns      INTEGER NOT NULL,
    PRIMARY KEY (rule, fingerprint)
);

CREATE TABLE IF NOT EXISTS alert_history (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    ts_ns       INTEGER NOT NULL,
    rule        TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    labels      TEXT NOT NULL,
    transition  TEXT NOT NULL,
    state       TEXT NOT NULL,
    value       REAL,
    incident_id INTEGER
);
CREATE INDEX IF NOT EXISTS alert_history_ts ON alert_history (ts_ns);
