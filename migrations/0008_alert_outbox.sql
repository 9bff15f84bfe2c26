-- The alert outbox (src/alert/): every state change of an alert instance that notifiers must
-- deliver, appended by the evaluator in the transaction that records the change, so a
-- change is never recorded without its notification (and the other way round). `seq` gives
-- the delivery order; `event` is the `AlertEvent` as JSON. Each notifier keeps its own
-- position in it (see the delivery work's tables).
CREATE TABLE IF NOT EXISTS alert_outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    created_ns INTEGER NOT NULL,
    event      TEXT NOT NULL
);
