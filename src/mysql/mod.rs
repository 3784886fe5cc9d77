//! The MySQL and MariaDB store (feature `mysql`).
//!
//! One row per election in a table you name, in the URL's database. MySQL 8
//! has no `RETURNING`, so every operation that must read back what it wrote
//! is a short transaction — the write, then a `SELECT … FOR UPDATE` of the
//! row — sent with its lock-wait bounds as one text-protocol query, in one
//! round trip. Release and inspect are explicit transactions too, so a
//! session that starts with `autocommit = 0` commits every call all the
//! same. MariaDB runs exactly the same statements, so what the tests here
//! run on MariaDB is what MySQL runs.
//!
//! Instants are `BIGINT` microseconds since the Unix epoch, computed by the
//! server from `UTC_TIMESTAMP(6)`: no session time zone can change them.
//!
//! Each call has a real deadline (see the pool's notes in the source): it
//! returns by then whatever the server or the network does, and a connection
//! whose call was late, or that hit any I/O, protocol or server error, is
//! closed, never reused. TCP URLs always use TCP (the `mysql` crate would
//! otherwise switch a loopback URL to the server's unix socket).
//!
//! # Examples
//!
//! ```no_run
//! use leaderelection::mysql::MySqlStore;
//! use leaderelection::{Config, Elector};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://app:secret@db.internal:3306/app?ssl-mode=VERIFY_IDENTITY")?;
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
//! - **Versions.** MySQL 8.0 and later, MariaDB 10.5 and later, through one
//!   code path. **Tested here: MariaDB 10.11 only.** MySQL 8 itself could not
//!   be run on this machine (no MySQL server package in its repositories);
//!   the store uses nothing MariaDB has and MySQL 8 lacks (no `RETURNING`, no
//!   `SET STATEMENT`), but that is a reading of the manuals, not a test.
//! - **URL.** `mysql://user:password@host:port/database`, with the `mysql`
//!   crate's parameters (for example `tcp_connect_timeout_ms=2000`). A TCP URL
//!   always uses TCP: the crate would otherwise move a loopback connection to
//!   the server's unix socket; `socket=PATH` names a socket explicitly.
//!   `MySqlStore::builder(url)` sets the table, pool size (default 4), connect
//!   timeout (5 s), socket timeout (5 s), idle timeout (5 min; keep it below
//!   the server's `wait_timeout`), `ensure_schema` timeout (30 s) and a CA
//!   file.
//! - **Your own `mysql::Pool`.** `MySqlStore::from_pool(pool)` (or
//!   `builder_from_pool(pool)` for the table and timeouts; Unix only) runs the
//!   store's calls on connections borrowed from a pool your program built and
//!   keeps using. The calls are as bounded as on the store's own pool. The
//!   `mysql` crate's pool alone would get three things wrong, and the store
//!   covers each:
//!   - a connection whose read timed out goes back into that pool on drop,
//!     and was seen answering the next query with the previous one's result.
//!     A connection the store gives up on has its socket shut down first, so
//!     the pool's reset fails and the pool closes it and frees its slot;
//!   - the pool frees such a slot without waking a thread waiting for one.
//!     The store waits in short steps and, after closing a connection, takes
//!     and returns one on a thread of its own, to wake your waiters;
//!   - the store needs short socket timeouts and yours may be long or none.
//!     While a call holds a connection, its socket uses the builder's
//!     `socket_timeout`; the store resets the session under that timeout and
//!     puts your timeouts back before the connection goes home.
//!
//!   What stays with your pool's options: TCP versus socket (`prefer_socket`
//!   is on by default in the crate), TLS (so `uses_tls()` says `false`), the
//!   connect timeout, the pool size, and the read timeout of the pool's own
//!   health check on checkout. A pool without a read timeout is warned about
//!   once. The pool opens connections while holding its lock, so a connect
//!   that hangs holds up your program's checkouts; the store's calls still
//!   return in time. `ca_file` and `connect_timeout` on this builder are
//!   refused (set them on the pool). `MySqlStore::builder_from_opts(opts)`
//!   instead takes the `mysql::Opts` (or `OptsBuilder`) you would build a
//!   pool from (credentials, `init`, compression, `ssl_opts`, verified) and
//!   keeps a pool of its own on them, forcing TCP for TCP hosts.
//! - **TLS.** `ssl-mode=REQUIRED`, `VERIFY_CA` or `VERIFY_IDENTITY` (also
//!   `ssl_mode=`) give TLS through `native-tls` (OpenSSL on Linux, the same
//!   stack as the `postgres` feature) with the certificate chain **and** the
//!   host name verified in all three modes — stricter than the `mysql`
//!   command-line client's `REQUIRED`. `ssl-ca=PATH`, the crate's own
//!   `root_cert_path=PATH`, or `builder(url).ca_file(path)` add a CA and turn
//!   TLS on. A URL that asks for TLS never falls back to plaintext: a server
//!   without TLS is a fatal error. `ssl-mode=PREFERRED`, the crate's
//!   `danger_accept_invalid_certs`/`danger_skip_domain_validation`, and TLS
//!   over a unix socket (which the crate would not encrypt) are refused.
//! - **Schema.** One row per election in `leader_election` in the URL's
//!   database (`builder(url).table(name)` for another; always quoted).
//!   `MySqlStore::schema(table)` returns the DDL for a migration tool. Names
//!   and holders are `VARBINARY(255)`, the payload `MEDIUMBLOB`, and every
//!   instant a `BIGINT` of microseconds since 1970 UTC on the server's clock,
//!   computed from `UTC_TIMESTAMP(6)`: the session time zone (and its
//!   daylight-saving folds) cannot change any of them.
//! - **Terms.** As on PostgreSQL, a `terms` column counts an election's terms
//!   for operators (1 for an absent row, one more per claim of an expired or
//!   released lease, nothing else changes it). In `ON DUPLICATE KEY UPDATE` it
//!   is assigned before `expires_at`, so it still sees the old expiry (tested:
//!   assigned after, a takeover was not counted). A table created by an
//!   earlier version lacks it: acquire then fails with a fatal 1054 whose
//!   message gives ``ALTER TABLE `leader_election` ADD COLUMN terms BIGINT NOT
//!   NULL DEFAULT 0 CHECK (terms >= 0)`` (MySQL 8 has no `ADD COLUMN IF NOT
//!   EXISTS`). `ensure_schema()` looks in `information_schema.COLUMNS` first
//!   and runs that `ALTER` only when the column is missing; a replica whose
//!   `ALTER` loses the race to another's (1060, duplicate column) takes it as
//!   done. The `ALTER` waits for the table's metadata lock 1 s at a time (the
//!   server's smallest bound), and calls queue behind it meanwhile: a
//!   transaction left open on the table delays them up to 1 s per attempt
//!   until the DDL timeout. Old rows start at 0.
//! - **Privileges.** The store needs `SELECT`, `INSERT` and `UPDATE` on the
//!   table; `ensure_schema` also needs `CREATE`, and `ALTER` to add `terms`
//!   to an old table. Group members need `SELECT`, `INSERT`, `UPDATE` and
//!   `DELETE` on `{table}_members`.
//! - **One short transaction per operation**, sent as one query in one round
//!   trip: the server's lock waits bounded for this call
//!   (`SET SESSION innodb_lock_wait_timeout/lock_wait_timeout`, whole seconds,
//!   at least 1, and set back to the defaults before the query ends; if a
//!   statement fails first, the connection is closed, so the setting never
//!   reaches another call), `START TRANSACTION`, `INSERT … ON DUPLICATE KEY
//!   UPDATE` (acquire) or `UPDATE` (renew), `SELECT … FOR UPDATE` of the row,
//!   `COMMIT`. Release and inspect are explicit transactions too, so servers
//!   or sessions with `autocommit = 0` work the same (tested). Values are hex
//!   literals, so no `sql_mode` or character set changes them. A row read
//!   back that is not what the call wrote (another holder, fence, payload or
//!   expiry; no row at all) is an error.
//! - **Batches** (`acquire_many` and the rest, for a group driving
//!   thousands of elections): one call is one session of the pool
//!   with the same settings, timeouts, error classification and dropped
//!   connections as a single call, and every item is decided by the single
//!   statement's conditions at the call's one instant. Renewals, releases
//!   and reads are one transaction; a claim is a look and then the claim
//!   (two transactions), so that a lease check held open in a program's
//!   transaction does not stall it: the items a check holds are answered
//!   retryable, the rest claimed at once. Every statement that may wait
//!   for a lock takes its rows in name order, at most 500 names each, so
//!   batches that share rows never deadlock. Statements are split to fit
//!   the server's `max_allowed_packet` (read once per store); an item too
//!   large for any statement fails alone, as its single call would. The
//!   notes in `src/mysql/batch.rs` say why each statement is shaped as it
//!   is. Servers without `SKIP LOCKED` (MariaDB before 10.6) claim without
//!   looking, and a claim batch there may wait for a check.
//! - **Group members** live in `{table}_members` (group, member, expiry;
//!   made by `ensure_schema` and [`MySqlStore::schema`]); a heartbeat is
//!   one short transaction that writes the member's expiry (never earlier
//!   than it was) and counts the group's live members at the call's
//!   instant; it deletes the group's members expired for over an hour. A
//!   missing members table is a fatal error that says to run
//!   `ensure_schema`.
//! - **Multi-primary clusters** (MariaDB Galera, MySQL Group Replication in
//!   multi-primary mode; asked once per store, or
//!   [`MySqlBuilder::multi_primary`]): every claim of a new term also
//!   replaces the election's row in `{table}_terms` (made by
//!   `ensure_schema` and [`MySqlStore::schema`]), and a lease check writes
//!   that row instead of locking the lease row's index entry, since no
//!   lock reaches another node. There every claim and renewal reads its
//!   row back after its `COMMIT` and counts only if it is seen there:
//!   Galera could report a rolled-back `COMMIT` as a success. (So does a
//!   call made before the store asked its server; one that found a single
//!   primary, or was told so, sends no such read: one transaction a write.)
//! - **Feed of releases** ([`MySqlStore::release_feed`], on by default):
//!   MySQL has no `LISTEN`, so a leading store holds a named lock per
//!   leader identity on a session of its own and gives it back once its
//!   release has committed; a following store waits for that lock (one
//!   session per leader identity) and wakes its followers when it goes
//!   from held to free. Off on multi-primary clusters and on a borrowed
//!   pool.
//! - **A real operation timeout.** The store keeps its own pool (not
//!   `mysql::Pool`, which opens connections under its lock and loses a slot
//!   for good when a broken connection is kept out of it). Each call runs on a
//!   thread of its own and the caller waits until its timeout; a late call is
//!   abandoned and its connection closed when its thread gets control back —
//!   within the socket timeout — and never reused. Any I/O, protocol or server
//!   error also closes the connection. Abandoned calls still running are
//!   capped at the pool size; past that, calls fail at once. The server's own
//!   lock-wait bound is whole seconds (1 s at least), which can outlast a
//!   shorter operation timeout, so when the store gives up on a call it also
//!   asks the server to end that session (`KILL CONNECTION` on a connection
//!   of its own, which any user may do to its own sessions): a statement still
//!   waiting on a lock is rolled back instead of landing later (tested). The
//!   same happens when a socket timeout shorter than the call's fires first.
//!   The kill takes a connection and a round trip of its own (milliseconds):
//!   a statement the server had already run, or runs because its lock went
//!   or a frozen server resumed before the kill arrived, may still have
//!   landed; its outcome is unknown, as for any store. An abandoned call is never retried on another
//!   connection, and one abandoned while its connection was still being
//!   opened is never sent. The error says what the call was waiting for: a
//!   free connection of the pool, a new connection, or the answer.
//! - **Errors** are classified from server error codes: unknown table (1146)
//!   or database (1049), access denied (1044, 1045, 1142), syntax and the like
//!   are fatal and come back from the first call at once, with the code,
//!   SQLSTATE and message; lost connection (2013), server gone away (2006),
//!   connection killed (1927), lock wait timeout (1205), deadlock (1213), too
//!   many connections (1040), read-only (1290, 1792, 1836) and shutdown (1053)
//!   are retryable. Values the table cannot take (SQLSTATE classes 22 and 23,
//!   a CHECK constraint, for example a hand-made table whose `fence` column is
//!   an `INT`) fail the same way every time and are fatal. A refused server is
//!   reported at once too. No password appears in any error, log line or
//!   `Debug` output (tested with a logger capturing every record).

