-- Follow-ups for external queues, written with the settlement of the message whose handler
-- staged them and published into their broker after the commit; a row is deleted once its
-- broker took it. A relay claims rows (`claimed_until_ms`) so two hosts do not publish one
-- row at the same time.
CREATE TABLE IF NOT EXISTS wharf_outbox (
    key BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    provider TEXT NOT NULL,
    message_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority INTEGER NOT NULL,
    session TEXT,
    due_at_ms BIGINT,
    created_at_ms BIGINT NOT NULL,
    claimed_until_ms BIGINT NOT NULL DEFAULT 0,
    claimed_by TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS wharf_outbox_claim ON wharf_outbox (claimed_until_ms, key);
