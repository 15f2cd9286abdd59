-- A version enqueued while its message is leased (AwaitingRelease) keeps, like a direct
-- enqueue, the attempts made elsewhere, its error and the delivery it stands in for (a
-- message moved in from an external provider).
ALTER TABLE messages ADD COLUMN next_attempts INTEGER;
ALTER TABLE messages ADD COLUMN next_last_error TEXT;
ALTER TABLE messages ADD COLUMN next_source_delivery_id TEXT;