mod batch;
#[cfg(unix)]
mod borrowed;
mod check;
mod cluster;
mod conn;
mod feed;
mod sql;
mod url;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{BatchItem, Heartbeat, Members};
use crate::ident::{quote_mysql, IdentError};
use crate::lease::Lease;
use crate::lockfeed::{told, told_each};
use crate::slot::SlotClaim;
use crate::store::{Released, Store, StoreError};

/// Default name of the election table.
pub const DEFAULT_TABLE: &str = "leader_election";
/// Default number of pooled connections.
pub const DEFAULT_POOL_SIZE: usize = 4;
/// Default bound on opening the TCP connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default socket read and write timeout: how long a call the store already
/// gave up on may keep its thread and its connection.
pub const DEFAULT_SOCKET_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on [`MySqlStore::ensure_schema`].
pub const DEFAULT_DDL_TIMEOUT: Duration = Duration::from_secs(30);
/// Default age at which an idle pooled connection is closed, not reused.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long `ensure_schema` lets the calls queued behind its `ALTER TABLE`
/// through after it gave up on the metadata lock.
const ALTER_PAUSE: Duration = Duration::from_millis(50);

/// Longest wait any call takes on, whatever it is given.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// A [`Store`] that keeps leases in a MySQL 8 or MariaDB 10.5+ table.
///
/// Build one with [`MySqlStore::connect`], [`MySqlStore::builder`],
/// [`MySqlStore::builder_from_opts`] around `mysql::Opts` you built, or
/// [`MySqlStore::from_pool`] on a `mysql::Pool` of yours. Clones share the
/// pool.
///
/// Connections are opened lazily: a bad password or a missing database
/// shows up in the first call (and so in
/// [`Elector::status`](crate::Elector::status)), with the server's error
/// code, at once. Only a URL that cannot be used fails `connect`.
#[derive(Clone)]
pub struct MySqlStore {
    pool: Arc<conn::Pool>,
    table: String,
    quoted: String,
    ddl_timeout: Duration,
    tls: bool,
    /// The failover rule (see `sql::acquire`); off only in the negative
    /// controls of the failover tests.
    failover_rule: bool,
    /// Single-election writes start read-write whatever the server says;
    /// on only in the negative controls of the read-only tests.
    overrides_read_only: bool,
    /// Claims and renewals count only once a read after their `COMMIT`
    /// sees them (`sql::committed`); off only in the negative controls of
    /// the Galera tests.
    commit_check: bool,
    /// Whether the server is a node of a multi-primary cluster (see
    /// [`cluster`]), shared by clones.
    mode: Arc<cluster::Mode>,
    /// How long after its expiry a row counts as expired for a claim (see
    /// [`MySqlBuilder::max_clock_skew`]).
    max_clock_skew: Duration,
    /// The feed of releases ([`Store::releases`]); `None` when turned off
    /// or on a borrowed pool.
    feed: Option<Arc<feed::Feed>>,
}

/// Settings for a [`MySqlStore`], from [`MySqlStore::builder`].
pub struct MySqlBuilder {
    source: Source,
    table: String,
    pool_size: usize,
    connect_timeout: Option<Duration>,
    socket_timeout: Duration,
    ca_file: Option<PathBuf>,
    ddl_timeout: Duration,
    idle_timeout: Duration,
    multi_primary: Option<bool>,
    max_clock_skew: Duration,
    release_feed: bool,
}

enum Source {
    Url(String),
    Opts(Box<mysql::Opts>),
    #[cfg(unix)]
    Pool(mysql::Pool),
}

