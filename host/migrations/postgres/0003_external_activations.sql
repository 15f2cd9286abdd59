-- Pending activations of external queues: one row per queue with work that a processor
-- has not yet claimed (many readiness notifications coalesce into one row).
CREATE TABLE IF NOT EXISTS external_activations (
    queue TEXT PRIMARY KEY,
    requested_at_ms BIGINT NOT NULL
);
