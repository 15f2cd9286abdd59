//! Statement texts per dialect ([`Sql`]): one text when both dialects agree, a text of each
//! where they differ. Parameters are `$N` in both (sqlx binds SQLite's `$N` by number, like
//! `?N`).

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::Dialect;

/// A statement in each dialect's words.
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    sqlite: &'static str,
    postgres: &'static str,
}

impl Sql {
    /// One text for both dialects.
    pub const fn both(text: &'static str) -> Sql {
        Sql {
            sqlite: text,
            postgres: text,
        }
    }

    /// A text of each dialect.
    pub const fn each(sqlite: &'static str, postgres: &'static str) -> Sql {
        Sql { sqlite, postgres }
    }

    /// The text `dialect` runs.
    pub fn text(&self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres => self.postgres,
        }
    }
}

/// What a [`super::Query`] can be made from: an [`Sql`], a static text both dialects run, or
/// a text made at run time (a statement naming a configured table) for the dialect at hand.
pub trait Text {
    /// The text for `dialect`.
    fn text(self, dialect: Dialect) -> SqlStr;
}

impl Text for &Sql {
    fn text(self, dialect: Dialect) -> SqlStr {
        Sql::text(self, dialect).into_sql_str()
    }
}

impl Text for &'static str {
    fn text(self, _: Dialect) -> SqlStr {
        self.into_sql_str()
    }
}

impl Text for std::sync::Arc<str> {
    fn text(self, _: Dialect) -> SqlStr {
        AssertSqlSafe(self).into_sql_str()
    }
}

impl Text for String {
    fn text(self, _: Dialect) -> SqlStr {
        AssertSqlSafe(self).into_sql_str()
    }
}
