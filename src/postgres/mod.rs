//! The PostgreSQL store (feature `postgres`).
//!
//! One row per election in a table you name. Every operation is one simple
//! query, `SET LOCAL lock_timeout …; SET LOCAL statement_timeout …;
//! <statement>`, which the server runs as one implicit transaction, so it
//! works unchanged behind PgBouncer in transaction mode: no named prepared
//! statements, no session state, no advisory locks, no `LISTEN`/`NOTIFY`, and
//! no cancel requests.
//!
//! Each call has a real deadline. The server bounds lock waits and statement
//! time with the `SET LOCAL` settings; the client drives each pooled
//! connection on its own current-thread tokio runtime with a timer, and when
//! the deadline passes it drops the connection (closing the socket) and
//! returns a retryable error. A connection whose call timed out or broke is
//! never returned to the pool. No threads are left behind by a hung call.
//!
//! # Examples
//!
//! ```no_run
//! use leaderelection::postgres::PostgresStore;
//! use leaderelection::{Config, Elector};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app@db.internal/app?sslmode=require")?;
//! store.ensure_schema()?;
//! let elector = Elector::start(Config::new(store, "invoice-reconciler"))?;
//! let guard = elector.wait_leader()?;
//! # drop(guard);
//! # Ok(())
//! # }
//! ```
//!
//! # In detail
//!
//! - **Schema.** One row per election in `public.leader_election` by default
//!   (`PostgresStore::builder(dsn).table(schema, table)` for another; names are
//!   always quoted). `PostgresStore::schema(schema, table)` returns the DDL for
//!   a migration tool when the application role may not create tables; the
//!   store itself needs only `SELECT`, `INSERT` and `UPDATE` on the table. The
//!   table has `fillfactor = 70` so renewals stay HOT updates (checked in
//!   the tests: every renewal HOT while its page has room; the server frees
//!   room only behind its oldest open transaction).
//! - **Terms.** The `terms` column counts an election's terms, for operators
//!   (fences are not small consecutive numbers, so they do not show
//!   flapping; see "Queries for operators" in the repository's
//!   `docs/operating.md`). The claiming statement keeps it:
//!   1 for an absent row, one more for each claim of an expired or released
//!   lease (the condition that gives a new fence); renewals, the holder's
//!   re-acquire of its valid lease, releases and reads leave it alone. No call
//!   reads it. A table created by an earlier version lacks it: until it is
//!   added, acquire fails with a fatal 42703 whose message gives the
//!   statement, `ALTER TABLE "public"."leader_election" ADD COLUMN IF NOT
//!   EXISTS terms bigint NOT NULL DEFAULT 0 CHECK (terms >= 0)` (your names,
//!   quoted). `ensure_schema()` (as the table's owner) runs it when the catalog says the column is
//!   missing (so an up-to-date table takes no lock), waiting for its `ACCESS
//!   EXCLUSIVE` lock at most 200 ms at a time so renewals queued behind it
//!   still answer (tested: inspects with a 500 ms timeout, slowest 201 ms),
//!   until the DDL timeout. Old rows start at 0. A deleted row starts again
//!   at 1; a restored older copy brings its count back.
//! - **One statement per operation**, sent with the simple-query protocol as
//!   `SET LOCAL lock_timeout …; SET LOCAL statement_timeout …; <statement>` in
//!   one implicit transaction. Every instant, including `now()`, comes from
//!   the server in that statement.
//! - **Behind PgBouncer in transaction mode** nothing changes: no named prepared
//!   statements, no session state, no advisory locks, no `LISTEN`/`NOTIFY`, no
//!   cancel requests. Point the DSN at the pooler. After a server restart
//!   PgBouncer turns logins away for `server_login_retry` (15 s by default);
//!   during that time nobody can lead, so operators who want fast failover set
//!   it to about 1 s.
//! - **A real operation timeout.** Each pooled connection runs on its own
//!   current-thread tokio runtime inside the store (nothing async in the API).
//!   When a call passes its deadline, the store drops the connection, closing
//!   the socket, and the connection never goes back to the pool. A stopped
//!   server, a locked row, a table under `ACCESS EXCLUSIVE` or a path that
//!   swallows packets all hand control back within the timeout.
//! - **TLS.** `sslmode=require` (and `verify-ca`/`verify-full`) verifies the
//!   certificate and host name, through `native-tls` (OpenSSL on Linux);
//!   `sslrootcert=PATH` in the DSN or `builder(dsn).ca_file(path)` adds a CA
//!   to the system's. A DSN that asks for TLS never falls back to plaintext.
//!   `prefer`, the libpq default, and `disable` connect in plaintext: say
//!   `require`.
//! - **TLS errors are classified by cause.** A certificate or host name that
//!   does not verify (`TLS handshake rejected: … certificate verify failed …
//!   (self-signed certificate)`) and a server or pooler without TLS (`the server
//!   does not support TLS`) are fatal. A handshake cut by the network — reset,
//!   closed, broken pipe, as when PgBouncer or the server restarts — is
//!   retryable (`TLS handshake cut off (connection reset): …`), so a leader
//!   rides it out until its deadline like any other connection loss.
//! - **Errors** are classified from SQLSTATE: undefined table, insufficient
//!   privilege, missing database (3D000) or role (28000), bad password (28P01)
//!   and the like are fatal (nobody leads until fixed, and
//!   `status().last_error` says why, with the server's message); connection
//!   loss, admin shutdown, a server starting up (57P03), read-only transaction
//!   (25006), serialization failure, too many connections and lock timeouts
//!   are retryable. A login that fails with the connection intact and no
//!   SQLSTATE (the server asks for a password the DSN does not have, an
//!   authentication method the driver does not speak) is fatal. PgBouncer
//!   answers a missing database or unknown user itself with 08P01 (protocol
//!   violation), the code it also uses for passing trouble, so through
//!   PgBouncer those are retryable. No password appears in any error, log line
//!   or `Debug` output.
//! - **First mistakes come back at once.** `connect()` opens no connection;
//!   the first call does, and reports what the server said as soon as it says
//!   it, not after a pool timeout. Measured on the first `ensure_schema()`:
//!
//!   | Mistake | What the call returns | After |
//!   |---|---|---|
//!   | database does not exist | fatal, `postgres ensure_schema: cannot connect: SQLSTATE 3D000: FATAL: database "x" does not exist` | 5–25 ms |
//!   | role does not exist | fatal, `SQLSTATE 28000` | ~10 ms |
//!   | bad password (a fake server; the test servers trust) | fatal, `SQLSTATE 28P01` | 3–18 ms |
//!   | certificate does not verify | fatal, `TLS handshake rejected: … certificate verify failed …` | 2–20 ms |
//!   | `sslmode=require` against a server or pooler without TLS | fatal, `the server does not support TLS` | 3–35 ms |
//!   | nothing listens on the port | retryable, `cannot connect: connection refused` | ~1 ms |
//!   | the server accepts TCP but never answers | retryable, `cannot connect: no answer within 5s (connect timeout)` | the connect timeout |
//!
//!   Before this, each took 30 s (the DDL timeout) to report. Through an
//!   `Elector`, `status().last_error` holds the fatal error 20–45 ms after
//!   `Elector::start`. A call never waits for a connection longer than the
//!   connect timeout (5 s by default, `builder(dsn).connect_timeout(d)` or
//!   `connect_timeout=` in the DSN) nor past its own timeout: an elector call
//!   bounded by `operation_timeout` returns within it. Once an attempt has
//!   failed fatally, later calls return that error at once while the pool
//!   keeps retrying in the background (at most every half connect timeout);
//!   the first success clears it. A pool you build yourself
//!   (`PostgresStore::from_pool`) keeps only the text of its last error, so
//!   calls through it wait out its `connection_timeout` before reporting (the
//!   kind is still read from the SQLSTATE or the TLS reason).
//! - **Connections.** Each store keeps a pool of at most 4 connections by
//!   default (`builder(dsn).pool_size(n)`), opened lazily. After an outage the
//!   calls that waited for a connection leave the pool near its maximum until
//!   the 5-minute idle timeout closes them, so a fleet of N participants can
//!   hold about 4N sessions for that long after the database comes back; size
//!   `max_connections` (or the pooler) for that.
//! - **Batches.** `acquire_many`, `renew_many`, `release_many` and
//!   `inspect_many` (see [`crate::batch`]) each send one simple query: one
//!   transaction, one `now()`, every row decided as the single statement
//!   decides it. The items travel as array constants unnested `WITH
//!   ORDINALITY`, and each answer row carries its item's position.
//!   Renewals and releases are one `UPDATE … FROM` the items (renewals stay
//!   HOT updates, and pass lease checks as single ones do); reads one join.
//!   A claim batch never waits for a row lock, so no two processes'
//!   batches can deadlock: it inserts the absent rows in name order, then
//!   locks the rest `SKIP LOCKED`. A row under a lease check is answered at once with
//!   a retryable error (the check still holds its claim off, as it does a
//!   single claim's); a row another writer holds (a claim or renewal in
//!   progress) is run again in a new transaction for up to 500 ms. An
//!   election named twice in one batch is sent once and both items get its
//!   answer.
//! - **Group members.** Heartbeats live in `table_members` beside the
//!   election table (`ensure_schema` makes it; it is in `schema()`'s DDL):
//!   one row per group and member, its expiry only ever moved later. A
//!   heartbeat is one statement that also counts the live members and
//!   deletes the group's rows expired over an hour ago. Without the table,
//!   heartbeats fail fatally saying to run `ensure_schema`.
//! - **Durable commits.** Keep `synchronous_commit = on` for the election's
//!   database (see "What is not guaranteed" in the repository's
//!   `docs/design.md`).

