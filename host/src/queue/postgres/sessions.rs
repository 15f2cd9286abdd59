//! Ordered sessions on PostgreSQL ([`crate::queue::sessions`] holds the rules and the SQL):
//! tending sessions in the caller's transaction, settling handoffs and listing blocked
//! sessions.

use sqlx::PgConnection;

use super::PostgresStore;
use super::statements::TEND;
use crate::queue::sessions::session_commands;

session_commands!(PostgresStore, PgConnection, TEND);
