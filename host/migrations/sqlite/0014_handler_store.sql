-- Handler components deployed to the shared store (`[host] handlers_source = "store"`): every
-- version kept, the current one of each handler, and which host served which version since
-- when (or rejected it, and why).
CREATE TABLE wharf_handler_versions (
    name            TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    sha256          TEXT    NOT NULL,
    size            INTEGER NOT NULL,
    component       BLOB    NOT NULL,
    deployed_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE wharf_handler_current (
    name            TEXT    PRIMARY KEY,
    version         INTEGER NOT NULL,
    changed_at_ms   INTEGER NOT NULL,
    change          TEXT    NOT NULL
);
CREATE TABLE wharf_handler_hosts (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    host            TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    since_ms        INTEGER NOT NULL,
    result          TEXT    NOT NULL,
    error           TEXT
);
CREATE INDEX wharf_handler_hosts_by_name ON wharf_handler_hosts (name, seq);