impl fmt::Debug for MySqlBuilder {
    // The URL or the options may hold a password: never show them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlBuilder")
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("socket_timeout", &self.socket_timeout)
            .field("ca_file", &self.ca_file)
            .field("ddl_timeout", &self.ddl_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl MySqlBuilder {
    /// The table that holds the elections, in the connection's database.
    /// Defaults to [`DEFAULT_TABLE`]. Always quoted, so any name MySQL
    /// accepts works and none can inject SQL.
    pub fn table(mut self, table: impl Into<String>) -> MySqlBuilder {
        self.table = table.into();
        self
    }

    crate::setters::setters!(MySqlBuilder {
        /// How many connections the pool keeps at most. Defaults to
        /// [`DEFAULT_POOL_SIZE`]. It also caps the calls the store gave up on
        /// that may still be running; past that, calls fail at once.
        pool_size(n: usize) => pool_size = n.max(1);

        /// Bound on opening the TCP connection. Defaults to the URL's
        /// `tcp_connect_timeout_ms`, else [`DEFAULT_CONNECT_TIMEOUT`]. The call's
        /// own timeout bounds the whole connect (TCP, TLS, login) regardless.
        connect_timeout(d: Duration) => connect_timeout = Some(d);

        /// The sockets' read and write timeout. A call returns at its own
        /// timeout regardless; this bounds how long a call it gave up on may
        /// keep a thread and a connection. Defaults to [`DEFAULT_SOCKET_TIMEOUT`];
        /// keep it above the elector's `operation_timeout`. A call whose socket
        /// times out first fails then, and its server session is ended as for a
        /// call given up on, so its statement does not land later.
        socket_timeout(d: Duration) => socket_timeout = d;

        /// A CA certificate file (PEM or DER) trusted in addition to the
        /// system's. Setting it requires TLS, as `ssl-ca=PATH` in the URL does.
        ca_file(path: impl AsRef<Path>) => ca_file = Some(path.as_ref().to_owned());

        /// Bound on [`MySqlStore::ensure_schema`]. Defaults to
        /// [`DEFAULT_DDL_TIMEOUT`].
        ddl_timeout(d: Duration) => ddl_timeout = d;

        /// How long a connection may sit idle in the pool and still be reused;
        /// older ones are closed when next found. Defaults to
        /// [`DEFAULT_IDLE_TIMEOUT`]. Keep it below the server's `wait_timeout`
        /// (8 hours by default, often a minute or less on hosted servers), or
        /// the next call finds its connection closed by the server and has to
        /// open another.
        idle_timeout(d: Duration) => idle_timeout = d;

        /// Whether the server is a node of a multi-primary cluster (MariaDB
        /// Galera, MySQL Group Replication in multi-primary mode), where no lock
        /// reaches another node: claims then also write the election's row in
        /// `{table}_terms`, and lease checks write it too (see
        /// [`MySqlStore::check_lease`]). By default the store asks the server
        /// once, before its first claim or check (`wsrep_on`, and Group
        /// Replication's group name and `single_primary_mode`). Say `true` for
        /// a cluster whose nodes the store may reach through a proxy that hides
        /// those variables.
        multi_primary(yes: bool) => multi_primary = Some(yes);

        /// A bound on how far apart the clocks of the servers that write one
        /// election's rows may be: a lease counts as expired for a claim only
        /// this long after its expiry by the claiming server's clock. Defaults
        /// to zero. Set it on a multi-primary cluster whose nodes' clocks may
        /// differ by more than the elector's safety margin: each node reads
        /// its own clock, and a claim through a node whose clock is ahead of the
        /// one the holder renews through would find the lease expired that much
        /// early (measured on Galera with one node 4 s ahead: the contender on
        /// it led while the leader's guard was still valid). Every takeover
        /// after a leader dies waits this much longer. Give every participant
        /// of an election the same bound.
        max_clock_skew(skew: Duration) => max_clock_skew = skew;

        /// Whether the store keeps a feed of releases
        /// ([`MySqlStore::release_feed`]); on by default.
        release_feed(on: bool) => release_feed = on;
    });

    /// Builds the store. Opens no connection.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the URL cannot be used (see
    /// [`MySqlStore::connect`]) or the table name is invalid. The error
    /// never repeats the URL, so it cannot leak a password.
    pub fn build(self) -> Result<MySqlStore, StoreError> {
        let quoted = quote_mysql("table", &self.table).map_err(invalid_table)?;
        let socket_timeout = self.socket_timeout.clamp(Duration::from_millis(1), MAX_WAIT);
        let (pool_size, idle_timeout, feed) = (self.pool_size, self.idle_timeout, self.release_feed);
        let (table, ddl_timeout, max_clock_skew) = (self.table, self.ddl_timeout, self.max_clock_skew);
        let mode = Arc::new(self.multi_primary.map(cluster::Mode::fixed).unwrap_or_default());
        // The store over `source`, whichever way its connections come (a
        // pool built elsewhere has no options to open a feed's sessions with).
        let store = move |source: conn::Source, tls: bool| {
            MySqlStore {
                pool: Arc::new(conn::Pool::new(source, pool_size, idle_timeout)),
                table,
                quoted,
                ddl_timeout,
                tls,
                failover_rule: true,
                overrides_read_only: false,
                commit_check: true,
                mode,
                max_clock_skew,
                feed: None,
            }
            .release_feed(feed)
        };
        let (opts, wants_tls, ca, url_timeout) = match self.source {
            #[cfg(unix)]
            Source::Pool(pool) => {
                if self.ca_file.is_some() || self.connect_timeout.is_some() {
                    return Err(StoreError::fatal(
                        "mysql: a store on a mysql::Pool takes its CA file and connect timeout from the pool's \
                         options; set them there",
                    ));
                }
                return Ok(store(conn::Source::Shared { pool, socket_timeout }, false));
            }
            Source::Url(u) => {
                let p = url::parse(&u)?;
                let opts = mysql::Opts::from_url(&p.crate_url).map_err(|e| {
                    StoreError::fatal(format!("invalid MySQL connection URL: {}", url::redact(&e.to_string())))
                })?;
                (opts, p.tls == url::TlsMode::Verify, p.ca_file, p.connect_timeout)
            }
            Source::Opts(o) => {
                if let Some(ssl) = o.get_ssl_opts() {
                    if ssl.accept_invalid_certs() || ssl.skip_domain_validation() {
                        return Err(StoreError::fatal(
                            "mysql: options that turn certificate verification off are refused",
                        ));
                    }
                }
                let tls = o.get_ssl_opts().is_some();
                let timeout = o.get_tcp_connect_timeout();
                (*o, tls, None, timeout)
            }
        };
        let ca = self.ca_file.or(ca);
        let tls = wants_tls || ca.is_some();
        let connect_timeout = self
            .connect_timeout
            .or(url_timeout)
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
            .clamp(Duration::from_millis(1), MAX_WAIT);
        if tls && opts.get_socket().is_some() {
            return Err(StoreError::fatal(
                "mysql: TLS was asked for on a unix socket, where the mysql crate does not use it",
            ));
        }
        let mut b = mysql::OptsBuilder::from_opts(opts)
            .prefer_socket(false)
            .tcp_connect_timeout(Some(connect_timeout))
            .read_timeout(Some(socket_timeout))
            .write_timeout(Some(socket_timeout));
        if tls {
            let current = mysql::Opts::from(b.clone()).get_ssl_opts().cloned().unwrap_or_default();
            let ssl = match ca {
                Some(path) => {
                    if let Err(e) = std::fs::metadata(&path) {
                        return Err(StoreError::fatal(format!("cannot read CA file {}", path.display())).with_source(e));
                    }
                    current.with_root_cert_path(Some(path))
                }
                None => current,
            };
            // Certificate chain and host name are verified (the defaults).
            b = b.ssl_opts(Some(ssl.with_danger_accept_invalid_certs(false).with_danger_skip_domain_validation(false)));
        }
        let opts = mysql::Opts::from(b);
        Ok(store(conn::Source::Own(opts), tls))
    }
}

fn invalid_table(e: IdentError) -> StoreError {
    StoreError::fatal("invalid election table").with_source(e)
}

impl MySqlStore {
    /// A store for the database at `url`, with the default table
    /// [`DEFAULT_TABLE`].
    ///
    /// The URL is the `mysql` crate's (`mysql://user:password@host:port/database?…`,
    /// its parameters such as `tcp_connect_timeout_ms` included), plus:
    ///
    /// - `ssl-mode=REQUIRED`, `VERIFY_CA` or `VERIFY_IDENTITY` (also spelled
    ///   `ssl_mode`): TLS, with the certificate chain **and** the host name
    ///   verified in all three modes, against the system's CA store plus
    ///   `ssl-ca=PATH` if given; never a fallback to plaintext.
    ///   `ssl-mode=DISABLED` or no parameter: plaintext. `PREFERRED` is
    ///   refused, since it would fall back to plaintext silently.
    /// - `ssl-ca=PATH`, or the crate's own `root_cert_path=PATH`: a CA file;
    ///   either turns TLS on.
    ///
    /// Refused: `danger_accept_invalid_certs` and
    /// `danger_skip_domain_validation` (they turn verification off),
    /// `prefer_socket` (a TCP URL always uses TCP here), and the crate's pool
    /// parameters (`pool_min`, `pool_max`, …), which this store does not use.
    ///
    /// # Errors
    ///
    /// A fatal [`StoreError`] when the URL cannot be used, without repeating
    /// it.
    pub fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        MySqlStore::builder(url).build()
    }

    /// Settings beyond the URL: table name, pool size, timeouts, CA file.
    pub fn builder(url: &str) -> MySqlBuilder {
        MySqlBuilder::new(Source::Url(url.to_owned()))
    }

    /// Settings over `mysql::Opts` you built yourself (for example from an
    /// option file). The store still forces TCP for TCP hosts
    /// (`prefer_socket(false)`), sets the connect and socket timeouts from
    /// the builder, and keeps its own pool. Your `ssl_opts`, if any, turn
    /// TLS on; options that turn verification off are refused.
    pub fn builder_from_opts(opts: mysql::Opts) -> MySqlBuilder {
        MySqlBuilder::new(Source::Opts(Box::new(opts)))
    }

    /// A store whose calls borrow connections from a `mysql::Pool` you
    /// built and may share with the rest of your program. Same as
    /// `MySqlStore::builder_from_pool(pool).build()`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use leaderelection::mysql::MySqlStore;
    /// use std::time::Duration;
    ///
    /// let opts = mysql::OptsBuilder::new()
    ///     .ip_or_hostname(Some("db.internal"))
    ///     .user(Some("app"))
    ///     .pass(Some("secret"))
    ///     .db_name(Some("app"))
    ///     .prefer_socket(false)
    ///     .tcp_connect_timeout(Some(Duration::from_secs(2)))
    ///     .read_timeout(Some(Duration::from_secs(30)))
    ///     .write_timeout(Some(Duration::from_secs(30)));
    /// let pool = mysql::Pool::new(opts)?;
    /// let store = MySqlStore::from_pool(pool.clone())?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for checks.
    #[cfg(unix)]
    pub fn from_pool(pool: mysql::Pool) -> Result<MySqlStore, StoreError> {
        MySqlStore::builder_from_pool(pool).build()
    }

    /// Settings for a store on a `mysql::Pool` you built (Unix only). The
    /// calls are as bounded as on the store's own pool, and a connection a
    /// call gave up on, or that failed, never goes back to your pool: its
    /// socket is shut down first, so the pool closes it and frees its slot
    /// (dropping a `PooledConn` alone would return it, and after a read
    /// timeout it can answer the next query with the previous one's
    /// result). While a call holds a connection, its socket's timeouts are
    /// the builder's [`socket_timeout`](MySqlBuilder::socket_timeout); yours
    /// are put back after the store has reset the session.
    ///
    /// What stays with your pool's options: the host (`prefer_socket`, on
    /// by default in the crate, moves a loopback host to the server's unix
    /// socket), TLS (the store cannot see whether it is on, so
    /// [`uses_tls`](MySqlStore::uses_tls) says `false`), the connect
    /// timeout (the pool opens connections holding its lock, so a connect
    /// that hangs holds up every checkout of your program for that long;
    /// the store's calls still return in time), the read timeout of the
    /// pool's health check on checkout (none set is warned about once), and
    /// how many connections there are. [`pool_size`](MySqlBuilder::pool_size)
    /// still caps the store's abandoned calls; `ca_file` and
    /// `connect_timeout` are refused by `build`, and `idle_timeout` is
    /// unused.
    #[cfg(unix)]
    pub fn builder_from_pool(pool: mysql::Pool) -> MySqlBuilder {
        MySqlBuilder::new(Source::Pool(pool))
    }

    /// The DDL that creates the election table, and the slots, group
    /// members and terms tables beside it, for migration tools.
    /// [`MySqlStore::ensure_schema`] runs the same. The terms table is
    /// needed on multi-primary clusters only (see
    /// [`MySqlBuilder::multi_primary`]); there a claim fails, fatally,
    /// naming it, until it exists.
    ///
    /// The `terms` column counts each election's terms for operators (the
    /// claiming statement keeps it; no call reads it). A table made with an
    /// older version's DDL lacks it, and acquire then fails with a fatal
    /// 1054 until it is added: `ensure_schema` does that, or a migration
    /// runs ``ALTER TABLE `table` ADD COLUMN terms BIGINT NOT NULL DEFAULT 0
    /// CHECK (terms >= 0)``.
    ///
    /// ```
    /// # #[cfg(feature = "mysql")] {
    /// use leaderelection::mysql::MySqlStore;
    /// let ddl = MySqlStore::schema("leader election").unwrap();
    /// assert!(ddl.starts_with("CREATE TABLE IF NOT EXISTS `leader election`"));
    /// assert!(ddl.contains("ENGINE = InnoDB"));
    /// assert!(ddl.contains("terms       BIGINT      NOT NULL DEFAULT 0"));
    /// assert!(ddl.contains("KEY leaderelection_term (name, fence, holder)"));
    /// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `leader election_terms`"));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The name is empty, longer than 64 characters, holds NUL or ends in a
    /// space.
    pub fn schema(table: &str) -> Result<String, IdentError> {
        let slots = slots_table(table).map(|t| sql::create_slots(&t)).unwrap_or_default();
        let members = members_table(table).map(|t| sql::create_members(&t)).unwrap_or_default();
        let terms = terms_table(table).map(|t| cluster::create_terms(&t)).unwrap_or_default();
        Ok(format!("{}{slots}{members}{terms}", sql::create_table(&quote_mysql("table", table)?)))
    }

    crate::setters::setters!(MySqlStore {
        /// The negative control of the failover tests: a store that claims a
        /// row inherited across a failover at once, as one that knows nothing
        /// of server histories would. Never use it otherwise.
        #[doc(hidden)]
        __without_failover_rule() => failover_rule = false;

        /// The negative control of the read-only tests: a store whose
        /// single-election writes (acquire, renew, release: what an `Elector`
        /// sends) start `READ WRITE` whatever the server says, as every write
        /// did before the store respected `read_only`; a user with `SUPER` or
        /// `READ_ONLY ADMIN` then writes through it. Never use it otherwise.
        #[doc(hidden)]
        __overriding_read_only() => overrides_read_only = true;

        /// The negative control of the Galera tests: a store that counts a
        /// claim or renewal as soon as the server answered its statements
        /// without an error, as every store did before it read its writes back
        /// after their `COMMIT` (see `sql::committed`). Never use it otherwise.
        #[doc(hidden)]
        __without_commit_check() => commit_check = false;
    });

    /// Turns the feed of releases ([`Store::releases`]) on or off; it is
    /// on for a new store. With it, a follower waiting for a lease learns
    /// of its release within a round trip and claims then, instead of at
    /// its next poll. MySQL has no `LISTEN`, so the feed rides on named
    /// locks (`GET_LOCK`), one per leader identity and table, named `le:`
    /// and two hashes (of the table and of the identity).
    ///
    /// **As a leader**, the store holds the lock of each identity that
    /// leads through it, on a session of its own (opened when it first
    /// leads, closed when it leads nothing), and gives the lock back once
    /// that identity's last release has committed (or its last lease ran
    /// out or was found lost). A store call never waits for that session.
    ///
    /// **As a follower** (after the first subscription: an `Elector` or a
    /// `Group` starting), the store keeps one waiter session per leader
    /// identity its answers showed holding a live lease (at most 32). A
    /// waiter asks whether the lock is held (`IS_USED_LOCK`) and, if so,
    /// waits for it (`GET_LOCK(…, 30)`, given back at once); when it gets
    /// it, the names it saw that identity lead go to the subscribers. So
    /// only a lock going from held to free wakes followers: nothing while
    /// the leader lives (beyond one statement per waiter per 30 s), one
    /// claim per follower per release. A leader whose lock session breaks,
    /// or that crashes, frees its lock too: each follower claims once and
    /// finds the lease still held (or claims it once expired, at the poll).
    /// A lock nobody holds (a leader with the feed off, or of an older
    /// version) is looked at once a second and wakes nobody.
    ///
    /// **What stays on the poll.** A multi-primary cluster (Galera, Group
    /// Replication; see [`MySqlBuilder::multi_primary`]), where named locks
    /// do not cross nodes: the feed is off there, and its channels end once
    /// the store knows. In a `Group`, one election resigned while the group
    /// runs: the group's identity still leads others, so its lock stays
    /// held. Any error on a feed session: it is dropped and opened again
    /// with a growing pause; followers poll meanwhile. A store over a pool
    /// built elsewhere ([`MySqlStore::from_pool`]) has no options of its own
    /// to connect with, and no feed.
    ///
    /// The store's user needs no privilege for named locks. Dropping the
    /// store (its last clone) ends the feed: its channels close and its
    /// sessions are closed (waiters in `GET_LOCK` are ended with `KILL
    /// CONNECTION`, which any user may do to its own sessions).
    pub fn release_feed(mut self, on: bool) -> MySqlStore {
        self.feed = match (on, self.pool.opts()) {
            (true, Some(opts)) => Some(Arc::new(feed::feed(&self.quoted, opts, Arc::clone(&self.mode), false))),
            _ => None,
        };
        self
    }

    /// The negative control of the feed's storm rule: its waiters wake
    /// whenever a leader's lock is free, without first seeing it held, so
    /// a live leader without a lock wakes followers every second. Never use
    /// it otherwise.
    #[doc(hidden)]
    pub fn __release_feed_waking_on_free(mut self) -> MySqlStore {
        self.feed = self.pool.opts().map(|o| Arc::new(feed::feed(&self.quoted, o, Arc::clone(&self.mode), true)));
        self
    }

    /// The named lock the feed of releases holds while `identity` leads
    /// through this store's table (for tests that find its session).
    #[doc(hidden)]
    pub fn __release_lock(&self, identity: &str) -> String {
        feed::lock_name(&self.quoted, identity)
    }

    /// Marks every election's row as inherited from another server, the one
    /// step after restoring the database from a backup of itself (issue
    /// 34, item 6); returns how many rows it marked. A restored server keeps
    /// its `server_id`, so without it a row older than what its leader was
    /// told is claimed once it looks expired; marked, its holder may renew
    /// it and an expired one is held for nobody for a lease first (see
    /// `docs/design.md`, "Database failover"). Idempotent;
    /// `leaderelection after-restore` runs it.
    ///
    /// # Errors
    ///
    /// The server's error (a read-only server, a missing table).
    pub fn after_restore(&self) -> Result<u64, StoreError> {
        let body = format!(
            "{} UPDATE {} SET history = 'restored' WHERE NOT (history <=> 'restored'); SELECT 'marked', ROW_COUNT(); {}",
            sql::BEGIN,
            self.quoted,
            sql::COMMIT
        );
        let rows = self.run("after_restore", &body, deadline_after(self.ddl_timeout))?;
        let marked = sql::tagged(&rows, "marked").next().and_then(|r| r.first()).and_then(sql::int_value);
        marked
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| StoreError::fatal("mysql after_restore: cannot read how many rows were marked"))
    }

