//! Choosing and opening the store from a DSN, and the start-up probe. The
//! DSN itself is never formatted into a message.

use std::sync::Arc;
use std::time::Duration;

use leaderelection::{postgres, LeaseCheck, MySqlStore, PostgresStore, Store, StoreError};

use crate::args::{Db, Fail};
use crate::{EX_NOPERM, EX_UNAVAILABLE};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Mysql,
}

impl Dialect {
    /// From a DSN's scheme: `mysql://` is MySQL; `postgres://`,
    /// `postgresql://` and libpq's `key=value` form are PostgreSQL.
    pub fn of_dsn(dsn: &str) -> Result<Dialect, Fail> {
        let scheme = dsn.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("mysql") => Ok(Dialect::Mysql),
            Some("postgres" | "postgresql") | None => Ok(Dialect::Postgres),
            Some(_) => Err(Fail::usage("the DSN must start with postgres:// or mysql://")),
        }
    }

    pub fn parse(name: &str) -> Result<Dialect, Fail> {
        match name {
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "mysql" | "mariadb" => Ok(Dialect::Mysql),
            _ => Err(Fail::usage(format!("--dialect: {name:?} is neither postgres nor mysql"))),
        }
    }
}

/// The DSN from `--dsn`, else `LEADERELECTION_DSN`, else `DATABASE_URL`.
pub fn dsn(db: &Db) -> Option<String> {
    let env = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
    db.dsn.clone().or_else(|| env("LEADERELECTION_DSN")).or_else(|| env("DATABASE_URL"))
}

/// Splits a postgres `--table` into schema and table (`public` by default).
pub fn pg_table(table: Option<&str>) -> (&str, &str) {
    match table {
        None => (postgres::DEFAULT_SCHEMA, postgres::DEFAULT_TABLE),
        Some(t) => t.split_once('.').unwrap_or((postgres::DEFAULT_SCHEMA, t)),
    }
}

/// The store as the database it is, for what only it can do: the lease
/// check's statement for the child's own transactions.
#[derive(Clone)]
pub enum Opened {
    Postgres(PostgresStore),
    Mysql(MySqlStore),
}

impl Opened {
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Opened::Postgres(s) => Arc::new(s.clone()),
            Opened::Mysql(s) => Arc::new(s.clone()),
        }
    }

    /// The lease check of `check`'s term as one complete statement (ending
    /// in `;`) that fails by itself once the term no longer holds the
    /// lease: `LEADERELECTION_CHECK_SQL`.
    pub fn check_sql(&self, check: &LeaseCheck<'_>) -> Result<String, StoreError> {
        match self {
            Opened::Postgres(s) => s.lease_check_literal(check),
            Opened::Mysql(s) => s.lease_check_literal(check).map(|q| format!("{q};")),
        }
    }
}

/// Builds the store (no connection yet). A DSN that does not parse or a bad
/// table name is a usage error.
pub fn open(db: &Db) -> Result<Arc<dyn Store>, Fail> {
    open_as(db).map(|o| o.store())
}

/// As [`open`], keeping which database it is.
pub fn open_as(db: &Db) -> Result<Opened, Fail> {
    let dsn =
        dsn(db).ok_or_else(|| Fail::usage("no database: pass --dsn or set LEADERELECTION_DSN (or DATABASE_URL)"))?;
    let store: Result<Opened, StoreError> = match Dialect::of_dsn(&dsn)? {
        Dialect::Postgres => {
            let (schema, table) = pg_table(db.table.as_deref());
            PostgresStore::builder(&dsn).table(schema, table).build().map(Opened::Postgres)
        }
        Dialect::Mysql => {
            let mut b = MySqlStore::builder(&dsn);
            if let Some(t) = &db.table {
                b = b.table(t.as_str());
            }
            b.build().map(Opened::Mysql)
        }
    };
    store.map_err(|e| Fail::usage(format!("bad database settings: {e}")))
}

/// A store error as an exit: fatal is 77, anything else 69.
pub fn store_fail(e: &StoreError) -> Fail {
    if e.is_fatal() {
        Fail::new(EX_NOPERM, format!("fatal database error: {e}"))
    } else {
        Fail::new(EX_UNAVAILABLE, format!("database unreachable: {e}"))
    }
}

/// Reads the election once; a missing row is fine (nobody led yet).
pub fn inspect(store: &dyn Store, name: &str, timeout: Duration) -> Result<Option<leaderelection::Lease>, Fail> {
    match store.inspect(name, timeout) {
        Ok(lease) => Ok(Some(lease)),
        Err(e) if e.is_no_lease() => Ok(None),
        Err(e) => Err(store_fail(&e)),
    }
}
