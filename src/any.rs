//! A store chosen by its DSN (features `postgres` and `mysql`).

use crate::guard::LeaseCheck;
use crate::store::StoreError;
#[cfg(feature = "mysql")]
use crate::MySqlStore;
#[cfg(feature = "postgres")]
use crate::PostgresStore;

/// A [`Store`](crate::Store) picked by the scheme of a DSN, from [`connect`]: a
/// `PostgresStore` for `postgres://` and
/// `postgresql://` URLs and libpq's `key=value` strings, a
/// `MySqlStore` for `mysql://` URLs. Each needs its
/// feature. Clones share the pool.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// PostgreSQL (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
    /// MySQL or MariaDB (feature `mysql`).
    #[cfg(feature = "mysql")]
    Mysql(MySqlStore),
}

/// Opens the store a DSN names, on the default table, with the store's
/// defaults (see [`connect_table`] for another table). Opens no
/// connection yet: a wrong password shows up in the first call.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use leaderelection::{Config, Elector};
///
/// let dsn = std::env::var("DATABASE_URL")?; // postgres://… or mysql://…
/// let store = leaderelection::connect(&dsn)?;
/// store.ensure_schema()?;
/// let elector = Elector::start(Config::new(store, "invoice-reconciler"))?;
/// # drop(elector);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// A fatal error when the scheme is neither PostgreSQL's nor MySQL's, when
/// its feature is not enabled, or when the store refuses the DSN. The DSN
/// (which may hold a password) is never part of the message.
pub fn connect(dsn: &str) -> Result<AnyStore, StoreError> {
    connect_table(dsn, None)
}

/// As [`connect`], on `table`: `schema.table` or `table` (schema `public`)
/// on PostgreSQL, `table` in the URL's database on MySQL; `None` for the
/// default table.
///
/// # Errors
///
/// As [`connect`]; a bad table name too.
pub fn connect_table(dsn: &str, table: Option<&str>) -> Result<AnyStore, StoreError> {
    let scheme = dsn.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("postgres" | "postgresql") | None => postgres(dsn, table),
        Some("mysql") => mysql(dsn, table),
        Some(_) => Err(StoreError::fatal("the DSN must start with postgres://, postgresql:// or mysql://")),
    }
}

#[cfg(feature = "postgres")]
fn postgres(dsn: &str, table: Option<&str>) -> Result<AnyStore, StoreError> {
    let mut b = PostgresStore::builder(dsn);
    if let Some(t) = table {
        let (schema, table) = t.split_once('.').unwrap_or((crate::postgres::DEFAULT_SCHEMA, t));
        b = b.table(schema, table);
    }
    b.build().map(AnyStore::Postgres)
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &str, _: Option<&str>) -> Result<AnyStore, StoreError> {
    Err(StoreError::fatal("a PostgreSQL DSN needs the leaderelection feature `postgres`"))
}

#[cfg(feature = "mysql")]
fn mysql(dsn: &str, table: Option<&str>) -> Result<AnyStore, StoreError> {
    let mut b = MySqlStore::builder(dsn);
    if let Some(t) = table {
        b = b.table(t);
    }
    b.build().map(AnyStore::Mysql)
}

#[cfg(not(feature = "mysql"))]
fn mysql(_: &str, _: Option<&str>) -> Result<AnyStore, StoreError> {
    Err(StoreError::fatal("a MySQL DSN needs the leaderelection feature `mysql`"))
}

/// Runs `$body` with `$s` bound to the store inside, whichever it is.
macro_rules! each {
    ($self:expr, $s:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $body,
            #[cfg(feature = "mysql")]
            AnyStore::Mysql($s) => $body,
        }
    };
}

impl AnyStore {
    /// Creates the election table (and what it needs) if missing, and
    /// upgrades an older one: the store's own `ensure_schema`.
    ///
    /// # Errors
    ///
    /// The store's classified error.
    pub fn ensure_schema(&self) -> Result<(), StoreError> {
        each!(self, s => s.ensure_schema())
    }

    /// Marks every election's row as inherited after the database was
    /// restored from a backup of itself: the store's own `after_restore`.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn after_restore(&self) -> Result<u64, StoreError> {
        each!(self, s => s.after_restore())
    }

    /// The lease check of `check`'s term with its values written in, as one
    /// statement that fails by itself once the term no longer holds the
    /// lease: the store's own `lease_check_literal`.
    ///
    /// # Errors
    ///
    /// As the store's.
    pub fn lease_check_literal(&self, check: &LeaseCheck<'_>) -> Result<String, StoreError> {
        each!(self, s => s.lease_check_literal(check))
    }

    /// Turns the store's feed of releases on or off (on by default): the
    /// store's own `release_feed`. Off, followers learn of a release only
    /// by polling; a store whose database offers no feed has none either way.
    pub fn release_feed(self, on: bool) -> AnyStore {
        match self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(s) => AnyStore::Postgres(s.release_feed(on)),
            #[cfg(feature = "mysql")]
            AnyStore::Mysql(s) => AnyStore::Mysql(s.release_feed(on)),
        }
    }
}

crate::store::forward_store!([] AnyStore, each);