    /// The table this store uses.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether the store asks for TLS (from the URL, a CA file or your
    /// `ssl_opts`), verified. Always `false` on a `mysql::Pool` of yours,
    /// whose own options decide.
    pub fn uses_tls(&self) -> bool {
        self.tls
    }

    /// Creates the election table if it does not exist, with the slots,
    /// group members and terms tables beside it (`{table}_slots`,
    /// `{table}_members`, `{table}_terms`), and adds what a
    /// table made by an older version lacks: the `terms` and `history`
    /// columns, and the index lease checks lock ([`MySqlStore::check_lease`]). Idempotent, and
    /// safe when every replica runs it at the same moment (the server
    /// serialises `CREATE TABLE IF NOT EXISTS` on the table's metadata lock;
    /// a replica whose `ALTER TABLE` finds the column just added by another
    /// takes that as done).
    ///
    /// Both are looked up in `information_schema` first, so on an
    /// up-to-date table this takes no exclusive lock. Adding one takes the
    /// table's metadata lock, which calls queue behind: the `ALTER TABLE`
    /// waits for it 1 s at a time (the server's smallest bound), then lets
    /// the queue drain and tries again until the DDL timeout. The index is
    /// built online (rows stay writable while it builds).
    ///
    /// Needs the `CREATE` privilege (`ALTER` and `INDEX` to upgrade); a user
    /// with only `SELECT`, `INSERT` and `UPDATE` on the table can run the
    /// store but not this (create the table with [`MySqlStore::schema`] in a
    /// migration instead).
    ///
    /// # Errors
    ///
    /// The store's classified error; fatal when privileges are missing.
    pub fn ensure_schema(&self) -> Result<(), StoreError> {
        let slots = slots_table(&self.table).map(|t| sql::create_slots(&t)).unwrap_or_default();
        let members = members_table(&self.table).map(|t| sql::create_members(&t)).unwrap_or_default();
        let terms = terms_table(&self.table).map(|t| cluster::create_terms(&t)).unwrap_or_default();
        let create =
            format!("{}{slots}{members}{terms}{}", sql::create_table(&self.quoted), sql::schema_state(&self.table));
        // Each change, with the error that means a replica running this at
        // the same time made it first (duplicate column, duplicate key
        // name). Lock waits bounded at 1 s, the smallest bound the server
        // takes.
        let mut changes = vec![
            ("terms", sql::add_terms(&self.quoted), 1060),
            ("history", sql::add_history(&self.quoted), 1060),
            ("index", sql::add_term_index(&self.quoted), 1061),
        ];
        if let Some(m) = members_table(&self.table) {
            changes.push(("leads", sql::add_leading(&m), 1060));
        }
        let deadline = deadline_after(self.ddl_timeout);
        let code = |e: &StoreError, code: u16| e.message().contains(&format!("server error {code} "));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let step = self.run("ensure_schema", &create, deadline).and_then(|rows| {
                for (what, alter, done) in &changes {
                    if sql::tagged(&rows, what).next().and_then(|r| r.first()).and_then(sql::int_value).unwrap_or(0) > 0
                    {
                        continue;
                    }
                    let alter = sql::pinned(&format!("{alter};"), Duration::ZERO);
                    match self.pool.run("ensure_schema", alter, deadline) {
                        Err(e) if code(&e, *done) => {}
                        r => r.map(drop)?,
                    }
                }
                Ok(())
            });
            match step {
                Ok(()) => return self.fill_terms(deadline),
                // A replica creating a table at the same moment (1050), or
                // the data dictionary picking this one as a deadlock's
                // victim (1213; three tables now, so more likely with many
                // replicas at once): again, after a pause that grows.
                Err(e) if attempt < 10 && (code(&e, 1050) || code(&e, 1213)) => {
                    std::thread::sleep(Duration::from_millis(5 * attempt))
                }
                // An ALTER gave up on the metadata lock (1205): let the
                // calls queued behind it through, then try again while time
                // is left.
                Err(e) if code(&e, 1205) && Instant::now() + ALTER_PAUSE < deadline => std::thread::sleep(ALTER_PAUSE),
                Err(e) => return Err(e),
            }
        }
    }

    /// Each of `owned`'s answers from a renewal job's result: the rows it
    /// renewed, each checked as [`sql::check_written`] checks one; the
    /// others lost; all failed with the job.
    fn renewed(
        &self, out: &mut Answers<Lease>, owned: &[batch::Item], done: Result<batch::Done, StoreError>, identity: &str,
        ttl: Duration, checked: bool,
    ) {
        let done = match done {
            Ok(done) => done,
            Err(e) => return out.fail_each(owned, &self.explain_unknown_column(e)),
        };
        let committed = !checked || batch::took(&done.rows);
        let mut leases = match batch::ReadBacks::new("renew", done.rows, owned) {
            Ok(l) => l,
            Err(e) => return out.fail_each(owned, &e),
        };
        out.refused(done.refused);
        for (k, it) in owned.iter().enumerate() {
            let again = owned.get(k + 1).is_some_and(|n| n.name == it.name);
            out.set(it.at, || match leases.take(&it.name, again)? {
                // The row this call renewed: the update reported it.
                Some(rb) if batch::renewed(&rb, identity, it.fence) => {
                    let rb = sql::ReadBack { row_count: 1, committed, ..rb };
                    sql::check_written("renew", rb, identity, ttl, &it.payload, Some(it.fence))
                }
                _ => Err(StoreError::lease_lost()),
            });
        }
    }

    /// An acquire that failed with unknown column (1054) stays fatal and
    /// says how to add `terms`, the column a table made by an older
    /// version's DDL lacks; the server's message names the column.
    fn explain_unknown_column(&self, e: StoreError) -> StoreError {
        if !e.message().contains("server error 1054 ") {
            return e;
        }
        StoreError::fatal(format!(
            "{} (a table made by an older version needs: {}; {}; or MySqlStore::ensure_schema)",
            e.message(),
            sql::add_terms(&self.quoted),
            sql::add_history(&self.quoted)
        ))
    }

    fn run(&self, op: &'static str, body: &str, deadline: Instant) -> Result<Vec<Vec<mysql::Value>>, StoreError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let mut text = sql::pinned(body, remaining);
        if self.overrides_read_only {
            text = text.replace(sql::BEGIN, sql::BEGIN_OVERRIDING_READ_ONLY);
        }
        self.pool.run(op, text, deadline)
    }
}

