-- Rate limits: one row per rate-limited queue holding its budget as one number, the moment
-- the queue's bucket is full again (Unix µs). Every host takes budget by updating it.
CREATE TABLE IF NOT EXISTS wharf_rate_limits (
    queue   TEXT    PRIMARY KEY,
    tat_us  BIGINT  NOT NULL
);
