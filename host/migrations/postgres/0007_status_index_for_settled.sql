-- Every status change of a message is an update that touches each index it belongs to. The
-- statuses a message passes through on every delivery (pending, sleeping, processing,
-- awaiting-release, processed) already have their own partial indexes (messages_ready,
-- messages_leased, messages_processed); the index by status now holds only the rest (failed
-- and custom statuses), so a delivery no longer inserts into it twice.
DROP INDEX IF EXISTS messages_status;
CREATE INDEX IF NOT EXISTS messages_other_status ON messages (queue, status, key)
    WHERE status NOT IN ('pending', 'sleeping', 'processing', 'awaiting-release', 'processed');
