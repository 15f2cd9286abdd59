-- Which broker deliveries' follow-ups are committed, for a source without the SQL inbox: a
-- redelivery after the commit but before the acknowledgement finds its row and commits
-- nothing again. Rows expire after the retention the host gives them.
CREATE TABLE IF NOT EXISTS wharf_follow_up_commits (
    queue TEXT NOT NULL,
    delivery TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    PRIMARY KEY (queue, delivery)
);
CREATE INDEX IF NOT EXISTS wharf_follow_up_commits_expiry ON wharf_follow_up_commits (expires_at_ms);