/// The claim as a call runs it, without the settings every call pins
/// first (so with whatever `sql_mode` the session has): the statements
/// after the call's clock reading, then the row read back. For the tests
/// that run it on a server under each assignment order; not part of the
/// API, and no store call sends it like this.
#[doc(hidden)]
pub fn __claim_unpinned(
    table: &str, name: &str, identity: &str, ttl: Duration, payload: &[u8],
) -> Result<String, StoreError> {
    let quoted = quote_mysql("table", table).map_err(invalid_table)?;
    Ok(format!(
        "SET @leaderelection_now = {}, {} = {}; {}",
        sql::NOW,
        sql::HISTORY,
        sql::SERVER_HISTORY,
        sql::acquire(&quoted, name, identity, ttl, payload, true, None, Duration::ZERO, true)?
    ))
}

/// The slots table beside `table`: `table_slots`, quoted, when that name
/// fits MySQL's 64 characters.
fn slots_table(table: &str) -> Option<String> {
    quote_mysql("table", &format!("{table}_slots")).ok()
}

/// The group members' table beside `table`: `table_members`, quoted, when
/// that name fits MySQL's 64 characters.
fn members_table(table: &str) -> Option<String> {
    quote_mysql("table", &format!("{table}_members")).ok()
}

/// The terms table beside `table` (see [`cluster`]): `table_terms`,
/// quoted, when that name fits MySQL's 64 characters.
fn terms_table(table: &str) -> Option<String> {
    quote_mysql("table", &format!("{table}_terms")).ok()
}

/// The batch's claim statement for one election, as a batch runs it but
/// without the settings every call pins and without the look at locks
/// before it (so with whatever `sql_mode` the session has): the call's
/// clock reading, then the `INSERT … ON DUPLICATE KEY UPDATE` in a
/// transaction. For the tests that run the claim cases on a server under
/// each assignment order; not part of the API.
#[doc(hidden)]
pub fn __batch_claim_unpinned(
    table: &str, name: &str, identity: &str, ttl: Duration, payload: &[u8],
) -> Result<String, StoreError> {
    let quoted = quote_mysql("table", table).map_err(invalid_table)?;
    let i = batch::identity(identity)?;
    let claim = batch::claim_statement(&quoted, &i, sql::ttl_micros(ttl), &[(name.as_bytes(), payload)], true);
    Ok(format!(
        "SET @leaderelection_now = {}, {} = {}; {} START TRANSACTION; {claim} COMMIT;",
        sql::NOW,
        sql::HISTORY,
        sql::SERVER_HISTORY,
        sql::claimable(Duration::ZERO)
    ))
}

fn deadline_after(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(MAX_WAIT)
}

