-- MessageIds up to 1024 characters (4 KiB of UTF-8) do not fit a btree entry (2704 bytes):
-- the identity indexes hold the SHA-256 of the id instead, so their size is independent of
-- the id's length. Lookups compare the hash (through the index) and then the id itself.
CREATE OR REPLACE FUNCTION wharf_id_hash(id TEXT) RETURNS BYTEA
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(id, 'UTF8')) $$;

DROP INDEX IF EXISTS messages_identity;
CREATE UNIQUE INDEX messages_identity
    ON messages (queue, wharf_id_hash(message_id)) WHERE message_id IS NOT NULL;

DROP INDEX IF EXISTS message_history_identity;
CREATE INDEX message_history_identity
    ON message_history (queue, wharf_id_hash(message_id), history_key);
