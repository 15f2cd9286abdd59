-- The SQL queue. One row per message; an identified message keeps its row across updates.
CREATE TABLE IF NOT EXISTS messages (
    key                 INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL,
    message_id          TEXT,
    delivery_id         TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    payload_hash        TEXT    NOT NULL,
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
    version             INTEGER NOT NULL DEFAULT 1,
    -- The newer version enqueued while the message was leased (status awaiting-release).
    next_delivery_id    TEXT,
    next_payload        TEXT,
    next_payload_hash   TEXT,
    next_headers        TEXT,
    next_priority       INTEGER,
    next_process_at_ms  INTEGER,
    next_enqueued_at_ms INTEGER,
    -- A custom status to take on release; NULL means pending or sleeping by date.
    next_status         TEXT
);

-- Identity: at most one message per (queue, id).
CREATE UNIQUE INDEX IF NOT EXISTS messages_identity
    ON messages (queue, message_id) WHERE message_id IS NOT NULL;

-- Leasing walks this index in lease order.
CREATE INDEX IF NOT EXISTS messages_ready
    ON messages (queue, priority DESC, process_at_ms, key) WHERE status IN ('pending', 'sleeping');

-- Expired-lease sweeps.
CREATE INDEX IF NOT EXISTS messages_leased
    ON messages (queue, lease_expires_at_ms) WHERE status IN ('processing', 'awaiting-release');

-- Listing by queue and status; retention of processed messages.
CREATE INDEX IF NOT EXISTS messages_status ON messages (queue, status, key);
CREATE INDEX IF NOT EXISTS messages_processed ON messages (queue, processed_at_ms) WHERE status = 'processed';

-- Previous versions of identified messages.
CREATE TABLE IF NOT EXISTS message_history (
    history_key     INTEGER PRIMARY KEY AUTOINCREMENT,
    queue           TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    message_key     INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    delivery_id     TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    headers         TEXT    NOT NULL,
    priority        INTEGER NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    last_error      TEXT,
    enqueued_at_ms  INTEGER NOT NULL,
    processed_at_ms INTEGER,
    recorded_at_ms  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS message_history_identity ON message_history (queue, message_id, history_key);
CREATE INDEX IF NOT EXISTS message_history_recorded ON message_history (recorded_at_ms);