impl MySqlStore {
    fn acquire_one(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        let deadline = deadline_after(timeout);
        let terms = self.terms_if_multi_primary("acquire", deadline)?;
        let check = self.checks_commits();
        let body = sql::acquire(
            &self.quoted,
            name,
            identity,
            ttl,
            payload,
            self.failover_rule,
            terms.as_deref(),
            self.max_clock_skew,
            check,
        )?;
        let rows = self
            .run("acquire", &body, deadline)
            .map_err(|e| self.explain_missing_terms(self.explain_unknown_column(e)))?;
        let Some(mut rb) = sql::read_back("acquire", name, rows)? else {
            return Err(StoreError::retryable("mysql acquire: no row after the write; outcome unknown"));
        };
        rb.committed |= !check;
        // After the write, the row names this identity exactly when this
        // statement claimed or extended it (a holder's acquire always writes).
        if rb.lease.holder == identity {
            return sql::check_written("acquire", rb, identity, ttl, payload, None);
        }
        Ok(rb.lease)
    }

    fn renew_one(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        let check = self.checks_commits();
        let body = sql::renew(&self.quoted, name, identity, fence, ttl, payload, check)?;
        let rows = self.run("renew", &body, deadline_after(timeout))?;
        match sql::read_back("renew", name, rows)? {
            Some(mut rb) if rb.row_count != 0 => {
                rb.committed |= !check;
                sql::check_written("renew", rb, identity, ttl, payload, Some(fence))
            }
            _ => Err(StoreError::lease_lost()),
        }
    }

    fn inspect_one(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
        let body = sql::inspect(&self.quoted, name)?;
        let rows = self.run("inspect", &body, deadline_after(timeout))?;
        match sql::read_back("inspect", name, rows)? {
            Some(rb) => Ok(rb.lease),
            None => Err(StoreError::no_lease(name)),
        }
    }

    fn acquire_batch(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let mut out = Answers::new(items.len());
        let Some(owned) = self.batch_items(&mut out, identity, items) else { return out.done() };
        let Ok(i) = batch::identity(identity) else { return out.done() };
        let deadline = deadline_after(timeout);
        let terms = match self.terms_if_multi_primary("acquire_many", deadline) {
            Ok(t) => t,
            Err(e) => return out.fail(&owned, &e).done(),
        };
        let claim = batch::Claim {
            table: self.quoted.clone(),
            identity: i,
            ttl,
            failover_rule: self.failover_rule,
            terms,
            skew: self.max_clock_skew,
            check: self.checks_commits(),
        };
        let claim_checked = claim.check;
        let job = batch::acquire(claim, owned.clone());
        match self.pool.run_job("acquire_many", deadline, true, job) {
            Err(e) => out.fail(&owned, &self.explain_missing_terms(self.explain_unknown_column(e))),
            Ok((done, skipped)) => {
                let committed = !claim_checked || batch::took(&done.rows);
                let mut leases = match batch::ReadBacks::new("acquire", done.rows, &owned) {
                    Ok(l) => l,
                    Err(e) => return out.fail(&owned, &e).done(),
                };
                out.refused(done.refused);
                for (k, it) in owned.iter().enumerate() {
                    let again = owned.get(k + 1).is_some_and(|n| n.name == it.name);
                    out.set(it.at, || {
                        if skipped.contains(&it.name) {
                            return Err(batch::locked());
                        }
                        let rb = leases.take(&it.name, again).map(|rb| rb.map(|rb| sql::ReadBack { committed, ..rb }));
                        batch::claimed(rb, identity, ttl, &it.payload)
                    });
                }
                out
            }
        }
        .done()
    }

    fn inspect_batch(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        let mut out = Answers::new(names.len());
        let items: Vec<BatchItem<'_>> = names.iter().map(|n| BatchItem { name: n, fence: 0, payload: b"" }).collect();
        let Some(owned) = self.batch_items(&mut out, "", &items) else { return out.done() };
        let mut unique: Vec<Vec<u8>> = owned.iter().map(|it| it.name.clone()).collect();
        unique.dedup();
        let job = batch::inspect(self.quoted.clone(), unique.clone());
        match self.pool.run_job("inspect_many", deadline_after(timeout), true, job) {
            Err(e) => out.fail(&owned, &self.explain_unknown_column(e)),
            Ok(done) => {
                let mut leases = match batch::ReadBacks::new("inspect", done.rows, &owned) {
                    Ok(l) => l,
                    Err(e) => return out.fail(&owned, &e).done(),
                };
                let refused: std::collections::HashMap<&[u8], StoreError> =
                    done.refused.into_iter().map(|(k, e)| (unique[k].as_slice(), e)).collect();
                for (k, it) in owned.iter().enumerate() {
                    let again = owned.get(k + 1).is_some_and(|n| n.name == it.name);
                    out.set(it.at, || {
                        if let Some(e) = refused.get(it.name.as_slice()) {
                            return Err(e.clone());
                        }
                        match leases.take(&it.name, again)? {
                            Some(rb) => Ok(rb.lease),
                            None => Err(StoreError::no_lease(names[it.at])),
                        }
                    });
                }
                out
            }
        }
        .done()
    }
}

impl Store for MySqlStore {
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        told(self.feed.as_deref(), Some(identity), name, self.acquire_one(name, identity, ttl, payload, timeout))
    }

    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        told(self.feed.as_deref(), Some(identity), name, self.renew_one(name, identity, fence, ttl, payload, timeout))
    }

    fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError> {
        let body = sql::release(&self.quoted, name, identity, fence)?;
        self.run("release", &body, deadline_after(timeout))?;
        // Only now, the release committed: the lock may go.
        if let Some(feed) = &self.feed {
            feed.left(identity, name);
        }
        Ok(())
    }

    fn inspect(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
        told(self.feed.as_deref(), None, name, self.inspect_one(name, timeout))
    }

    fn acquire_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        let answers = self.acquire_batch(identity, ttl, items, timeout);
        told_each(self.feed.as_deref(), Some(identity), items.iter().map(|i| i.name), answers)
    }

    fn renew_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.renew_batch(identity, ttl, items, timeout, None).0
    }

    /// The renewals and the heartbeat as one transaction (the heartbeat's
    /// statements after the renewals', in the first half's when the batch
    /// runs as two, see `batch::halves`), so a member that renews and
    /// beats makes one transaction where it made two. A transaction that
    /// fails as a whole (one statement's error rolls the rest back: a
    /// missing members table, a lock wait, a lost connection) is answered
    /// by sending both again as separate calls in the time left, so a
    /// heartbeat that cannot be written costs the renewals a round trip,
    /// never their terms; with no time left, both fail.
    fn renew_many_with_heartbeat(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], beat: Heartbeat<'_>, timeout: Duration,
    ) -> (Vec<Result<Lease, StoreError>>, Result<Members, StoreError>) {
        let start = Instant::now();
        let statements = self
            .members()
            .and_then(|m| sql::heartbeat(&m, beat.group, identity, beat.leading, beat.ttl).map(|s| (m, s)));
        let Ok((members, statements)) = statements else {
            return crate::store::renew_with_heartbeat(self, identity, ttl, items, beat, timeout);
        };
        let (renewed, rows) = self.renew_batch(identity, ttl, items, timeout, Some(statements));
        let left = timeout.saturating_sub(start.elapsed());
        match rows {
            Some(Ok(rows)) => (renewed, self.members_answer(&rows, &members, beat.group, deadline_after(left))),
            Some(Err(e)) if left.is_zero() => (renewed, Err(self.explain_members_error(e))),
            Some(Err(_)) => crate::store::renew_with_heartbeat(self, identity, ttl, items, beat, left),
            // No renewal was sent (every item refused before): the
            // heartbeat alone.
            None => (renewed, self.heartbeat(beat.group, identity, beat.leading, beat.ttl, left)),
        }
    }

    fn release_many(&self, identity: &str, items: &[BatchItem<'_>], timeout: Duration) -> Vec<Result<(), StoreError>> {
        let mut out = Answers::new(items.len());
        let Some(owned) = self.batch_items(&mut out, identity, items) else { return out.done() };
        let Ok(i) = batch::identity(identity) else { return out.done() };
        let job = batch::release(self.quoted.clone(), i, owned.clone());
        let answers = match self.pool.run_job("release_many", deadline_after(timeout), true, job) {
            Err(e) => out.fail(&owned, &self.explain_unknown_column(e)),
            Ok(done) => {
                out.refused(done.refused);
                for it in &owned {
                    out.set(it.at, || Ok(()));
                }
                out
            }
        }
        .done();
        // Only now, the releases committed: the lock may go.
        if let Some(feed) = &self.feed {
            feed.released_each(identity, items, &answers);
        }
        answers
    }

    fn inspect_many(&self, names: &[&str], timeout: Duration) -> Vec<Result<Lease, StoreError>> {
        told_each(self.feed.as_deref(), None, names.iter().copied(), self.inspect_batch(names, timeout))
    }

    /// Subscribes to the feed of releases; see [`MySqlStore::release_feed`].
    fn releases(&self) -> Option<crossbeam_channel::Receiver<Released>> {
        self.feed.as_ref()?.subscribe()
    }

    fn heartbeat(
        &self, group: &str, member: &str, leading: u32, ttl: Duration, timeout: Duration,
    ) -> Result<Members, StoreError> {
        let members = self.members()?;
        let body = format!("{} {} {}", sql::BEGIN, sql::heartbeat(&members, group, member, leading, ttl)?, sql::COMMIT);
        let deadline = deadline_after(timeout);
        let rows = self.run("heartbeat", &body, deadline).map_err(|e| self.explain_members_error(e))?;
        self.members_answer(&rows, &members, group, deadline)
    }

    fn leave_group(&self, group: &str, member: &str, timeout: Duration) -> Result<(), StoreError> {
        let members = self.members()?;
        let body = sql::leave_group(&members, group, member)?;
        self.run("leave_group", &body, deadline_after(timeout)).map(drop).map_err(|e| self.explain_members_error(e))
    }

    fn claim_slot(
        &self, name: &str, identity: &str, fence: u64, slot: &str, retry_failed: bool, timeout: Duration,
    ) -> Result<SlotClaim, StoreError> {
        crate::slot::check(slot)?;
        let check = self.checks_commits();
        let body = sql::claim_slot(&self.quoted, &self.slots()?, name, identity, fence, slot, retry_failed, check)?;
        let rows = self.run("claim_slot", &body, deadline_after(timeout))?;
        let bad = || StoreError::fatal("mysql claim_slot: cannot read what the claim did");
        let int = |tag: &str, k: usize| {
            sql::tagged(&rows, tag).next().and_then(|r| r.get(k)).and_then(sql::int_value).ok_or_else(bad)
        };
        if int("inserted", 0)? != 1 {
            return Err(StoreError::lease_lost());
        }
        if int("inserted", 1)? == 1 || int("retaken", 0)? == 1 {
            // Only once a read after the COMMIT sees the claim (see
            // `sql::committed`): on a multi-primary cluster another node's
            // claim of the slot may have won.
            if check && int("committed", 0)? != 1 {
                return Err(StoreError::retryable(
                    "mysql claim_slot: the claim did not commit: a read after its COMMIT does not see it (on a \
                     multi-primary cluster, another node's claim of the slot won); not claimed",
                ));
            }
            return Ok(SlotClaim::Claimed);
        }
        let Some(row) = sql::tagged(&rows, "slot").next().filter(|r| r.len() == 2) else {
            return Err(StoreError::retryable("mysql claim_slot: the slot's row was not found after the claim"));
        };
        let claimer = sql::int_value(&row[0]).and_then(|f| u64::try_from(f).ok()).ok_or_else(bad)?;
        let outcome = match &row[1] {
            mysql::Value::NULL => None,
            v => Some(sql::int_value(v).and_then(|o| i32::try_from(o).ok()).ok_or_else(bad)?),
        };
        Ok(SlotClaim::Taken { fence: claimer, outcome })
    }

    fn finish_slot(
        &self, name: &str, fence: u64, slot: &str, outcome: i32, timeout: Duration,
    ) -> Result<bool, StoreError> {
        crate::slot::check(slot)?;
        let body = sql::finish_slot(&self.slots()?, name, fence, slot, outcome)?;
        let rows = self.run("finish_slot", &body, deadline_after(timeout))?;
        let changed = sql::tagged(&rows, "finish").next().and_then(|r| r.first().and_then(sql::int_value));
        Ok(changed.ok_or_else(|| StoreError::fatal("mysql finish_slot: cannot read what it did"))? > 0)
    }
}

