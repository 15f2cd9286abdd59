-- Periodic messages: one row per schedule, its last tick claimed by a conditional update in
-- the transaction that writes the tick's message; and the hosts sharing this store.
CREATE TABLE IF NOT EXISTS wharf_schedules (
    name                TEXT    PRIMARY KEY,
    last_tick_ms        BIGINT  NOT NULL,
    last_host           TEXT,
    last_enqueued_at_ms BIGINT,
    enqueued            BIGINT  NOT NULL DEFAULT 0,
    missed              BIGINT  NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS wharf_hosts (
    id              TEXT    PRIMARY KEY,
    started_at_ms   BIGINT  NOT NULL,
    seen_at_ms      BIGINT  NOT NULL,
    stopped_at_ms   BIGINT
);
