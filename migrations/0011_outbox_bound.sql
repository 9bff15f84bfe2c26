-- The alert outbox is bounded (src/store/outbox.rs `Outbox::bound`, `[alerts]
-- outbox_max_bytes` / `outbox_max_age`): rows past the bound are pruned even when a notifier
-- (disabled, or down for long) has not sent them, except the latest event of each alert
-- still firing. Each notifier counts the events it lost that way.
ALTER TABLE notifiers ADD COLUMN pruned_unsent INTEGER NOT NULL DEFAULT 0;