/// A batch's answers, one per item, filled in as they are known.
struct Answers<T> {
    out: Vec<Option<Result<T, StoreError>>>,
}

impl<T> Answers<T> {
    fn new(len: usize) -> Answers<T> {
        Answers { out: (0..len).map(|_| None).collect() }
    }

    /// Item `at`'s answer, unless it has one already.
    fn set(&mut self, at: usize, answer: impl FnOnce() -> Result<T, StoreError>) {
        if self.out[at].is_none() {
            self.out[at] = Some(answer());
        }
    }

    /// Items the batch left out, each with why.
    fn refused(&mut self, refused: Vec<(usize, StoreError)>) {
        for (at, e) in refused {
            self.set(at, || Err(e));
        }
    }

    /// The batch failed as a whole: every item of `items` without an
    /// answer gets `e`.
    fn fail(mut self, items: &[batch::Item], e: &StoreError) -> Answers<T> {
        self.fail_each(items, e);
        self
    }

    /// [`Answers::fail`] in place, for a part of the batch.
    fn fail_each(&mut self, items: &[batch::Item], e: &StoreError) {
        for it in items {
            self.set(it.at, || Err(e.clone()));
        }
    }

    fn done(self) -> Vec<Result<T, StoreError>> {
        self.out
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(StoreError::retryable("mysql: the batch gave this item no answer"))))
            .collect()
    }
}

impl MySqlStore {
    /// The batch's items the table can take, owned and in name order;
    /// the others answered with the error the single call gives them
    /// (every item, when the identity is too long). `None` when no item is
    /// left to send (an empty batch makes no round trip).
    fn batch_items<T>(
        &self, out: &mut Answers<T>, identity: &str, items: &[BatchItem<'_>],
    ) -> Option<Vec<batch::Item>> {
        if let Err(e) = batch::identity(identity) {
            for k in 0..items.len() {
                out.set(k, || Err(e.clone()));
            }
            return None;
        }
        let mut owned = Vec::with_capacity(items.len());
        for (at, it) in items.iter().enumerate() {
            match batch::name(it.name) {
                Ok(()) => owned.push(batch::Item {
                    at,
                    name: it.name.as_bytes().to_vec(),
                    fence: it.fence,
                    payload: it.payload.to_vec(),
                }),
                Err(e) => out.set(at, || Err(e)),
            }
        }
        owned.sort_by(|a, b| a.name.cmp(&b.name));
        (!owned.is_empty()).then_some(owned)
    }

    /// `renew_many`, with `heartbeat` (a member's heartbeat statements) in
    /// the transaction of the batch's first part: the answers, and the
    /// rows tagged `members` of that transaction or its error (`None` when
    /// no batch was sent).
    #[allow(clippy::type_complexity)]
    fn renew_batch(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration, heartbeat: Option<String>,
    ) -> (Vec<Result<Lease, StoreError>>, Option<Result<Vec<Vec<mysql::Value>>, StoreError>>) {
        let mut out = Answers::new(items.len());
        let Some(owned) = self.batch_items(&mut out, identity, items) else { return (out.done(), None) };
        let Ok(i) = batch::identity(identity) else { return (out.done(), None) };
        let deadline = deadline_after(timeout);
        let check = self.checks_commits();
        let job = |part: &[batch::Item], heartbeat: Option<String>| {
            batch::renew(self.quoted.clone(), i.clone(), ttl, part.to_vec(), batch::Also { check, heartbeat })
        };
        let beat_rows = |done: &Result<batch::Done, StoreError>| {
            let members = |r: &&Vec<mysql::Value>| matches!(r.first(), Some(mysql::Value::Bytes(t)) if t == b"members");
            done.as_ref().map(|d| d.rows.iter().filter(members).cloned().collect()).map_err(Clone::clone)
        };
        let beating = heartbeat.is_some();
        let (first, second) = match batch::halves(&owned, self.pool.size()) {
            Some(k) => owned.split_at(k),
            None => (&owned[..], &owned[owned.len()..]),
        };
        // The second half on a connection of its own while this thread
        // waits for the first (see `batch::halves`).
        let started =
            (!second.is_empty()).then(|| self.pool.start_job("renew_many", deadline, true, job(second, None)));
        let done = self.pool.run_job("renew_many", deadline, true, job(first, heartbeat));
        let rows = beating.then(|| beat_rows(&done));
        self.renewed(&mut out, first, done, identity, ttl, check);
        if let Some(started) = started {
            self.renewed(&mut out, second, started.and_then(conn::Started::wait), identity, ttl, check);
        }
        (told_each(self.feed.as_deref(), Some(identity), items.iter().map(|i| i.name), out.done()), rows)
    }

    /// A heartbeat's answer from the rows its statements read (see
    /// [`sql::heartbeat`]); with stale members among them, those deleted
    /// first (best effort, before `deadline`).
    fn members_answer(
        &self, rows: &[Vec<mysql::Value>], members: &str, group: &str, deadline: Instant,
    ) -> Result<Members, StoreError> {
        let bad = || StoreError::fatal("mysql heartbeat: cannot read the members' count");
        let row = sql::tagged(rows, "members").next().ok_or_else(bad)?;
        let int = |k: usize| row.get(k).and_then(sql::int_value).ok_or_else(bad);
        let (live, stale, now, rank) = (int(0)?, int(1)?, int(2)?, int(3)?);
        let (led, most) = (int(4)?, int(5)?);
        if stale > 0 {
            // Members that stopped long ago without leaving: their rows go,
            // in a transaction of their own (it locks the group's rows).
            // Best effort: the count above never included them.
            if let Err(e) = sql::forget_members(members, group).and_then(|b| self.run("heartbeat", &b, deadline)) {
                log::debug!("leaderelection: mysql heartbeat: forgetting stale members: {e}");
            }
        }
        let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Members::new(count(live), crate::lease::DbTime::from_unix_micros(now))
            .with_rank(count(rank))
            .with_leading(u64::try_from(led).unwrap_or(0), count(most)))
    }

