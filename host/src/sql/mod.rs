//! The SQL dialect layer: the one place where how SQLite says a thing and how PostgreSQL says
//! it differ. Everything above it — the queue, its operator commands, ordered sessions, the
//! consumer inbox's table, external activations and delivery counts — is written once against
//! [`Pool`], [`Conn`] and [`Query`], with each statement given as an [`Sql`]: one text for both
//! dialects, or a text of each where they differ.
//!
//! What stays dialect-specific lives behind a `match` on [`Dialect`] next to the code that
//! needs it (arrays on PostgreSQL, JSON arrays on SQLite), never in a second copy of an
//! algorithm.

mod statement;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{
    ColumnIndex, Decode, Encode, PgConnection, PgPool, Postgres, Sqlite, SqliteConnection,
    SqlitePool, Type,
};

pub(crate) use statement::{Sql, Text};

/// Which SQL a database speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Embedded SQLite: one writer at a time, JSON arrays instead of array types.
    Sqlite,
    /// PostgreSQL: arrays, `FOR UPDATE SKIP LOCKED`, `LISTEN`/`NOTIFY`.
    Postgres,
}

impl Dialect {
    /// The dialect a storage URL names (`postgres://…`/`postgresql://…`, anything else SQLite).
    pub fn of_url(url: &str) -> Dialect {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        }
    }

    /// The rows of the JSON array of strings in parameter `$n`, as a one-column `value` set.
    pub fn json_strings(self, n: u8) -> String {
        match self {
            Dialect::Sqlite => format!("SELECT value FROM json_each(${n})"),
            Dialect::Postgres => {
                format!("SELECT value FROM jsonb_array_elements_text(${n}::jsonb)")
            }
        }
    }
}

/// A connection pool of either dialect.
#[derive(Debug, Clone)]
pub enum Pool {
    /// SQLite connections.
    Sqlite(SqlitePool),
    /// PostgreSQL connections.
    Postgres(PgPool),
}

impl Pool {
    /// Its dialect.
    pub fn dialect(&self) -> Dialect {
        match self {
            Pool::Sqlite(_) => Dialect::Sqlite,
            Pool::Postgres(_) => Dialect::Postgres,
        }
    }

    /// A statement run on any connection of the pool.
    pub fn query(&self, sql: impl Text) -> Query<'_> {
        let on = match self {
            Pool::Sqlite(pool) => On::SqlitePool(pool),
            Pool::Postgres(pool) => On::PostgresPool(pool),
        };
        Query::new(sql, on)
    }

    /// One connection, held until dropped.
    pub async fn acquire(&self) -> Result<Pooled, sqlx::Error> {
        Ok(match self {
            Pool::Sqlite(pool) => Pooled::Sqlite(pool.acquire().await?),
            Pool::Postgres(pool) => Pooled::Postgres(pool.acquire().await?),
        })
    }

    /// A transaction, rolled back unless committed. (On SQLite it starts deferred, so the
    /// first statement should write: the transaction then holds the lock it decides under.)
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(match self {
            Pool::Sqlite(pool) => Tx::Sqlite(pool.begin().await?),
            Pool::Postgres(pool) => Tx::Postgres(pool.begin().await?),
        })
    }

    /// Close every connection.
    pub async fn close(&self) {
        match self {
            Pool::Sqlite(pool) => pool.close().await,
            Pool::Postgres(pool) => pool.close().await,
        }
    }
}

/// A connection taken from a [`Pool`].
pub enum Pooled {
    /// SQLite.
    Sqlite(PoolConnection<Sqlite>),
    /// PostgreSQL.
    Postgres(PoolConnection<Postgres>),
}

