-- The alert outbox (src/alert/): every state change of an alert instance that notifiers must
-- deliver, appended by the evaluator in the transaction that records the change, so a
-- change is never recorded without its notification (and the other way round). `seq` gives
-- the delivery order; `event` is the `AlertEvent` as JSON; `fingerprint` and `firing` repeat
-- two of its fields so the currently-firing set (latest event per fingerprint) and pruning
-- are plain indexed queries.
CREATE TABLE IF NOT EXISTS alert_outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    created_ns  INTEGER NOT NULL,
    event       TEXT NOT NULL,
    fingerprint TEXT NOT NULL DEFAULT '',
    firing      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS alert_outbox_fingerprint ON alert_outbox (fingerprint, seq);

-- One row per `[[notify]]` (by name): its durable position in the outbox (the last `seq`
-- its receiver acknowledged or that was dead-lettered) and its totals. A notifier moves its
-- position only after the receiver acknowledged, in one statement.
CREATE TABLE IF NOT EXISTS notifiers (
    name            TEXT PRIMARY KEY,
    position        INTEGER NOT NULL DEFAULT 0,
    delivered       INTEGER NOT NULL DEFAULT 0,
    dead_letters    INTEGER NOT NULL DEFAULT 0,
    last_success_ns INTEGER
);

-- Events a receiver refused as bad (HTTP 4xx other than 401/403/408/429): kept with the
-- reason; the notifier moved on past them.
CREATE TABLE IF NOT EXISTS notify_dead_letters (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    notifier TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    event    TEXT NOT NULL,
    status   INTEGER NOT NULL,
    reason   TEXT NOT NULL,
    at_ns    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS notify_dead_letters_notifier ON notify_dead_letters (notifier, id);
