-- The SQL queue. One row per message; an identified message keeps its row across updates.
CREATE TABLE IF NOT EXISTS messages (
    key                 INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL,
    message_id          TEXT,
    delivery_id         TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    headers             TEXT    NOT NULL DEFAULT '[]',
    priority            INTEGER NOT NULL DEFAULT 0,
    status              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    process_at_ms       INTEGER NOT NULL,
    created_at_ms       INTEGER NOT NULL,
    enqueued_at_ms      INTEGER NOT NULL,
    updated_at_ms       INTEGER NOT NULL,
    processed_at_ms     INTEGER,
    lease_token         INTEGER NOT NULL DEFAULT 0,
    lease_expires_at_ms INTEGER,
    last_error          TEXT,
    version             INTEGER NOT NULL DEFAULT 1
);

-- Identity: at most one message per (queue, id).
CREATE UNIQUE INDEX IF NOT EXISTS messages_identity
    ON messages (queue, message_id) WHERE message_id IS NOT NULL;

-- Leasing walks this index in lease order.
CREATE INDEX IF NOT EXISTS messages_ready
    ON messages (queue, priority DESC, process_at_ms, key) WHERE status IN ('pending', 'sleeping');

-- Expired-lease sweeps.
CREATE INDEX IF NOT EXISTS messages_leased
    ON messages (queue, lease_expires_at_ms) WHERE status = 'processing';

-- Listing by queue and status.
CREATE INDEX IF NOT EXISTS messages_status ON messages (queue, status, key);
