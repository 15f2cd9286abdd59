-- Deliveries of external messages counted by the host, for brokers that only flag a
-- redelivery (or count nothing): one row per message that came back, removed on settlement.
CREATE TABLE IF NOT EXISTS external_attempts (
    queue TEXT NOT NULL,
    message_key TEXT NOT NULL,
    redeliveries INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, message_key)
);