    /// The members table, quoted, or why there is none.
    fn members(&self) -> Result<String, StoreError> {
        members_table(&self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "mysql: the members table {}_members would be longer than 64 characters; use a shorter election \
                 table name",
                self.table
            ))
        })
    }

    /// A members call that found no members table: fatal, saying how to
    /// make it.
    fn explain_members_error(&self, e: StoreError) -> StoreError {
        if e.message().contains("server error 1054 ") {
            return StoreError::fatal(format!(
                "{} (a group members' table made by an older version needs: {}; or MySqlStore::ensure_schema)",
                e.message(),
                sql::add_leading(&members_table(&self.table).unwrap_or_default())
            ));
        }
        if !e.message().contains("server error 1146 ") {
            return e;
        }
        StoreError::fatal(format!(
            "{} (the group members' table {}_members is missing: run MySqlStore::ensure_schema, or create it with \
             MySqlStore::schema's DDL)",
            e.message(),
            self.table
        ))
    }

    /// Whether claims and renewals are read back after their `COMMIT` (see
    /// `sql::committed`): unless a store's server is known to have one
    /// primary (the builder said so, or the server answered a claim's
    /// question, see [`Self::is_multi_primary`]), since only a node of a
    /// multi-primary cluster can discard a `COMMIT` unreported. A call made
    /// before the store asked (a renewal by a store that never claimed)
    /// reads back, as every call did before issue 35.
    fn checks_commits(&self) -> bool {
        self.commit_check && self.mode.known() != Some(false)
    }

    /// Whether the server is a node of a multi-primary cluster (see
    /// [`cluster`]): what the builder said, or what the server answered
    /// (asked once, before `deadline`).
    fn is_multi_primary(&self, op: &'static str, deadline: Instant) -> Result<bool, StoreError> {
        if let Some(known) = self.mode.known() {
            return Ok(known);
        }
        let rows = self.pool.run(op, cluster::DETECT.to_owned(), deadline)?;
        self.mode.learn(cluster::multi_primary(&rows));
        Ok(self.mode.known().unwrap_or(true))
    }

    /// The terms table a claim writes (see [`cluster`]) on a multi-primary
    /// cluster; `None` elsewhere.
    fn terms_if_multi_primary(&self, op: &'static str, deadline: Instant) -> Result<Option<String>, StoreError> {
        if !self.is_multi_primary(op, deadline)? {
            return Ok(None);
        }
        self.terms().map(Some)
    }

    /// A call that found no terms table on a multi-primary cluster: fatal,
    /// saying how to make it.
    fn explain_missing_terms(&self, e: StoreError) -> StoreError {
        if !e.message().contains("server error 1146 ") || !e.message().contains("_terms") {
            return e;
        }
        StoreError::fatal(format!(
            "{} (a multi-primary cluster needs the terms table beside the election table: run \
             MySqlStore::ensure_schema, or create it with {})",
            e.message(),
            self.terms().map(|t| cluster::create_terms(&t)).unwrap_or_default().trim_end()
        ))
    }

    fn terms(&self) -> Result<String, StoreError> {
        terms_table(&self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "mysql: the terms table {}_terms, which a multi-primary cluster needs, would be longer than 64 \
                 characters; use a shorter election table name",
                self.table
            ))
        })
    }

    /// `ensure_schema`'s last step on a multi-primary cluster: terms rows
    /// for the leases claimed before the table was there (see
    /// [`cluster::fill_terms`]).
    fn fill_terms(&self, deadline: Instant) -> Result<(), StoreError> {
        if let Some(terms) = self.terms_if_multi_primary("ensure_schema", deadline)? {
            self.run("ensure_schema", &cluster::fill_terms(&terms, &self.quoted), deadline)?;
        }
        Ok(())
    }

    /// The slots table, quoted, or why there is none.
    fn slots(&self) -> Result<String, StoreError> {
        slots_table(&self.table).ok_or_else(|| {
            StoreError::fatal(format!(
                "mysql: the slots table {}_slots would be longer than 64 characters; use a shorter election table \
                 name",
                self.table
            ))
        })
    }
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (open, idle, stuck) = self.pool.counts();
        let mut d = f.debug_struct("MySqlStore");
        d.field("table", &self.quoted);
        match self.pool.opts() {
            Some(o) => d
                .field("host", &format_args!("{}", o.get_ip_or_hostname()))
                .field("port", &o.get_tcp_port())
                .field("socket", &o.get_socket())
                .field("database", &o.get_db_name())
                .field("user", &o.get_user())
                .field("tls", &self.tls)
                .field("connections", &open)
                .field("idle", &idle),
            None => d.field("pool", &format_args!("a mysql::Pool of the application's")),
        };
        d.field("abandoned_calls", &stuck).finish()
    }
}

impl MySqlBuilder {
    fn new(source: Source) -> MySqlBuilder {
        MySqlBuilder {
            source,
            table: DEFAULT_TABLE.to_owned(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: None,
            socket_timeout: DEFAULT_SOCKET_TIMEOUT,
            ca_file: None,
            ddl_timeout: DEFAULT_DDL_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            multi_primary: None,
            max_clock_skew: Duration::ZERO,
            release_feed: true,
        }
    }
}

/// The test server's URL, for the unit tests that need one.
#[cfg(test)]
pub(crate) fn test_url() -> String {
    std::env::var("LE_MYSQL_URL").expect(
        "LE_MYSQL_URL is not set. These tests need a MySQL or MariaDB server: run `bash scripts/test.sh` (or \
         `source scripts/mysql.sh` first), which starts it and exports LE_MYSQL_URL.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_typed_fatal_errors_without_the_password() {
        for url in ["mysql://u:hunter2@host:notaport/db", "mysql://u:hunter2@h/db?bogus=1", "mysql://u:hunter2@/db"] {
            let err = MySqlStore::connect(url).unwrap_err();
            assert!(err.is_fatal(), "{err:?}");
            assert!(!err.to_string().contains("hunter2") && !format!("{err:?}").contains("hunter2"), "{err:?}");
        }
    }

    #[test]
    fn refused_server_fails_at_once_without_the_password() {
        // Port 1 on loopback refuses at once; no server needed.
        let store = MySqlStore::builder("mysql://app:hunter2@127.0.0.1:1/db").build().unwrap();
        let dbg = format!("{store:?}");
        assert!(!dbg.contains("hunter2") && dbg.contains("127.0.0.1"), "{dbg}");
        let start = Instant::now();
        let err = store.inspect("e", Duration::from_secs(3)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
        assert!(err.is_retryable(), "{err:?}");
        let chain = format!("{err} {err:?}");
        assert!(!chain.contains("hunter2"), "{chain}");
        assert!(chain.contains("refused") || chain.contains("connect"), "{chain}");
    }

    #[test]
    fn extreme_settings_do_not_panic() {
        assert!(deadline_after(Duration::MAX) > Instant::now());
        let s = MySqlStore::builder("mysql://h/db")
            .connect_timeout(Duration::ZERO)
            .socket_timeout(Duration::MAX)
            .pool_size(0)
            .build()
            .unwrap();
        let e = s.inspect("e", Duration::ZERO).unwrap_err();
        assert!(e.is_retryable(), "{e}");
    }

    #[test]
    fn hostile_table_names_are_quoted() {
        let ddl = MySqlStore::schema("x`; DROP TABLE y; --").unwrap();
        assert!(ddl.contains("`x``; DROP TABLE y; --`"), "{ddl}");
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `x``; DROP TABLE y; --_members`"), "{ddl}");
        assert!(MySqlStore::schema("").is_err());
        assert!(MySqlStore::builder("mysql://h/db").table("").build().unwrap_err().is_fatal());
    }

    #[test]
    fn tls_is_chosen_by_the_url_or_a_ca_file() {
        assert!(MySqlStore::connect("mysql://h/db?ssl-mode=VERIFY_IDENTITY").unwrap().uses_tls());
        assert!(!MySqlStore::connect("mysql://h/db").unwrap().uses_tls());
        let e = MySqlStore::builder("mysql://h/db").ca_file("/nonexistent/ca.pem").build().unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn options_built_by_hand_cannot_turn_verification_off() {
        let base = || mysql::OptsBuilder::new().ip_or_hostname(Some("db.internal")).db_name(Some("app"));
        for ssl in [
            mysql::SslOpts::default().with_danger_accept_invalid_certs(true),
            mysql::SslOpts::default().with_danger_skip_domain_validation(true),
        ] {
            let e = MySqlStore::builder_from_opts(base().ssl_opts(Some(ssl)).into()).build().unwrap_err();
            assert!(e.is_fatal() && e.to_string().contains("verification off"), "{e}");
        }
        let socket = base().socket(Some("/run/mysqld/mysqld.sock")).ssl_opts(Some(mysql::SslOpts::default()));
        let e = MySqlStore::builder_from_opts(socket.into()).build().unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("unix socket"), "{e}");
        let s = MySqlStore::builder_from_opts(base().ssl_opts(Some(mysql::SslOpts::default())).into())
            .table("elections")
            .build()
            .unwrap();
        assert!(s.uses_tls());
        assert_eq!(s.table(), "elections");
        let dbg = format!("{s:?}");
        assert!(dbg.contains("db.internal") && dbg.contains("`elections`"), "{dbg}");
    }
}
