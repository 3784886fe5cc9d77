//! Choosing and opening the store from a DSN, and the start-up probe. The
//! DSN itself is never formatted into a message.

use std::sync::Arc;
use std::time::Duration;

use leaderelection::{postgres, AnyStore, LeaseCheck, Store, StoreError};

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

/// The check of `check`'s term for the child's own transactions, as one
/// complete statement (ending in `;`) that fails by itself once the term no
/// longer holds the lease: `LEADERELECTION_CHECK_SQL`.
pub fn check_sql(store: &AnyStore, check: &LeaseCheck<'_>) -> Result<String, StoreError> {
    let q = store.lease_check_literal(check)?;
    Ok(if q.trim_end().ends_with(';') { q } else { format!("{q};") })
}

/// Builds the store (no connection yet). A DSN that does not parse or a bad
/// table name is a usage error.
pub fn open(db: &Db) -> Result<Arc<dyn Store>, Fail> {
    open_as(db).map(|s| Arc::new(s) as Arc<dyn Store>)
}

/// As [`open`], keeping which database it is (the library picks the store
/// by the DSN's scheme).
pub fn open_as(db: &Db) -> Result<AnyStore, Fail> {
    let dsn =
        dsn(db).ok_or_else(|| Fail::usage("no database: pass --dsn or set LEADERELECTION_DSN (or DATABASE_URL)"))?;
    Dialect::of_dsn(&dsn)?;
    leaderelection::connect_table(&dsn, db.table.as_deref())
        .map_err(|e| Fail::usage(format!("bad database settings: {e}")))
}

/// A store error as an exit: fatal is 77, anything else 69. A missing
/// table says how to create it.
pub fn store_fail(e: &StoreError, db: &Db) -> Fail {
    if e.is_fatal() {
        let hint =
            if is_missing_table(e) { format!("; create it with `{}`", apply_command(db)) } else { String::new() };
        Fail::new(EX_NOPERM, format!("fatal database error: {e}{hint}"))
    } else {
        Fail::new(EX_UNAVAILABLE, format!("database unreachable: {e}"))
    }
}

/// Whether the store found no election table: SQLSTATE 42P01 (undefined
/// table) on PostgreSQL, server error 1146 on MySQL/MariaDB, as the
/// stores write them.
pub fn is_missing_table(e: &StoreError) -> bool {
    let text = e.to_string();
    text.contains("SQLSTATE 42P01") || text.contains("server error 1146 ")
}

/// The command that creates the table of `db`, as this run names it: `--dsn
/// URL` only when the DSN came from `--dsn` (never the DSN itself), `--table`
/// only when one was given.
pub fn apply_command(db: &Db) -> String {
    let mut cmd = "leaderelection schema --apply".to_owned();
    if db.dsn.is_some() {
        cmd.push_str(" --dsn URL");
    }
    if let Some(t) = &db.table {
        cmd.push_str(&format!(" --table {t}"));
    }
    cmd
}

/// Reads the election once; a missing row is fine (nobody led yet).
pub fn inspect(
    store: &dyn Store, db: &Db, name: &str, timeout: Duration,
) -> Result<Option<leaderelection::Lease>, Fail> {
    match store.inspect(name, timeout) {
        Ok(lease) => Ok(Some(lease)),
        Err(e) if e.is_no_lease() => Ok(None),
        Err(e) => Err(store_fail(&e, db)),
    }
}

/// Which variables a run took its DSN from, for the child's environment:
/// `LEADERELECTION_DSN` always (it is the tool's), `DATABASE_URL` when it
/// was the DSN.
pub fn dsn_vars(db: &Db) -> Vec<&'static str> {
    let set = |k| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let mut vars = vec!["LEADERELECTION_DSN"];
    if db.dsn.is_none() && !set("LEADERELECTION_DSN") && set("DATABASE_URL") {
        vars.push("DATABASE_URL");
    }
    vars
}

/// `schema --apply`: creates the table over the DSN (or upgrades it);
/// returns the line to print.
pub fn apply_schema(db: &Db) -> Result<String, Fail> {
    let store = open_as(db)?;
    let what = match &store {
        AnyStore::Postgres(s) => format!("PostgreSQL table {}.{}", s.table().0, s.table().1),
        AnyStore::Mysql(s) => format!("MySQL table {}", s.table()),
        _ => "table".to_owned(),
    };
    match store.ensure_schema() {
        Ok(()) => Ok(format!("{what} is ready (created if it did not exist)")),
        Err(e) => Err(store_fail(&e, db)),
    }
}
