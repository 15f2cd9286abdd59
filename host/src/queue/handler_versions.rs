//! Handler components in the shared store (`[host] handlers_source = "store"`): every version
//! deployed (`wharf_handler_versions`), the current version of each handler
//! (`wharf_handler_current`, changed by a deploy or a rollback, with a `NOTIFY` on
//! PostgreSQL), and the deploy log of which host served which version since when, or rejected
//! it and why (`wharf_handler_hosts`).

use serde::Serialize;

use super::QueueError;
use crate::sql::{Dialect, Pool, Sql};

/// The PostgreSQL channel a deploy or rollback notifies (payload: the handler's name).
pub const HANDLERS_CHANNEL: &str = "wharf_handlers";

/// One stored version of a handler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HandlerVersion {
    /// The handler.
    pub name: String,
    /// Its version number (1, 2, … per handler).
    pub version: i64,
    /// SHA-256 of the component, hex.
    pub sha256: String,
    /// The component's size in bytes.
    pub size: i64,
    /// When it was deployed (Unix ms).
    pub deployed_at_ms: i64,
    /// Whether it is the current version.
    pub current: bool,
}

/// The version every host should serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CurrentVersion {
    /// The handler.
    pub name: String,
    /// The version.
    pub version: i64,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// What a host did with a version of a handler, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedVersion {
    /// The host.
    pub host: String,
    /// The handler.
    pub name: String,
    /// The version.
    pub version: i64,
    /// When the host started serving it, or rejected it (Unix ms).
    pub since_ms: i64,
    /// `serving` or `rejected`.
    pub result: String,
    /// Why it was rejected.
    pub error: Option<String>,
}

/// What a deploy or rollback changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionChange {
    /// The handler.
    pub name: String,
    /// The version current before (`None`: the handler is new).
    pub from: Option<i64>,
    /// The version current now.
    pub to: i64,
    /// Whether anything changed (a deploy of the current component changes nothing).
    pub changed: bool,
}

const CURRENT_OF: Sql = Sql::both(
    "SELECT c.version, v.sha256 FROM wharf_handler_current c \
     JOIN wharf_handler_versions v ON v.name = c.name AND v.version = c.version WHERE c.name = $1",
);

const NEXT_VERSION: Sql =
    Sql::both("SELECT COALESCE(MAX(version), 0) + 1 FROM wharf_handler_versions WHERE name = $1");

const INSERT_VERSION: Sql = Sql::both(
    "INSERT INTO wharf_handler_versions (name, version, sha256, size, component, deployed_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6)",
);

const SET_CURRENT: Sql = Sql::both(
    "INSERT INTO wharf_handler_current (name, version, changed_at_ms, change) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (name) DO UPDATE SET version = excluded.version, \
     changed_at_ms = excluded.changed_at_ms, change = excluded.change",
);

const NOTIFY: &str = "SELECT pg_notify($1, $2)";

const CURRENT: Sql = Sql::both(
    "SELECT c.name, c.version, v.sha256 FROM wharf_handler_current c \
     JOIN wharf_handler_versions v ON v.name = c.name AND v.version = c.version ORDER BY c.name",
);

const COMPONENT: Sql =
    Sql::both("SELECT component FROM wharf_handler_versions WHERE name = $1 AND version = $2");

const VERSIONS: Sql = Sql::both(
    "SELECT v.name, v.version, v.sha256, v.size, v.deployed_at_ms, \
     (c.version IS NOT NULL) AS current FROM wharf_handler_versions v \
     LEFT JOIN wharf_handler_current c ON c.name = v.name AND c.version = v.version \
     WHERE v.name = $1 ORDER BY v.version",
);

const VERSION_EXISTS: Sql =
    Sql::both("SELECT version FROM wharf_handler_versions WHERE name = $1 AND version = $2");

const PREVIOUS: Sql =
    Sql::both("SELECT MAX(version) FROM wharf_handler_versions WHERE name = $1 AND version < $2");

const RECORD: Sql = Sql::both(
    "INSERT INTO wharf_handler_hosts (host, name, version, since_ms, result, error) \
     VALUES ($1, $2, $3, $4, $5, $6)",
);

const SERVED: Sql = Sql::both(
    "SELECT host, name, version, since_ms, result, error FROM wharf_handler_hosts \
     WHERE ($1 = '' OR name = $1) ORDER BY seq",
);

/// Store `component` (content `sha256`) as the next version of `name` and make it current,
/// in one transaction; a deploy of the current version's content changes nothing.
pub(crate) async fn deploy(
    pool: &Pool,
    name: &str,
    component: &[u8],
    sha256: &str,
    now: i64,
) -> Result<VersionChange, QueueError> {
    let mut tx = pool.begin().await?;
    let current = tx
        .conn()
        .query(&CURRENT_OF)
        .bind(name)
        .fetch_optional()
        .await?;
    let from = match &current {
        Some(row) => {
            let version: i64 = row.get(0)?;
            if row.get::<String, _>(1)? == sha256 {
                return Ok(VersionChange {
                    name: name.to_string(),
                    from: Some(version),
                    to: version,
                    changed: false,
                });
            }
            Some(version)
        }
        None => None,
    };
    let version: i64 = tx
        .conn()
        .query(&NEXT_VERSION)
        .bind(name)
        .fetch_one()
        .await?
        .get(0)?;
    tx.conn()
        .query(&INSERT_VERSION)
        .bind(name)
        .bind(version)
        .bind(sha256)
        .bind(component.len() as i64)
        .bind(component)
        .bind(now)
        .execute()
        .await
        .map_err(|e| match e.as_database_error().map(|d| d.is_unique_violation()) {
            Some(true) => QueueError::Conflict(format!(
                "another deploy of handler `{name}` committed version {version} at the same time: deploy again"
            )),
            _ => e.into(),
        })?;
    make_current(tx, name, version, now, "deploy").await?;
    Ok(VersionChange {
        name: name.to_string(),
        from,
        to: version,
        changed: true,
    })
}

