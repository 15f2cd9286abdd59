-- Handlers' key-value state (`wasi:keyvalue`), keyed by (bucket, key). A change is written
-- with the settlement of the message whose handler staged it; `revision` changes on every
-- write (a random number), so a call that read a key finds at commit whether another call
-- changed it since.
CREATE TABLE IF NOT EXISTS wharf_state (
    bucket TEXT NOT NULL,
    key TEXT NOT NULL,
    value BYTEA NOT NULL,
    revision BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (bucket, key)
);