mod batch;
mod check;
mod conn;
mod listen;
mod locks;
mod sql;
mod tls;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::SimpleQueryMessage;

use crate::batch::{BatchItem, Heartbeat, Members};
use crate::error::Human;
use crate::ident::{quote_postgres, IdentError};
use crate::lease::Lease;
use crate::lockfeed::{told, told_each};
use crate::slot::SlotClaim;
use crate::store::{Released, Store, StoreError};

pub use conn::{PgConnection, PgManager};
/// The parsed connection settings [`PgManager::new`] takes.
pub use tokio_postgres::Config as PgConfig;

/// Default schema of the election table.
pub const DEFAULT_SCHEMA: &str = "public";
/// Default name of the election table.
pub const DEFAULT_TABLE: &str = "leader_election";
/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: u32 = 4;
/// Default bound on opening one connection (TCP, TLS and login together).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Threads the store's pool opens connections on (r2d2's background
/// threads; three by default there).
const POOL_THREADS: usize = 2;

/// Default bound on [`PostgresStore::ensure_schema`].
pub const DEFAULT_DDL_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Store`] that keeps leases in a PostgreSQL table.
///
/// Build one with [`PostgresStore::connect`], [`PostgresStore::builder`], or
/// [`PostgresStore::from_pool`] around an r2d2 pool you configured. Clones
/// share the pool.
///
/// Connections are opened lazily: a bad password or a missing database shows
/// up in the first call (and so in [`Elector::status`](crate::Elector::status)),
/// not in `connect`. Only a DSN that cannot be parsed fails `connect`.
///
/// # Errors of the first call
///
/// The first call reports what the server said as soon as it says it: a
/// missing database (3D000) or role (28000), a bad password (28P01), a
/// certificate that does not verify (`TLS handshake rejected: …`) or a
/// server without TLS under `sslmode=require` come back at once as fatal
/// errors with the SQLSTATE or the TLS reason. A refused connection comes
/// back at once as retryable; a server that accepts TCP but never answers,
/// at the connect timeout. No call waits longer than the connect timeout for
/// a connection, nor past its own timeout.
///
/// TLS failures are classified by cause: one the TLS library decided with
/// the socket intact (certificate, host name) is fatal, one where the socket
/// under the handshake failed (reset, closed) is retryable.
#[derive(Clone)]
pub struct PostgresStore {
    pool: r2d2::Pool<PgManager>,
    schema: String,
    table: String,
    qualified: String,
    ddl_timeout: Duration,
    /// How connection attempts went, shared with the manager when this
    /// store built it.
    connect_log: Option<Arc<conn::ConnectLog>>,
    /// The longest a call waits for a connection (the connect timeout, or
    /// the pool's connection timeout for a pool built elsewhere).
    connect_wait: Duration,
    server: Option<String>,
    /// A lease check has found the unique index it needs.
    fence_index_seen: Arc<std::sync::atomic::AtomicBool>,
    /// The failover rule (see `sql::acquire`); off only in the negative
    /// controls of the failover tests.
    failover_rule: bool,
    /// Writes override every read-only default, the operator's too; on
    /// only in the negative controls of the read-only tests.
    overrides_read_only: bool,
    /// Rows are stamped with the timeline alone, as before issue 34; on
    /// only in the negative controls of the cutover and restore tests.
    timeline_only_history: bool,
    /// The channel releases notify (`listen::channel` of the table).
    channel: String,
    /// The feed of releases ([`Store::releases`]); `None` when turned off.
    feed: Option<Arc<listen::Feed>>,
    /// Its locks, which wake follower processes one at a time where the
    /// server's sessions are their own (see `locks.rs`); `None` with the
    /// feed.
    locks: Option<Arc<locks::Feed>>,
    /// What the feed connects with: the manager this store built its pool
    /// with (`None` for a pool built elsewhere, which has no feed).
    feed_manager: Option<Arc<PgManager>>,
}

/// Settings for a [`PostgresStore`], from [`PostgresStore::builder`].
pub struct PostgresBuilder {
    dsn: String,
    schema: String,
    table: String,
    pool_size: u32,
    connect_timeout: Option<Duration>,
    ca_file: Option<PathBuf>,
    ddl_timeout: Duration,
    release_feed: bool,
}

impl fmt::Debug for PostgresBuilder {
    // The DSN may hold a password: never show it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBuilder")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl PostgresBuilder {
    /// The schema and table that hold the elections. Defaults to
    /// [`DEFAULT_SCHEMA`]`.`[`DEFAULT_TABLE`]. Both are always quoted, so any
    /// name PostgreSQL accepts works and none can inject SQL.
    pub fn table(mut self, schema: impl Into<String>, table: impl Into<String>) -> PostgresBuilder {
        self.schema = schema.into();
        self.table = table.into();
        self
    }

    crate::setters::setters!(PostgresBuilder {
        /// How many connections the pool keeps at most. Defaults to
        /// [`DEFAULT_POOL_SIZE`]; an elector needs one, plus one per call it
        /// abandoned at the operation timeout until that call is cleaned up.
        pool_size(n: u32) => pool_size = n.max(1);

        /// Bound on opening one connection: TCP connect, TLS handshake and login
        /// together. Defaults to the DSN's `connect_timeout`, else
        /// [`DEFAULT_CONNECT_TIMEOUT`].
        connect_timeout(d: Duration) => connect_timeout = Some(d);

        /// A PEM file of CA certificates that sign the server's certificate,
        /// trusted in addition to the system's. Setting it requires TLS (as
        /// `sslmode=require`). The DSN parameter `sslrootcert=PATH` does the same.
        ca_file(path: impl AsRef<Path>) => ca_file = Some(path.as_ref().to_owned());

        /// Bound on [`PostgresStore::ensure_schema`]. Defaults to
        /// [`DEFAULT_DDL_TIMEOUT`].
        ddl_timeout(d: Duration) => ddl_timeout = d;

        /// Whether the store keeps a feed of releases
        /// ([`PostgresStore::release_feed`]); on by default.
        release_feed(on: bool) => release_feed = on;
    });

    /// Builds the store. Opens no connection.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the DSN cannot be parsed, the table name
    /// is invalid, or the CA file cannot be read. The error never repeats the
    /// DSN, so it cannot leak a password.
    pub fn build(self) -> Result<PostgresStore, StoreError> {
        let manager = PgManager::from_dsn(&self.dsn, self.connect_timeout, self.ca_file.as_deref())?;
        let feed_manager = Arc::new(manager.clone());
        let timeout = manager.connect_timeout();
        let log = manager.connect_log();
        let server = format!("{manager:?}");
        let pool = r2d2::Pool::builder()
            // r2d2 opens connections (and reaps idle ones) on a thread pool
            // of its own, three threads by default: two do, so a process
            // with a group stays within eight threads (a hung connect is
            // bounded by the connect timeout either way).
            .thread_pool(Arc::new(
                scheduled_thread_pool::ScheduledThreadPool::builder()
                    .num_threads(POOL_THREADS)
                    .thread_name_pattern("le-pg-pool-{}")
                    .build(),
            ))
            .max_size(self.pool_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .error_handler(Box::new(conn::LogConnectErrors))
            .connection_timeout(timeout)
            .idle_timeout(Some(Duration::from_secs(300)))
            .max_lifetime(Some(Duration::from_secs(1800)))
            .build_unchecked(manager);
        let mut store = PostgresStore::from_parts(pool, &self.schema, &self.table, self.ddl_timeout)?;
        store.connect_log = Some(log);
        // The attempt's own failure at its timeout then arrives before the
        // call stops waiting, so the call can say why.
        store.connect_wait = timeout + CONNECT_SLACK;
        store.server = Some(server);
        store.feed_manager = Some(feed_manager);
        Ok(store.release_feed(self.release_feed))
    }
}

impl PostgresStore {
    /// A store for the database at `dsn` (URL or key=value form), with a
    /// pool set up for use behind a transaction-mode pooler and the default
    /// table `public.leader_election`.
    ///
    /// TLS: `sslmode=require` (or `verify-ca`/`verify-full`) gives an
    /// encrypted connection whose certificate and host name are verified
    /// against the system's CA store plus `sslrootcert=PATH` if given; it
    /// never falls back to plaintext. `sslmode=prefer` (the default) and
    /// `disable` connect in plaintext.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the DSN cannot be parsed.
    pub fn connect(dsn: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(dsn).build()
    }

    /// Settings beyond the DSN: table name, pool size, timeouts, CA file.
    pub fn builder(dsn: &str) -> PostgresBuilder {
        PostgresBuilder {
            dsn: dsn.to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: None,
            ca_file: None,
            ddl_timeout: DEFAULT_DDL_TIMEOUT,
            release_feed: true,
        }
    }

    /// A store over a pool you built, for example with your own r2d2 sizes
    /// and timeouts. Build the manager with [`PgManager::from_dsn`] or
    /// [`PgManager::new`]; it is what gives calls their deadline. Turn
    /// `test_on_check_out` off unless you want an extra round trip per call.
    ///
    /// ```no_run
    /// use leaderelection::postgres::{PgManager, PostgresStore};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = PgManager::from_dsn("postgres://app@pgbouncer.internal:6432/app", None, None)?;
    /// let pool = r2d2::Pool::builder()
    ///     .max_size(8)
    ///     .min_idle(Some(1))
    ///     .test_on_check_out(false)
    ///     .connection_timeout(Duration::from_secs(2))
    ///     .build_unchecked(manager);
    /// let store = PostgresStore::from_pool(pool, "ops", "leases")?;
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when a name is invalid.
    pub fn from_pool(pool: r2d2::Pool<PgManager>, schema: &str, table: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::from_parts(pool, schema, table, DEFAULT_DDL_TIMEOUT)
    }

    fn from_parts(
        pool: r2d2::Pool<PgManager>, schema: &str, table: &str, ddl_timeout: Duration,
    ) -> Result<PostgresStore, StoreError> {
        let qualified =
            qualified(schema, table).map_err(|e| StoreError::fatal("invalid election table").with_source(e))?;
        Ok(PostgresStore {
            connect_wait: pool.connection_timeout(),
            pool,
            schema: schema.to_owned(),
            table: table.to_owned(),
            ddl_timeout,
            connect_log: None,
            server: None,
            fence_index_seen: Arc::default(),
            failover_rule: true,
            overrides_read_only: false,
            timeline_only_history: false,
            channel: listen::channel(&qualified),
            feed: None,
            locks: None,
            feed_manager: None,
            qualified,
        })
    }

    /// The DDL that creates the election table `schema.table`, for migration
    /// tools, with the tables beside it: `table_slots` ([`crate::slot`])
    /// and `table_members` (group members' heartbeats, see
    /// [`Store::heartbeat`]). [`PostgresStore::ensure_schema`] runs the same.
    ///
    /// The `terms` column counts each election's terms for operators (the
    /// claiming statement keeps it; no call reads it). A table made with an
    /// older version's DDL lacks it, and acquire then fails with a fatal
    /// 42703 until it is added: `ensure_schema` does that, or a migration
    /// runs `ALTER TABLE "schema"."table" ADD COLUMN IF NOT EXISTS terms
    /// bigint NOT NULL DEFAULT 0 CHECK (terms >= 0)`.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// use leaderelection::postgres::PostgresStore;
    /// let ddl = PostgresStore::schema("ops", "leader election").unwrap();
    /// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "ops"."leader election""#));
    /// assert!(ddl.contains("fillfactor = 70"));
    /// assert!(ddl.contains("terms       bigint      NOT NULL DEFAULT 0"));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A name is empty, longer than 63 bytes, or holds NUL.
    pub fn schema(schema: &str, table: &str) -> Result<String, IdentError> {
        let q = qualified(schema, table)?;
        let create_schema = if schema == DEFAULT_SCHEMA {
            String::new()
        } else {
            format!("CREATE SCHEMA IF NOT EXISTS {};\n", quote_postgres("schema", schema)?)
        };
        let slots = slots_table(schema, table).map(|t| sql::create_slots(&t)).unwrap_or_default();
        let members = members_table(schema, table).map(|t| sql::create_members(&t)).unwrap_or_default();
        let index = fence_index(schema, table).map(|(i, _)| sql::create_fence_index(&i, &q)).unwrap_or_default();
        Ok(format!("{create_schema}{}{index}{slots}{members}", sql::create_table(&q)))
    }

    crate::setters::setters!(PostgresStore {
        /// The negative control of the failover tests: a store that claims a
        /// row inherited across a failover at once, as one that knows nothing
        /// of server histories would. Never use it otherwise.
        #[doc(hidden)]
        __without_failover_rule() => failover_rule = false;

        /// The negative control of the read-only tests: a store whose writes
        /// override `default_transaction_read_only` wherever it was set, as
        /// every write did before the store respected an operator's setting.
        /// Never use it otherwise.
        #[doc(hidden)]
        __overriding_read_only() => overrides_read_only = true;

        /// The negative control of the cutover and restore tests: a store that
        /// stamps rows with the server's timeline alone, as every store did
        /// before the stamp named the system and its start. Never use it
        /// otherwise.
        #[doc(hidden)]
        __timeline_only_history() => timeline_only_history = true;
    });

    /// Turns the feed of releases ([`Store::releases`]) on or off; it is
    /// on for a new store. With it, a follower waiting for a lease learns
    /// of its release within a round trip and claims then, instead of at
    /// its next poll.
    ///
    /// Every release notifies, with `pg_notify` in its own statement, a
    /// channel named after the table (`leaderelection_` and a hash); that
    /// works through any pooler. The feed itself is one connection of its
    /// own per store, opened at the first subscription (an `Elector` or a
    /// `Group` starting) on a thread of its own, which `LISTEN`s there
    /// (its `application_name` is the pool's with ` listen` after it);
    /// one store shared by all of a process's elections is one connection.
    /// It reconnects after a failure, and followers keep polling meanwhile.
    /// A store over a pool built elsewhere ([`PostgresStore::from_pool`])
    /// has no manager of its own to connect with, and no feed.
    ///
    /// **Many follower processes.** One notification wakes every
    /// listening process at once, and their claims then crowd the server.
    /// So the feed also rides on session advisory locks, as MySQL's rides
    /// on named locks: while an identity
    /// leads through the store, a session of the store's own (named as the
    /// pool's, with ` lock` after it) holds one advisory lock (a hash of the
    /// table and the identity), given back once that identity's last
    /// release has committed; a store that has seen another identity lead
    /// keeps a session waiting for that identity's lock (at most 32, one
    /// statement per 30 s each while the leader lives). The server grants
    /// a freed lock to one waiter, which passes it on at once, so follower
    /// processes wake one after another. A release notifies unless this
    /// store's lock session holds its identity's lock and gives it back
    /// after this release (the identity leads nothing else here): one
    /// hint per release.
    ///
    /// **Poolers.** `LISTEN` and session locks need a session of their own,
    /// which a pooler in transaction mode (PgBouncer's `pool_mode =
    /// transaction`) does not give. The feed proves each new connection
    /// first: it sends itself a notification through the store's pool and
    /// must receive it; no lock is taken before that. Behind such a pooler
    /// it does not, and after three tries the feed ends (logged at `info`),
    /// takes no lock, and followers poll, as without it. Turn it off to
    /// skip those tries, or point a store at the database directly.
    pub fn release_feed(self, on: bool) -> PostgresStore {
        self.with_feed(on, false)
    }

    /// The feed of releases, on or off; with `wakes_on_free`, the lock
    /// feed's negative control.
    fn with_feed(mut self, on: bool, wakes_on_free: bool) -> PostgresStore {
        (self.feed, self.locks) = match (on, &self.feed_manager) {
            (true, Some(manager)) => {
                let (lent, subscribers) = (Arc::default(), Arc::default());
                let locks = Arc::new(locks::feed(&self.qualified, manager, &lent, &subscribers, wakes_on_free));
                let listen = listen::Feed::new(&self.qualified, &subscribers, &lent);
                (Some(Arc::new(listen)), Some(locks))
            }
            _ => (None, None),
        };
        self
    }

    /// The negative control of the lock feed's storm rule: its waiters
    /// wake whenever a leader's lock is free, without first seeing it
    /// held, so a live leader without a lock wakes followers every second.
    /// Never use it otherwise.
    #[doc(hidden)]
    pub fn __release_feed_waking_on_free(self) -> PostgresStore {
        self.with_feed(true, true)
    }

    /// The advisory lock key the feed of releases holds while `identity`
    /// leads through this store's table (for tests that find its session).
    #[doc(hidden)]
    pub fn __release_lock(&self, identity: &str) -> i64 {
        locks::lock_key(&self.qualified, identity)
    }

    /// The `pg_locks` condition of the advisory lock `key`, held or waited
    /// for (for the same tests).
    #[doc(hidden)]
    pub fn __advisory_lock(key: i64) -> String {
        sql::advisory_lock(key)
    }

    /// The lock feed, once a subscription started the listening
    /// connection: without it nothing proves that connections here are
    /// sessions of their own, and no lock is taken.
    fn lock_feed(&self) -> Option<&locks::Feed> {
        self.feed.as_ref().filter(|f| f.started()).and(self.locks.as_deref())
    }

    /// A claim, as [`Store::acquire`] answers it.
    fn acquire_one(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        let body = sql::acquire(&self.qualified, name, identity, ttl, payload, self.failover_rule)?;
        let deadline = deadline_after(timeout);
        let mut ran_again = false;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match self.lease_query("acquire", &body, remaining, sql::Pin::Write) {
                Ok(Some(lease)) => return Ok(lease),
                // The row was inserted by a transaction that committed after
                // this statement's snapshot was taken, and it is not ours to
                // claim: run again with a fresh snapshot to read it.
                Ok(None) => ran_again = true,
                // A racer inserted the same new name with the same fence
                // candidate (its transaction began in the same microsecond):
                // `ON CONFLICT (name)` settles conflicts on the name only,
                // so the `(name, fence)` index of lease checks failed the
                // insert. Run again: the racer's row is there now.
                Err(e) if sql::sqlstate_of(&e) == Some("23505") => ran_again = true,
                // The time ran out in a run again (no answer, or none left
                // to start one): say why there was a run again.
                Err(e) if ran_again && e.is_retryable() => {
                    return Err(
                        StoreError::retryable("postgres acquire: the row kept changing; out of time").with_source(e)
                    )
                }
                Err(e) => return Err(sql::explain_undefined_column(e, "acquire", &self.qualified)),
            }
        }
    }

    /// How a release of `names` by `identity` tells the followers: by
    /// the lock alone when this store's lock feed holds the identity's
    /// lock and the release leaves the identity leading nothing here (the
    /// lock is then given back, waking the waiters one after another,
    /// where a notification would wake every listening process at once),
    /// on the table's channel otherwise (no lock, or one kept for
    /// elections still led).
    fn notice(&self, identity: &str, names: &[&str]) -> sql::Notice<'_> {
        let quiet = self.lock_feed().is_some_and(|f| f.gives_back_after(identity, names));
        sql::Notice { channel: &self.channel, quiet }
    }

    /// The one step after restoring the election's database from a backup
    /// or snapshot of itself (issue 34, item 6): marks every election's
    /// row as written under another server's history, and returns how many
    /// rows it marked. A server restored from its own backup keeps its
    /// identity, so nothing it reports tells "restored" from "never
    /// stopped", and a row older than what its leader was told would be
    /// claimed as soon as it looked expired. (On PostgreSQL the history also
    /// names the server's start, which a restore changes, so this step is
    /// a second line here.) Marked, such a row is treated
    /// as after a failover (see `docs/design.md`, "Database failover"): its
    /// holder may renew it (which stamps it again), and once expired the
    /// first claim holds it for nobody for a lease, until every deadline
    /// the old server's acknowledgements gave has passed. Run it before
    /// the participants reconnect, or while they run: it is safe either
    /// way, and running it twice changes nothing. The command-line tool
    /// runs it as `leaderelection after-restore`.
    ///
    /// # Errors
    ///
    /// The server's error (a read-only server, a missing table).
    pub fn after_restore(&self) -> Result<u64, StoreError> {
        let body = format!(
            "WITH marked AS (UPDATE {} SET history = 'restored' WHERE history IS DISTINCT FROM 'restored' \
             RETURNING 1) SELECT count(*)::text FROM marked",
            self.qualified
        );
        let rows = self.run("after_restore", &body, deadline_after(self.ddl_timeout), sql::Pin::Write)?;
        sql::first_text(&rows)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| StoreError::fatal("postgres after_restore: cannot read how many rows were marked"))
    }

    /// The schema and table this store uses.
    pub fn table(&self) -> (&str, &str) {
        (&self.schema, &self.table)
    }

    /// Creates the election table and the tables beside it if they do not
    /// exist, and adds what a schema made by an older version lacks: the
    /// `terms` and `history` columns, the index lease checks need, the
    /// group members table. Idempotent, and
    /// safe when every replica runs it at the same moment: a creation that
    /// races another is retried and then finds the table.
    ///
    /// The columns are looked up in the catalog first, so on an up-to-date
    /// table this takes no table lock. Adding them needs a brief `ACCESS
    /// EXCLUSIVE` lock, which renewals queue behind: the `ALTER TABLE` waits
    /// for it at most 200 ms at a time, then lets the queue drain and tries
    /// again until the DDL timeout.
    ///
    /// Needs the `CREATE` privilege (and ownership of an old table to add
    /// the column); a role with only `SELECT`, `INSERT` and `UPDATE` on the
    /// table can run the store but not this (create the table with
    /// [`PostgresStore::schema`] in a migration instead).
    ///
    /// # Errors
    ///
    /// The store's classified error; fatal when privileges are missing.
    pub fn ensure_schema(&self) -> Result<(), StoreError> {
        let ddl = PostgresStore::schema(&self.schema, &self.table)
            .map_err(|e| StoreError::fatal("invalid election table").with_source(e))?;
        // The index is made below, once the catalog says it is missing:
        // `CREATE INDEX IF NOT EXISTS` takes the table's lock either way.
        let ddl = match fence_index(&self.schema, &self.table) {
            Some((index, _)) => ddl.replace(&sql::create_fence_index(&index, &self.qualified), ""),
            None => ddl,
        };
        let members = members_table(&self.schema, &self.table);
        let create = format!("{ddl}{}", sql::has_terms(&self.qualified, members.as_deref())?);
        let mut add = format!("{}; {}", sql::add_terms(&self.qualified), sql::add_history(&self.qualified));
        if let Some(m) = &members {
            add = format!("{add}; {}", sql::add_leading(m));
        }
        let deadline = deadline_after(self.ddl_timeout);
        let mut races = 0;
        loop {
            let step = self.run("ensure_schema", &create, deadline, sql::Pin::None).and_then(|rows| {
                if sql::first_text(&rows) == Some("3") {
                    return Ok(());
                }
                // The server gives up on the lock before the client does, so
                // the last attempt, too, reports the lock (55P03).
                let left = deadline.saturating_duration_since(Instant::now());
                let wait = ALTER_LOCK_WAIT.min(left * 3 / 4).as_millis().max(1);
                self.run("ensure_schema", &format!("SET LOCAL lock_timeout = {wait}; {add}"), deadline, sql::Pin::None)
                    .map(drop)
            });
            let step = step.and_then(|()| self.ensure_fence_index(deadline));
            match step {
                Ok(()) => return Ok(()),
                // Two replicas creating the table or adding the column at
                // once: one loses on a catalog unique index. Run it again;
                // IF NOT EXISTS then sees the table or the column.
                Err(e) if races < 4 && sql::is_concurrent_ddl(&e) => races += 1,
                // The ALTER gave up on the table lock (55P03): let the calls
                // queued behind it through, then try again while time is left.
                Err(e) if sql::sqlstate_of(&e) == Some("55P03") && Instant::now() + 2 * ALTER_PAUSE < deadline => {
                    std::thread::sleep(ALTER_PAUSE)
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Makes the unique index lease checks need, when the catalog says it
    /// is missing, under a short lock timeout (the build takes a `SHARE`
    /// lock, which renewals queue behind; the table is tiny).
    fn ensure_fence_index(&self, deadline: Instant) -> Result<(), StoreError> {
        let Some((index, bare)) = fence_index(&self.schema, &self.table) else { return Ok(()) };
        let rows = self.run("ensure_schema", &sql::has_fence_index(&self.schema, &bare)?, deadline, sql::Pin::None)?;
        if sql::first_text(&rows) == Some("1") {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = ALTER_LOCK_WAIT.min(left * 3 / 4).as_millis().max(1);
        let create = format!("SET LOCAL lock_timeout = {wait}; {}", sql::create_fence_index(&index, &self.qualified));
        self.run("ensure_schema", &create, deadline, sql::Pin::None).map(drop)
    }

    /// Runs `body` on a pooled connection before `deadline`, with the
    /// settings `pin` says (see [`sql::pinned`]: the bounds on lock waits and
    /// the statement, and what a session may have been left with).
    fn run(
        &self, op: &'static str, body: &str, deadline: Instant, mut pin: sql::Pin,
    ) -> Result<Vec<SimpleQueryMessage>, StoreError> {
        // Pooled connections can be dead (the server restarted or terminated
        // them): each fails fast. Every operation is idempotent for its
        // caller (a repeated acquire or renew by the same holder and fence
        // lands on the same term), so retrying on the next connection is
        // safe; at most once per pooled connection plus a fresh one, and only
        // while time remains.
        if self.overrides_read_only && pin == sql::Pin::Write {
            pin = sql::Pin::WriteOverSession;
        }
        let rewritten;
        let body = if self.timeline_only_history {
            rewritten = body.replace(sql::HISTORY, sql::TIMELINE_ONLY_HISTORY);
            rewritten.as_str()
        } else {
            body
        };
        let mut last = None;
        for _ in 0..=self.pool.max_size() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let mut conn = self.checkout(op, remaining)?;
            let text = sql::pinned(body, remaining, pin);
            match conn.simple_query(&text, deadline) {
                Ok(rows) => return Ok(rows),
                Err(conn::CallError::Closed(e)) => last = Some(conn::closed_error(op, e.as_ref())),
                Err(conn::CallError::Db(e)) => {
                    let code = e.as_db_error().map(|d| d.code().code());
                    let writes = matches!(pin, sql::Pin::Write | sql::Pin::WriteOverSession);
                    // A write refused as read-only: why is asked, not read
                    // from the message (and a standby refuses the
                    // override's `SET LOCAL transaction_read_only = off` as
                    // a feature it does not support, 0A000).
                    let refused = match code {
                        Some("25006") => writes,
                        Some("0A000") => pin == sql::Pin::WriteOverSession,
                        _ => false,
                    };
                    if refused {
                        let code = code.unwrap_or_default();
                        let why = match read_only_why(&mut conn, deadline) {
                            // Another client's `SET` left the connection
                            // read-only: once more, overriding it.
                            Some(ReadOnly::Session) if pin == sql::Pin::Write => {
                                pin = sql::Pin::WriteOverSession;
                                last = Some(sql::classify(op, &e));
                                continue;
                            }
                            Some(ReadOnly::Standby) => {
                                format!("postgres {op}: SQLSTATE {code}: the server is a standby (in recovery, read-only); writes wait for a primary")
                            }
                            Some(ReadOnly::Configured) => format!(
                                "postgres {op}: SQLSTATE {code}: default_transaction_read_only is on for the server, the \
                                 database, the role or the connection's options (an operator's fence); writes wait until \
                                 it is off"
                            ),
                            _ => return Err(sql::classify(op, &e)),
                        };
                        let err = StoreError::retryable(why);
                        return Err(match e.as_db_error().cloned() {
                            Some(db) => err.with_source(db),
                            None => err,
                        });
                    }
                    return Err(sql::classify(op, &e));
                }
                Err(conn::CallError::Misuse) => return Err(conn::runtime_error()),
                Err(conn::CallError::TimedOut) => {
                    return Err(StoreError::retryable(format!(
                        "postgres {op}: no answer within {}; connection closed",
                        Human::about(remaining)
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| StoreError::retryable(format!("postgres {op}: out of time"))))
    }

    /// A pooled connection within `remaining`.
    ///
    /// r2d2 alone would wait out the whole time while its attempts fail in
    /// the background, so a missing database looked like a slow server. The
    /// store watches the attempts instead: an idle connection is taken at
    /// once; otherwise one attempt is started (if the pool has room) and the
    /// call returns as soon as an attempt fails — fatal or retryable, with
    /// its SQLSTATE or TLS reason — or when the latest attempt already
    /// failed fatally. It waits at most the connect timeout (plus a little,
    /// so a silent server's timeout can be reported) and never past
    /// `remaining`.
    fn checkout(&self, op: &'static str, remaining: Duration) -> Result<r2d2::PooledConnection<PgManager>, StoreError> {
        let Some(log) = &self.connect_log else { return self.checkout_foreign(op, remaining) };
        let limit = remaining.min(self.connect_wait);
        let until = Instant::now() + limit;
        let mut seen = log.state().ended;
        // Takes an idle connection, or asks r2d2 for a new one (it starts
        // one at once when the pool has room) without waiting.
        if let Ok(c) = self.pool.get_timeout(Duration::ZERO) {
            return Ok(c);
        }
        let now = log.state();
        if let Some(e) = now.failure.filter(StoreError::is_fatal) {
            // The server said no the last time; r2d2 keeps retrying in the
            // background and a success clears this.
            return Err(no_connection(op, e));
        }
        loop {
            if let Some(c) = self.pool.try_get() {
                return Ok(c);
            }
            let now = Instant::now();
            if now >= until {
                return Err(self.waited_too_long(op, limit, &log.state()));
            }
            let st = log.wait_after(seen, until.min(now + POOL_POLL));
            if st.ended != seen {
                seen = st.ended;
                match st.failure {
                    Some(e) => return Err(no_connection(op, e)),
                    // A new connection: r2d2 adds it to the pool right
                    // after the manager returns it. Look for it without
                    // `get_timeout`, which would start yet another attempt
                    // while this one still counts as pending.
                    None => {
                        let soon = until.min(Instant::now() + POOL_POLL);
                        while Instant::now() < soon {
                            if let Some(c) = self.pool.try_get() {
                                return Ok(c);
                            }
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                }
            }
        }
    }

    /// The call's wait for a connection ran out with no attempt failing in it.
    fn waited_too_long(&self, op: &str, waited: Duration, st: &conn::LogState) -> StoreError {
        let message = format!("postgres {op}: no connection within {}", Human::about(waited));
        match &st.failure {
            Some(e) => StoreError::retryable(message).with_source(e.clone()),
            None if st.in_flight > 0 => {
                StoreError::retryable(format!("{message}: still connecting, no answer from the server yet"))
            }
            None => {
                StoreError::retryable(format!("{message}: all {} pooled connections are in use", self.pool.max_size()))
            }
        }
    }

    /// A pool built elsewhere keeps its last connection error as text only:
    /// wait as r2d2 does and read the kind back from that text (the SQLSTATE
    /// or the phrase the manager wrote for a fatal TLS or login failure).
    fn checkout_foreign(&self, op: &str, remaining: Duration) -> Result<r2d2::PooledConnection<PgManager>, StoreError> {
        let waited = remaining.min(self.connect_wait);
        self.pool.get_timeout(waited).map_err(|e| {
            let message = format!("postgres {op}: no connection within {}", Human::about(waited));
            let err = if conn::connect_text_is_fatal(&e.to_string()) {
                StoreError::fatal(message)
            } else {
                StoreError::retryable(message)
            };
            err.with_source(e)
        })
    }

    fn lease_query(
        &self, op: &'static str, body: &str, timeout: Duration, pin: sql::Pin,
    ) -> Result<Option<Lease>, StoreError> {
        let deadline = deadline_after(timeout);
        let rows = self.run(op, body, deadline, pin)?;
        sql::first_lease(op, &rows)
    }
}

/// What made a write's transaction read-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadOnly {
    /// The server is in recovery: a standby.
    Standby,
    /// `default_transaction_read_only` is on without any session `SET`:
    /// the server's configuration, the database's or role's settings, or
    /// the connection's startup options. The operator's (or the
    /// application's own) choice, which the store respects.
    Configured,
    /// Only a session `SET` made the default read-only (on a pooler's
    /// shared server connection, another client's): overridden.
    Session,
}

/// Why the server behind `conn` made a write read-only, asked before
/// `deadline`; `None` when it cannot tell. `pg_settings.reset_val` is the
/// value the setting has without the session's own `SET`s: the server's,
/// database's, role's and startup options' (PgBouncer sends none).
fn read_only_why(conn: &mut PgConnection, deadline: Instant) -> Option<ReadOnly> {
    let q = "SELECT pg_catalog.pg_is_in_recovery()::text || ' ' || reset_val FROM pg_catalog.pg_settings \
             WHERE name = 'default_transaction_read_only'";
    let rows = conn.simple_query(q, deadline).ok()?;
    match sql::first_text(&rows)? {
        "true on" | "true off" => Some(ReadOnly::Standby),
        "false on" => Some(ReadOnly::Configured),
        "false off" => Some(ReadOnly::Session),
        _ => None,
    }
}

/// How a call reports an attempt's failure: the call, then the attempt's
/// error (`cannot connect: …`) as its cause, of the same kind.
fn no_connection(op: &str, e: StoreError) -> StoreError {
    let message = format!("postgres {op}");
    let err = if e.is_fatal() { StoreError::fatal(message) } else { StoreError::retryable(message) };
    err.with_source(e)
}

/// How long past the connect timeout a call waits, so that an attempt's own
/// timeout is reported rather than the call's.
const CONNECT_SLACK: Duration = Duration::from_millis(250);

/// How long `ensure_schema`'s `ALTER TABLE` waits for the table lock at a
/// time, and how long it then lets the calls queued behind it through.
const ALTER_LOCK_WAIT: Duration = Duration::from_millis(200);
const ALTER_PAUSE: Duration = Duration::from_millis(50);

/// How often a call waiting for a connection looks whether another call
/// returned one to the pool (r2d2 does not say).
const POOL_POLL: Duration = Duration::from_millis(10);

/// Longest wait any call takes on, whatever it is given, so deadlines stay
/// representable and server settings in range.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(86_400);

fn deadline_after(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(MAX_WAIT)
}

fn qualified(schema: &str, table: &str) -> Result<String, IdentError> {
    Ok(format!("{}.{}", quote_postgres("schema", schema)?, quote_postgres("table", table)?))
}

/// The slots table beside `schema.table`: `table_slots`, when that name
/// fits PostgreSQL's 63 bytes.
fn slots_table(schema: &str, table: &str) -> Option<String> {
    qualified(schema, &format!("{table}_slots")).ok()
}

/// The group members table beside `schema.table`: `table_members`, when
/// that name fits PostgreSQL's 63 bytes.
fn members_table(schema: &str, table: &str) -> Option<String> {
    qualified(schema, &format!("{table}_members")).ok()
}

/// The unique index on `(name, fence)` that lease checks need:
/// `table_name_fence` (in the table's schema), quoted, and its bare name;
/// when that name fits PostgreSQL's 63 bytes.
fn fence_index(_schema: &str, table: &str) -> Option<(String, String)> {
    let name = format!("{table}_name_fence");
    quote_postgres("index", &name).ok().map(|q| (q, name))
}

impl Store for PostgresStore {
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        told(self.lock_feed(), Some(identity), name, self.acquire_one(name, identity, ttl, payload, timeout))
    }

    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        let body = sql::renew(&self.qualified, name, identity, fence, ttl, payload)?;
        let answer = self.lease_query("renew", &body, timeout, sql::Pin::Write)?.ok_or_else(StoreError::lease_lost);
        told(self.lock_feed(), Some(identity), name, answer)
    }

    fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError> {
        let body = sql::release(&self.qualified, &self.notice(identity, &[name]), name, identity, fence)?;
        self.run("release", &body, deadline_after(timeout), sql::Pin::Write)?;
        // Only now, the release committed: the lock may go.
        if let Some(feed) = self.lock_feed() {
            feed.left(identity, name);
        }
        Ok(())
    }

    fn inspect(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
        let body = sql::inspect(&self.qualified, name)?;
        let answer =
            self.lease_query("inspect", &body, timeout, sql::Pin::Read)?.ok_or_else(|| StoreError::no_lease(name));
        told(self.lock_feed(), None, name, answer)
    }

    fn claim_slot(
        &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: Duration,
    ) -> Result<SlotClaim, StoreError> {
        crate::slot::check(slot)?;
        let slots = self.slots()?;
        let body = sql::claim_slot(&self.qualified, &slots, name, identity, fence, slot, retry_failed)?;
        let msgs = self.run("claim_slot", &body, deadline_after(timeout), sql::Pin::Write)?;
        let rows = sql::rows(&msgs);
        let bad = || StoreError::fatal("postgres claim_slot: cannot read what the claim did");
        let count = |v: Option<&str>| v.and_then(|t| t.parse::<u64>().ok()).ok_or_else(bad);
        let (matched, wrote) = match rows.first() {
            Some(r) if r.len() == 2 => (count(r[0])?, count(r[1])?),
            _ => return Err(bad()),
        };
        if matched == 0 {
            return Err(StoreError::lease_lost());
        }
        if wrote == 1 {
            return Ok(SlotClaim::Claimed);
        }
        match rows.get(1) {
            Some(r) if r.len() == 2 => Ok(SlotClaim::Taken {
                fence: count(r[0])?,
                outcome: r[1].map(|o| o.parse::<i32>().map_err(|_| bad())).transpose()?,
            }),
            _ => Err(StoreError::retryable("postgres claim_slot: the slot's row was not found after the claim")),
        }
    }

    fn finish_slot(
        &self, name: &str, fence: u64, slot: &str, outcome: i32, timeout: Duration,
    ) -> Result<bool, StoreError> {
        crate::slot::check(slot)?;
        let body = sql::finish_slot(&self.slots()?, name, fence, slot, outcome)?;
        let msgs = self.run("finish_slot", &body, deadline_after(timeout), sql::Pin::Write)?;
        Ok(!sql::rows(&msgs).is_empty())
    }

    // Each batch is one simple query, one transaction, one `now()`: see
    // batch.rs and the statements in sql.rs. An empty batch sends nothing.

    fn acquire_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let answers = self.claim_batch(identity, ttl, items, timeout);
        told_each(self.lock_feed(), Some(identity), items.iter().map(|i| i.name), answers)
    }

    fn renew_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        told_each(
            self.lock_feed(),
            Some(identity),
            items.iter().map(|i| i.name),
            self.renew_batch(identity, ttl, items, timeout),
        )
    }

    fn renew_many_with_heartbeat(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, timeout: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        let (renewed, members) = self.renew_batch_with_heartbeat(identity, ttl, items, beat, timeout);
        (told_each(self.lock_feed(), Some(identity), items.iter().map(|i| i.name), renewed), members)
    }

    fn release_many(&self, identity: &str, items: &[BatchItem<'_>], timeout: Duration) -> Vec<Result<(), StoreError>> {
        let answers = self.release_batch(identity, items, timeout);
        // Only now, the releases committed: the lock may go.
        if let Some(feed) = self.lock_feed() {
            feed.released_each(identity, items, &answers);
        }
        answers
    }

    fn inspect_many(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        told_each(self.lock_feed(), None, names.iter().copied(), self.inspect_batch(names, timeout))
    }

    fn heartbeat(
        &self, group: &str, member: &str, leading: u32, ttl: Duration, timeout: Duration,
    ) -> Result<Members, StoreError> {
        self.beat(group, member, leading, ttl, timeout)
    }

    fn releases(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        let rx = self.feed.as_ref()?.subscribe(self.feed_manager.as_ref()?, &self.pool)?;
        if let Some(locks) = &self.locks {
            locks.follow();
        }
        Some(rx)
    }

    fn leave_group(&self, group: &str, member: &str, timeout: Duration) -> Result<(), StoreError> {
        self.leave(group, member, timeout)
    }
}

impl PostgresStore {
    /// The group members table, or why there is none.
    fn members(&self) -> Result<String, StoreError> {
        members_table(&self.schema, &self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "postgres: the group members table {}_members would be longer than 63 bytes; use a shorter election \
                 table name",
                self.table
            ))
        })
    }

    /// The slots table, or why there is none.
    fn slots(&self) -> Result<String, StoreError> {
        slots_table(&self.schema, &self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "postgres: the slots table {}_slots would be longer than 63 bytes; use a shorter election table name",
                self.table
            ))
        })
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.pool.state();
        f.debug_struct("PostgresStore")
            .field("table", &self.qualified)
            .field("server", &format_args!("{}", self.server.as_deref().unwrap_or("(pool built elsewhere)")))
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish()
    }
}

