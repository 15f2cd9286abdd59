//! Ordered sessions on SQLite ([`crate::queue::sessions`] holds the rules and the SQL):
//! tending sessions in the caller's transaction, settling handoffs and listing blocked
//! sessions (the store's lease takes only session heads in a queue with sessions).

use sqlx::SqliteConnection;

use super::SqliteStore;
use super::statements::TEND;
use crate::queue::sessions::session_commands;

session_commands!(SqliteStore, SqliteConnection, TEND);