/// Make version `to` of `name` current (`None`: the highest version below the current one).
pub(crate) async fn rollback(
    pool: &Pool,
    name: &str,
    to: Option<i64>,
    now: i64,
) -> Result<VersionChange, QueueError> {
    let mut tx = pool.begin().await?;
    let Some(current) = tx
        .conn()
        .query(&CURRENT_OF)
        .bind(name)
        .fetch_optional()
        .await?
    else {
        return Err(QueueError::NotFound(format!(
            "handler `{name}` has no version in the store: deploy one with `wharf handlers deploy FILE --name {name}`"
        )));
    };
    let from: i64 = current.get(0)?;
    let to = match to {
        Some(to) => {
            let exists = tx
                .conn()
                .query(&VERSION_EXISTS)
                .bind(name)
                .bind(to)
                .fetch_optional()
                .await?;
            if exists.is_none() {
                return Err(QueueError::NotFound(format!(
                    "handler `{name}` has no version {to}: `wharf handlers history {name}` lists its versions"
                )));
            }
            to
        }
        None => {
            let previous: Option<i64> = tx
                .conn()
                .query(&PREVIOUS)
                .bind(name)
                .bind(from)
                .fetch_one()
                .await?
                .get(0)?;
            previous.ok_or_else(|| {
                QueueError::NotFound(format!(
                    "handler `{name}` has no version before {from} to roll back to"
                ))
            })?
        }
    };
    if to == from {
        return Ok(VersionChange {
            name: name.to_string(),
            from: Some(from),
            to,
            changed: false,
        });
    }
    make_current(tx, name, to, now, "rollback").await?;
    Ok(VersionChange {
        name: name.to_string(),
        from: Some(from),
        to,
        changed: true,
    })
}

/// Set the current version, notify every host (PostgreSQL) and commit.
async fn make_current(
    mut tx: crate::sql::Tx,
    name: &str,
    version: i64,
    now: i64,
    change: &str,
) -> Result<(), QueueError> {
    tx.conn()
        .query(&SET_CURRENT)
        .bind(name)
        .bind(version)
        .bind(now)
        .bind(change)
        .execute()
        .await?;
    if tx.conn().dialect() == Dialect::Postgres {
        tx.conn()
            .query(NOTIFY)
            .bind(HANDLERS_CHANNEL)
            .bind(name)
            .execute()
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The current version of every handler in the store, by name.
pub(crate) async fn current(pool: &Pool) -> Result<Vec<CurrentVersion>, QueueError> {
    let rows = pool.query(&CURRENT).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok(CurrentVersion {
                name: r.get(0)?,
                version: r.get(1)?,
                sha256: r.get(2)?,
            })
        })
        .collect()
}

/// The component of version `version` of `name`.
pub(crate) async fn component(
    pool: &Pool,
    name: &str,
    version: i64,
) -> Result<Vec<u8>, QueueError> {
    let row = pool
        .query(&COMPONENT)
        .bind(name)
        .bind(version)
        .fetch_optional()
        .await?
        .ok_or_else(|| {
            QueueError::NotFound(format!("handler `{name}` has no version {version}"))
        })?;
    Ok(row.get(0)?)
}

/// Every stored version of `name`, oldest first.
pub(crate) async fn versions(pool: &Pool, name: &str) -> Result<Vec<HandlerVersion>, QueueError> {
    let rows = pool.query(&VERSIONS).bind(name).fetch_all().await?;
    rows.iter()
        .map(|r| {
            Ok(HandlerVersion {
                name: r.get(0)?,
                version: r.get(1)?,
                sha256: r.get(2)?,
                size: r.get(3)?,
                deployed_at_ms: r.get(4)?,
                current: r.get(5)?,
            })
        })
        .collect()
}

/// Record in the deploy log what a host did with a version.
pub(crate) async fn record(pool: &Pool, served: &ServedVersion) -> Result<(), QueueError> {
    pool.query(&RECORD)
        .bind(served.host.as_str())
        .bind(served.name.as_str())
        .bind(served.version)
        .bind(served.since_ms)
        .bind(served.result.as_str())
        .bind(served.error.as_deref())
        .execute()
        .await?;
    Ok(())
}

/// The deploy log of `name` (`None`: every handler), oldest first.
pub(crate) async fn served(
    pool: &Pool,
    name: Option<&str>,
) -> Result<Vec<ServedVersion>, QueueError> {
    let rows = pool
        .query(&SERVED)
        .bind(name.unwrap_or(""))
        .fetch_all()
        .await?;
    rows.iter()
        .map(|r| {
            Ok(ServedVersion {
                host: r.get(0)?,
                name: r.get(1)?,
                version: r.get(2)?,
                since_ms: r.get(3)?,
                result: r.get(4)?,
                error: r.get(5)?,
            })
        })
        .collect()
}
