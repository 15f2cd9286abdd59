-- Ordered sessions: messages that share a session key in a queue with `sessions = true` run
-- one at a time, in key order; a failed or handed-off message blocks its session and later
-- ones wait as `parked`. This index holds only the session messages that still matter for
-- that order (live, waiting or blocking), so a lease checks a session with one probe.
ALTER TABLE messages ADD COLUMN session_key TEXT;
CREATE INDEX IF NOT EXISTS messages_session ON messages (queue, session_key, key)
    WHERE session_key IS NOT NULL
      AND status IN ('pending', 'sleeping', 'parked', 'processing', 'awaiting-release', 'failed', 'handed-off');
-- The messages that block their session: few, so finding the blocked sessions among many is
-- one probe each.
CREATE INDEX IF NOT EXISTS messages_session_blockers ON messages (queue, session_key)
    WHERE session_key IS NOT NULL AND (status = 'handed-off' OR (status = 'failed' AND outcome IS NULL));
