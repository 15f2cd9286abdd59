-- Handler components deployed to the shared store (`[host] handlers_source = "store"`): every
-- version kept, the current one of each handler, and which host served which version since
-- when (or rejected it, and why).
CREATE TABLE IF NOT EXISTS wharf_handler_versions (
    name            TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    sha256          TEXT    NOT NULL,
    size            BIGINT  NOT NULL,
    component       BYTEA   NOT NULL,
    deployed_at_ms  BIGINT  NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS wharf_handler_current (
    name            TEXT    PRIMARY KEY,
    version         BIGINT  NOT NULL,
    changed_at_ms   BIGINT  NOT NULL,
    change          TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS wharf_handler_hosts (
    seq             BIGSERIAL PRIMARY KEY,
    host            TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    version         BIGINT  NOT NULL,
    since_ms        BIGINT  NOT NULL,
    result          TEXT    NOT NULL,
    error           TEXT
);
CREATE INDEX IF NOT EXISTS wharf_handler_hosts_by_name ON wharf_handler_hosts (name, seq);
