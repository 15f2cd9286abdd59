-- The SQL queue. One row per message; an identified message keeps its row across updates.
CREATE TABLE IF NOT EXISTS messages (
    key                 BIGSERIAL PRIMARY KEY,
    queue               TEXT    NOT NULL,
    message_id          TEXT,
    delivery_id         TEXT    NOT NULL,
    payload             TEXT    NOT NULL,
    payload_hash        TEXT    NOT NULL,
    headers             TEXT    NOT NULL DEFAULT '[]',
    priority            INTEGER NOT NULL DEFAULT 0,
    status              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    process_at_ms       BIGINT  NOT NULL,
    created_at_ms       BIGINT  NOT NULL,
    enqueued_at_ms      BIGINT  NOT NULL,
    updated_at_ms       BIGINT  NOT NULL,
    processed_at_ms     BIGINT,
    lease_token         BIGINT  NOT NULL DEFAULT 0,
    lease_expires_at_ms BIGINT,
    last_error          TEXT,
    version             BIGINT  NOT NULL DEFAULT 1,
    -- The newer version enqueued while the message was leased (status awaiting-release).
    next_delivery_id    TEXT,
    next_payload        TEXT,
    next_payload_hash   TEXT,
    next_headers        TEXT,
    next_priority       INTEGER,
    next_process_at_ms  BIGINT,
    next_enqueued_at_ms BIGINT,
    -- A custom status to take on release; NULL means pending or sleeping by date.
    next_status         TEXT
);

CREATE UNIQUE INDEX IF NOT EXISTS messages_identity
    ON messages (queue, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_ready
    ON messages (queue, priority DESC, process_at_ms, key) WHERE status IN ('pending', 'sleeping');
CREATE INDEX IF NOT EXISTS messages_leased
    ON messages (queue, lease_expires_at_ms) WHERE status IN ('processing', 'awaiting-release');
CREATE INDEX IF NOT EXISTS messages_status ON messages (queue, status, key);
CREATE INDEX IF NOT EXISTS messages_processed ON messages (queue, processed_at_ms) WHERE status = 'processed';

CREATE TABLE IF NOT EXISTS message_history (
    history_key     BIGSERIAL PRIMARY KEY,
    queue           TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    message_key     BIGINT  NOT NULL,
    version         BIGINT  NOT NULL,
    delivery_id     TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    headers         TEXT    NOT NULL,
    priority        INTEGER NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    last_error      TEXT,
    enqueued_at_ms  BIGINT  NOT NULL,
    processed_at_ms BIGINT,
    recorded_at_ms  BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS message_history_identity ON message_history (queue, message_id, history_key);