/// The test server's DSN, for the unit tests that need one.
#[cfg(test)]
pub(crate) fn test_dsn() -> String {
    std::env::var("LE_PG_DSN").unwrap_or_else(|_| {
        panic!(
            "LE_PG_DSN is not set. These tests need a PostgreSQL server: run `bash scripts/test.sh` \
             (or `source scripts/db.sh` first), which starts it and exports LE_PG_DSN."
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_dsn_is_a_typed_fatal_error_without_the_password() {
        for dsn in ["postgres://u:hunter2@host:notaport/db", "host=h password=hunter2 port=x", "bogus=hunter2"] {
            let err = PostgresStore::connect(dsn).unwrap_err();
            assert!(err.is_fatal(), "{err:?}");
            assert!(!err.to_string().contains("hunter2") && !format!("{err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn failed_connect_and_debug_never_show_the_password() {
        // Port 1 on loopback refuses at once; no server needed.
        let store = PostgresStore::builder("postgres://app:hunter2@127.0.0.1:1/db")
            .connect_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let dbg = format!("{store:?}");
        assert!(!dbg.contains("hunter2") && dbg.contains("127.0.0.1"), "{dbg}");
        // A refusal comes back at once, not at the call's timeout.
        let start = Instant::now();
        let err = store.inspect("e", Duration::from_secs(5)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
        assert!(err.is_retryable(), "{err:?}");
        let chain = format!("{err} {err:?}");
        assert!(!chain.contains("hunter2"), "{chain}");
        assert!(chain.contains("connection refused"), "{chain}");
    }

    #[test]
    fn calls_from_inside_a_tokio_runtime_fail_instead_of_panicking() {
        use r2d2::ManageConnection;
        let manager = PgManager::from_dsn("postgres://h:1/db", None, None).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let result = rt.block_on(async { manager.connect().map(|_| ()) });
        let err = result.unwrap_err();
        assert!(err.is_fatal() && err.to_string().contains("inside a tokio runtime"), "{err}");
    }

    #[test]
    fn extreme_durations_do_not_panic() {
        assert!(deadline_after(Duration::MAX) > Instant::now());
        let text = sql::pinned("SELECT 1", Duration::MAX, sql::Pin::Read);
        assert!(text.contains("lock_timeout = 64800000;"), "{text}"); // 3/4 of a day, inside int32 ms
        let store = PostgresStore::builder("postgres://h/db").connect_timeout(Duration::ZERO).pool_size(0).build();
        assert!(store.is_ok());
        let store = PostgresStore::builder("postgres://h/db").connect_timeout(Duration::MAX).build();
        assert!(store.is_ok());
    }

    #[test]
    fn hostile_table_names_are_quoted() {
        let ddl = PostgresStore::schema("public", r#"x"; DROP TABLE y; --"#).unwrap();
        assert!(ddl.contains(r#""public"."x""; DROP TABLE y; --""#), "{ddl}");
        assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "public"."x""; DROP TABLE y; --_members""#), "{ddl}");
        assert!(PostgresStore::schema("public", "").is_err());
        assert!(PostgresStore::builder("postgres://h/db").table("s", "").build().unwrap_err().is_fatal());
    }
}