impl Pooled {
    /// The connection, to run statements on.
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Pooled::Sqlite(c) => Conn::Sqlite(c),
            Pooled::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// A transaction of either dialect.
pub enum Tx {
    /// SQLite.
    Sqlite(sqlx::Transaction<'static, Sqlite>),
    /// PostgreSQL.
    Postgres(sqlx::Transaction<'static, Postgres>),
}

impl Tx {
    /// The transaction's connection, to run statements in it.
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(tx) => Conn::Sqlite(tx),
            Tx::Postgres(tx) => Conn::Postgres(tx),
        }
    }

    /// Commit.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlite(tx) => tx.commit().await,
            Tx::Postgres(tx) => tx.commit().await,
        }
    }
}

/// One connection of either dialect (in a transaction or not).
pub enum Conn<'c> {
    /// SQLite.
    Sqlite(&'c mut SqliteConnection),
    /// PostgreSQL.
    Postgres(&'c mut PgConnection),
}

impl Conn<'_> {
    /// Its dialect.
    pub fn dialect(&self) -> Dialect {
        match self {
            Conn::Sqlite(_) => Dialect::Sqlite,
            Conn::Postgres(_) => Dialect::Postgres,
        }
    }

    /// A statement run on this connection.
    pub fn query(&mut self, sql: impl Text) -> Query<'_> {
        let on = match self {
            Conn::Sqlite(c) => On::Sqlite(c),
            Conn::Postgres(c) => On::Postgres(c),
        };
        Query::new(sql, on)
    }

    /// The same connection, borrowed again (to pass on while keeping this one).
    pub fn reborrow(&mut self) -> Conn<'_> {
        match self {
            Conn::Sqlite(c) => Conn::Sqlite(c),
            Conn::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// Where a [`Query`] runs.
enum On<'e> {
    SqlitePool(&'e SqlitePool),
    PostgresPool(&'e PgPool),
    Sqlite(&'e mut SqliteConnection),
    Postgres(&'e mut PgConnection),
}

impl On<'_> {
    fn dialect(&self) -> Dialect {
        match self {
            On::SqlitePool(_) | On::Sqlite(_) => Dialect::Sqlite,
            On::PostgresPool(_) | On::Postgres(_) => Dialect::Postgres,
        }
    }
}

enum Statement {
    Sqlite(sqlx::query::Query<'static, Sqlite, SqliteArguments>),
    Postgres(sqlx::query::Query<'static, Postgres, PgArguments>),
}

/// A statement with its parameters, bound to where it runs.
pub struct Query<'e> {
    statement: Statement,
    on: On<'e>,
}

/// Run `$statement` with `$method` on whichever executor `$on` holds.
macro_rules! run {
    ($statement:expr, $on:expr, $method:ident) => {
        match ($statement, $on) {
            (Statement::Sqlite(q), On::SqlitePool(p)) => q.$method(p).await.map(Into::into),
            (Statement::Sqlite(q), On::Sqlite(c)) => q.$method(&mut *c).await.map(Into::into),
            (Statement::Postgres(q), On::PostgresPool(p)) => q.$method(p).await.map(Into::into),
            (Statement::Postgres(q), On::Postgres(c)) => q.$method(&mut *c).await.map(Into::into),
            _ => unreachable!("a query is built for the dialect it runs on"),
        }
    };
}

impl<'e> Query<'e> {
    fn new(sql: impl Text, on: On<'e>) -> Self {
        let text = sql.text(on.dialect());
        let statement = match on.dialect() {
            Dialect::Sqlite => Statement::Sqlite(sqlx::query(text)),
            Dialect::Postgres => Statement::Postgres(sqlx::query(text)),
        };
        Query { statement, on }
    }

    /// Bind the next parameter: any value both dialects encode.
    pub fn bind<'t, T>(mut self, value: T) -> Self
    where
        T: Encode<'t, Sqlite> + Type<Sqlite> + Encode<'t, Postgres> + Type<Postgres>,
    {
        self.statement = match self.statement {
            Statement::Sqlite(q) => Statement::Sqlite(q.bind(value)),
            Statement::Postgres(q) => Statement::Postgres(q.bind(value)),
        };
        self
    }

    /// Bind a value only PostgreSQL encodes (an array), in code that runs only there.
    pub fn bind_postgres<'t, T>(mut self, value: T) -> Self
    where
        T: Encode<'t, Postgres> + Type<Postgres>,
    {
        self.statement = match self.statement {
            Statement::Postgres(q) => Statement::Postgres(q.bind(value)),
            Statement::Sqlite(_) => unreachable!("a PostgreSQL value bound to SQLite"),
        };
        self
    }

    /// Run it; returns the number of rows it changed.
    pub async fn execute(self) -> Result<u64, sqlx::Error> {
        let done: Done = run!(self.statement, self.on, execute)?;
        Ok(done.0)
    }

    /// Run it; returns every row.
    pub async fn fetch_all(self) -> Result<Vec<Row>, sqlx::Error> {
        let rows: Rows = run!(self.statement, self.on, fetch_all)?;
        Ok(rows.0)
    }

    /// Run it; returns the first row, if any.
    pub async fn fetch_optional(self) -> Result<Option<Row>, sqlx::Error> {
        let row: MaybeRow = run!(self.statement, self.on, fetch_optional)?;
        Ok(row.0)
    }

    /// Run it; returns the first row (an error when there is none).
    pub async fn fetch_one(self) -> Result<Row, sqlx::Error> {
        self.fetch_optional().await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// Run it; returns the first column of every row.
    pub async fn fetch_column<T>(self) -> Result<Vec<T>, sqlx::Error>
    where
        T: for<'r> Decode<'r, Sqlite>
            + Type<Sqlite>
            + for<'r> Decode<'r, Postgres>
            + Type<Postgres>,
    {
        self.fetch_all().await?.iter().map(|r| r.get(0)).collect()
    }
}

/// Rows changed, from either dialect's result.
struct Done(u64);
impl From<sqlx::sqlite::SqliteQueryResult> for Done {
    fn from(r: sqlx::sqlite::SqliteQueryResult) -> Self {
        Done(r.rows_affected())
    }
}
impl From<sqlx::postgres::PgQueryResult> for Done {
    fn from(r: sqlx::postgres::PgQueryResult) -> Self {
        Done(r.rows_affected())
    }
}

struct Rows(Vec<Row>);
impl From<Vec<SqliteRow>> for Rows {
    fn from(rows: Vec<SqliteRow>) -> Self {
        Rows(rows.into_iter().map(Row::Sqlite).collect())
    }
}
impl From<Vec<PgRow>> for Rows {
    fn from(rows: Vec<PgRow>) -> Self {
        Rows(rows.into_iter().map(Row::Postgres).collect())
    }
}

struct MaybeRow(Option<Row>);
impl From<Option<SqliteRow>> for MaybeRow {
    fn from(row: Option<SqliteRow>) -> Self {
        MaybeRow(row.map(Row::Sqlite))
    }
}
impl From<Option<PgRow>> for MaybeRow {
    fn from(row: Option<PgRow>) -> Self {
        MaybeRow(row.map(Row::Postgres))
    }
}

/// A row of either dialect.
pub enum Row {
    /// SQLite.
    Sqlite(SqliteRow),
    /// PostgreSQL.
    Postgres(PgRow),
}

impl Row {
    /// The value of a column (by name or position) as a type both dialects decode.
    pub fn get<'r, T, I>(&'r self, column: I) -> Result<T, sqlx::Error>
    where
        T: Decode<'r, Sqlite> + Type<Sqlite> + Decode<'r, Postgres> + Type<Postgres>,
        I: ColumnIndex<SqliteRow> + ColumnIndex<PgRow>,
    {
        use sqlx::Row as _;
        match self {
            Row::Sqlite(row) => row.try_get(column),
            Row::Postgres(row) => row.try_get(column),
        }
    }
}
