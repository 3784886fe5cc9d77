//! The store's pool of connections, and calls with a real deadline.
//!
//! Connections come from the store's own pool of `mysql::Conn`s, or are
//! borrowed from a `mysql::Pool` the user built (see `borrowed.rs` for what
//! that takes). The store's own pool exists because `mysql::Pool` opens new
//! connections while holding its one mutex (so a connect that hangs blocks
//! every other checkout, with no bound) and cannot simply forget a broken
//! connection.
//!
//! Each call runs on a short-lived thread of its own, and the caller
//! waits for it only until the deadline. A call that is late is abandoned:
//! its connection is closed when the thread gets control back, never
//! returned to a pool (the `mysql` crate does not mark a connection whose
//! read timed out as broken, and one was seen answering a later query with
//! the earlier query's result). The socket's own read and write timeouts
//! bound how long an abandoned thread can stay blocked; the number of
//! abandoned calls still running is capped at the pool size, and a call
//! past that cap fails at once instead of piling up threads. When a call is
//! abandoned, the server is also asked to end its session (`KILL
//! CONNECTION`), so a statement still waiting on a lock is rolled back
//! rather than landing after the caller was told it failed; an abandoned
//! call is never retried on another connection, and one abandoned while its
//! connection was still being opened is never sent.
//!
//! A call is one query, or (a batch) a job of several on the one session
//! (see [`Pool::run_job`]); everything above holds for both. A job that
//! sizes its queries learns the server's `max_allowed_packet` and version
//! from the first connection it runs on, once per store.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, Value};
use parking_lot::{Condvar, Mutex};

#[cfg(unix)]
use super::borrowed::Borrowed;
use super::sql;
use crate::error::Human;
use crate::store::StoreError;

/// What a call's `session` holds before it has a server session: waiting
/// for a free slot of the pool, or opening a connection.
const NO_SESSION: u32 = 0;
const CONNECTING: u32 = u32::MAX;

const WAITING: u8 = 0;
const DONE: u8 = 1;
const ABANDONED: u8 = 2;

pub(crate) struct Pool {
    inner: Arc<Inner>,
}

/// Where a store's connections come from.
pub(crate) enum Source {
    /// Its own, opened from these options and kept in [`State::idle`].
    Own(Opts),
    /// A `mysql::Pool` the user built; each call borrows one of its
    /// connections, with these socket timeouts while it holds it.
    #[cfg(unix)]
    Shared { pool: mysql::Pool, socket_timeout: Duration },
}

/// The connection a call holds.
enum Lent {
    Own(Conn),
    #[cfg(unix)]
    Shared(Borrowed),
}

impl Lent {
    fn conn(&mut self) -> &mut Conn {
        match self {
            Lent::Own(c) => c,
            #[cfg(unix)]
            Lent::Shared(b) => b.conn(),
        }
    }
}

/// What a call runs on its connection: one query, or a batch's several
/// (one transaction spanning them), returning what it read. It may run
/// more than once (see [`Pool::run_job`]), each time on a fresh session.
pub(crate) type Job<T> = Box<dyn Fn(&mut Conn, &Env) -> Result<T, Failed> + Send>;

/// What a job knows of the session it runs on.
pub(crate) struct Env {
    /// The longest query text the job may send: the packet limit less a
    /// margin (`usize::MAX` for a job that does not size its queries).
    pub budget: usize,
    /// Whether the server takes `SKIP LOCKED` (MySQL 8.0.1+, MariaDB 10.6+).
    pub skip_locked: bool,
    /// Whether the server takes `LIMIT ROWS EXAMINED` (MariaDB).
    pub rows_examined: bool,
    /// When the call gives up: what the server's lock waits are bounded by.
    pub deadline: Instant,
}

/// A job's query that failed, and how long its packet was (to tell a
/// packet over `max_allowed_packet` from a connection error).
pub(crate) struct Failed {
    pub error: mysql::Error,
    pub sent: usize,
}

impl Failed {
    /// `error` from sending `sql` (a command byte and the text).
    pub(crate) fn sending(error: mysql::Error, sql: &str) -> Failed {
        Failed { error, sent: sql.len() + 1 }
    }
}

/// The query text a batch may send under a packet limit of `limit` bytes:
/// the command byte and a margin off, so rounding in how a query is
/// counted never matters.
pub(crate) fn budget_for(limit: u64) -> usize {
    usize::try_from(limit.saturating_sub(1024)).unwrap_or(usize::MAX).max(1024)
}

/// Whether a server of this `VERSION()` takes `SKIP LOCKED`: MariaDB from
/// 10.6, MySQL from 8.0.1. Unknown text: no.
pub(crate) fn skips_locked_rows(version: &str) -> bool {
    let v = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut parts = v.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor, patch) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if v.contains("MariaDB") {
        (major, minor) >= (10, 6)
    } else {
        (major, minor, patch) >= (8, 0, 1)
    }
}

struct Inner {
    source: Source,
    /// Connections at most (the store's own), and the cap on abandoned
    /// calls and on threads ending their sessions (either source).
    max: usize,
    /// Idle connections older than this are closed instead of reused.
    idle_timeout: Duration,
    state: Mutex<State>,
    freed: Condvar,
    /// Calls whose caller gave up and whose thread has not finished.
    stuck: AtomicUsize,
    /// Threads asking the server to end an abandoned call's session.
    killers: AtomicUsize,
    /// Whether the user's pool was found without a read timeout (warned once).
    #[cfg(unix)]
    warned: std::sync::atomic::AtomicBool,
    /// The `max_allowed_packet` batches size their queries by (0 until
    /// read; read again when a query turns out larger).
    packet: AtomicU64,
    /// The server's `VERSION()`, read with the packet limit.
    version: Mutex<String>,
}

struct State {
    idle: Vec<(Conn, Instant)>,
    /// Connections idle, in use, or being opened.
    open: usize,
}

impl Pool {
    pub(crate) fn new(source: Source, max: usize, idle_timeout: Duration) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                source,
                max: max.max(1),
                idle_timeout,
                state: Mutex::new(State { idle: Vec::new(), open: 0 }),
                freed: Condvar::new(),
                stuck: AtomicUsize::new(0),
                killers: AtomicUsize::new(0),
                #[cfg(unix)]
                warned: std::sync::atomic::AtomicBool::new(false),
                packet: AtomicU64::new(0),
                version: Mutex::new(String::new()),
            }),
        }
    }

    /// The options connections are opened with; `None` for a user's pool.
    pub(crate) fn opts(&self) -> Option<&Opts> {
        match &self.inner.source {
            Source::Own(o) => Some(o),
            #[cfg(unix)]
            Source::Shared { .. } => None,
        }
    }

    /// `(open, idle, stuck)` right now (open and idle count the store's own
    /// connections only).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let st = self.inner.state.lock();
        (st.open, st.idle.len(), self.inner.stuck.load(Ordering::SeqCst))
    }

    /// Runs `sql` (one text-protocol query, possibly several statements) and
    /// returns every row of every result set, giving up at `deadline`.
    pub(crate) fn run(&self, op: &'static str, sql: String, deadline: Instant) -> Result<Vec<Vec<Value>>, StoreError> {
        let job: Job<Vec<Vec<Value>>> =
            Box::new(move |conn, _| query(conn, &sql).map_err(|e| Failed::sending(e, &sql)));
        self.run_job(op, deadline, false, job)
    }

    /// Runs `job` on one connection of the pool, giving up at `deadline`,
    /// as [`Pool::run`] runs its one query: the same thread and deadline,
    /// the same connection dropped on any failure, the same retry on
    /// another connection when this one had sat idle or the server rolled
    /// the transaction back (so `job` may run more than once, each time
    /// from the start, on a fresh session). A job sends several queries
    /// on that one session (a batch's transaction spans them).
    ///
    /// `splits`: the job sizes its queries by [`Env::budget`]; one the
    /// driver refuses as larger than the packet limit then makes the pool
    /// read the limit again and, when it is lower than the budget the job
    /// was given, run the job again with the new one instead of failing.
    pub(crate) fn run_job<T: Send + 'static>(
        &self, op: &'static str, deadline: Instant, splits: bool, job: Job<T>,
    ) -> Result<T, StoreError> {
        self.start_job(op, deadline, splits, job)?.wait()
    }

    /// How many connections the pool may hold at once.
    pub(crate) fn size(&self) -> usize {
        self.inner.max
    }

    /// [`Pool::run_job`]'s first half: starts `job` on its own thread and
    /// returns at once; [`Started::wait`] takes its answer. So a caller can
    /// run two jobs at once, on two connections.
    pub(crate) fn start_job<T: Send + 'static>(
        &self, op: &'static str, deadline: Instant, splits: bool, job: Job<T>,
    ) -> Result<Started<T>, StoreError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(StoreError::retryable(format!("mysql {op}: no time left for the call")));
        }
        let stuck = self.inner.stuck.load(Ordering::SeqCst);
        if stuck >= self.inner.max {
            return Err(StoreError::retryable(format!(
                "mysql {op}: {stuck} earlier calls are still stuck on the server or the network; not starting another"
            )));
        }
        // How long the statement may go on waiting on the server for a lock
        // (the bound `sql::pinned` set for it from the same budget).
        let lasts = Duration::from_secs(sql::lock_wait_secs(remaining));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let state = Arc::new(AtomicU8::new(WAITING));
        let session = Arc::new(AtomicU32::new(NO_SESSION));
        let (inner, st, sess) = (Arc::clone(&self.inner), Arc::clone(&state), Arc::clone(&session));
        let spawned = thread::Builder::new().name("le-mysql-call".into()).spawn(move || {
            let result = inner.call(op, &job, splits, deadline, lasts, &sess, &st);
            if st.compare_exchange(WAITING, DONE, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                match result {
                    // The store's own goes back first, so that the caller's
                    // next call finds it; a borrowed one after the answer,
                    // since giving it back costs a round trip.
                    Ok((rows, Lent::Own(conn))) => {
                        inner.put_back(Lent::Own(conn));
                        let _ = tx.send(Ok(rows));
                    }
                    #[cfg(unix)]
                    Ok((rows, conn)) => {
                        let _ = tx.send(Ok(rows));
                        inner.put_back(conn);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            } else {
                // The caller gave up: whatever came back, the connection
                // goes (its state is unknown to anyone now).
                if let Ok((_, conn)) = result {
                    inner.discard(conn);
                }
                inner.stuck.fetch_sub(1, Ordering::SeqCst);
            }
        });
        if let Err(e) = spawned {
            return Err(StoreError::retryable(format!("mysql {op}: cannot start a call thread")).with_source(e));
        }
        Ok(Started { inner: Arc::clone(&self.inner), op, deadline, budget: remaining, lasts, rx, state, session })
    }
}

/// A job [`Pool::start_job`] started: its answer, or its abandonment at
/// the deadline, comes through [`Started::wait`].
pub(crate) struct Started<T> {
    inner: Arc<Inner>,
    op: &'static str,
    deadline: Instant,
    /// The time the call had when it started.
    budget: Duration,
    lasts: Duration,
    rx: crossbeam_channel::Receiver<Result<T, StoreError>>,
    state: Arc<AtomicU8>,
    session: Arc<AtomicU32>,
}

impl<T> Started<T> {
    /// The job's answer; at the deadline, the job is abandoned (its
    /// session killed, counted stuck until its thread ends) and the answer
    /// is a retryable error.
    pub(crate) fn wait(self) -> Result<T, StoreError> {
        let Started { inner, op, deadline, budget, lasts, rx, state, session } = self;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result,
            Err(_) => {
                // Count it stuck before telling the thread, so its decrement
                // can only come after this increment.
                inner.stuck.fetch_add(1, Ordering::SeqCst);
                if state.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    let id = session.load(Ordering::SeqCst);
                    kill(&inner, id, lasts);
                    Err(StoreError::retryable(match id {
                        NO_SESSION => format!("mysql {op}: all {} connections of the pool are busy", inner.max),
                        CONNECTING => format!("mysql {op}: no connection within {}", Human::about(budget)),
                        _ => {
                            format!("mysql {op}: no answer within {}; the connection is dropped", Human::about(budget))
                        }
                    }))
                } else {
                    // It finished just now: take its answer.
                    inner.stuck.fetch_sub(1, Ordering::SeqCst);
                    rx.recv()
                        .unwrap_or_else(|_| Err(StoreError::retryable(format!("mysql {op}: the call thread ended"))))
                }
            }
        }
    }
}

impl Inner {
    /// Runs `job` on a pooled or new connection. A connection that failed is
    /// dropped; when it had been idle in the pool (the server may have ended
    /// that session meanwhile) or the server rolled the transaction back
    /// (deadlock), the call runs again on another, while time remains. Every
    /// operation is safe to repeat: the same holder and fence land on the
    /// same term.
    ///
    /// `session` is set to the server's id of the connection in use, so a
    /// caller that gives up can have the server end it.
    #[allow(clippy::too_many_arguments)]
    fn call<T>(
        self: &Arc<Self>, op: &'static str, job: &Job<T>, splits: bool, deadline: Instant, lasts: Duration,
        session: &AtomicU32, state: &AtomicU8,
    ) -> Result<(T, Lent), StoreError> {
        let mut last = None;
        // Connections found dead or killed are retried at most `max` times
        // (one per connection the pool may hold); deadlock victims while
        // time remains, after a short random pause so that the racers do
        // not meet again on the same gap lock in the same instant (twelve
        // racing claims of one new name lose this way several times in a
        // row; see storetest_mysql's racing_claims_… test).
        let (mut stale, mut deadlocks) = (0usize, 0u32);
        while stale <= self.max {
            // A call its caller gave up on is never started again elsewhere.
            if Instant::now() >= deadline || state.load(Ordering::SeqCst) == ABANDONED {
                break;
            }
            if deadlocks > 0 {
                let pause = deadlock_pause(deadlocks);
                if Instant::now() + pause >= deadline {
                    break;
                }
                std::thread::sleep(pause);
            }
            let (mut conn, reused) = self.checkout(op, deadline, session)?;
            session.store(conn.conn().connection_id(), Ordering::SeqCst);
            // The caller may have given up while the connection was being
            // opened (or while waiting for a free one), before there was a
            // session to end: then the call must not start at all. The
            // session id is published first, so a caller giving up from here
            // on sees it and has the server end it.
            if state.load(Ordering::SeqCst) == ABANDONED {
                self.discard(conn);
                return Err(StoreError::retryable(format!("mysql {op}: given up before it was sent")));
            }
            let ran = self.env(conn.conn(), splits, deadline).and_then(|env| {
                let budget = env.budget;
                job(conn.conn(), &env).map_err(|f| (f, budget))
            });
            match ran {
                Ok(rows) => return Ok((rows, conn)),
                Err((Failed { error: e, sent }, budget)) => {
                    let mut err = sql::classify(op, &e);
                    let mut again = sql::retry_elsewhere(&e) && (reused || is_deadlock(&e));
                    let id = session.swap(NO_SESSION, Ordering::SeqCst);
                    if sql::is_timeout(&e) {
                        // The socket gave up (its timeout was shorter than
                        // the call's); the statement may still be waiting on
                        // the server. End it there too, as for a call given up
                        // on, so that it cannot land after this error.
                        kill(self, id, lasts);
                    }
                    self.discard(conn);
                    if sql::may_be_too_large(&e) {
                        // Measured, not read from the error's text: the
                        // statement's packet against the limit in force
                        // (after the discard, so a pool of one has a slot).
                        if let Some(limit) = self.packet_limit().filter(|&l| sent as u64 > l) {
                            self.packet.store(limit, Ordering::SeqCst);
                            err = sql::too_large(op, sent, limit);
                            // A job that splits its queries by the limit
                            // runs again with the lower one it now gets.
                            again = splits && (budget_for(limit) as u64) < budget as u64;
                        }
                    }
                    if !again {
                        return Err(err);
                    }
                    if is_deadlock(&e) {
                        deadlocks += 1;
                    } else {
                        stale += 1;
                    }
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or_else(|| StoreError::retryable(format!("mysql {op}: out of time"))))
    }

    /// What a job needs to know of its session: for a job that sizes its
    /// queries, the packet limit (read on this connection the first time,
    /// then kept) and the server's version.
    fn env(&self, conn: &mut Conn, splits: bool, deadline: Instant) -> Result<Env, (Failed, usize)> {
        let mut env = Env { budget: usize::MAX, skip_locked: false, rows_examined: false, deadline };
        if !splits {
            return Ok(env);
        }
        let mut limit = self.packet.load(Ordering::SeqCst);
        let mut version = self.version.lock().clone();
        if limit == 0 || version.is_empty() {
            let q = "SELECT @@max_allowed_packet, VERSION()";
            let row: Option<(u64, String)> = conn.query_first(q).map_err(|e| (Failed::sending(e, q), 0))?;
            let (server, v) = row.unwrap_or((0, String::new()));
            let client = self.opts().and_then(Opts::get_max_allowed_packet).map(|l| l as u64);
            limit = client.map_or(server, |c| if server == 0 { c } else { c.min(server) });
            self.packet.store(limit, Ordering::SeqCst);
            *self.version.lock() = v.clone();
            version = v;
        }
        env.budget = budget_for(limit);
        env.skip_locked = skips_locked_rows(&version);
        env.rows_examined = version.contains("MariaDB");
        Ok(env)
    }

    fn opts(&self) -> Option<&Opts> {
        match &self.source {
            Source::Own(o) => Some(o),
            #[cfg(unix)]
            Source::Shared { .. } => None,
        }
    }

    /// A connection for one call, and whether it may have sat idle (so may
    /// have been closed by the server meanwhile).
    fn checkout(&self, op: &str, deadline: Instant, session: &AtomicU32) -> Result<(Lent, bool), StoreError> {
        match &self.source {
            Source::Own(opts) => self.checkout_own(op, opts, deadline, session).map(|(c, r)| (Lent::Own(c), r)),
            #[cfg(unix)]
            Source::Shared { pool, socket_timeout } => {
                // The pool may open a connection here, under its own lock.
                session.store(CONNECTING, Ordering::SeqCst);
                match Borrowed::take(pool, deadline, *socket_timeout, &self.warned) {
                    Ok(Some(b)) => Ok((Lent::Shared(b), true)),
                    Ok(None) => Err(StoreError::retryable(format!(
                        "mysql {op}: every connection of the mysql::Pool stayed busy"
                    ))),
                    Err(e) => {
                        let err = sql::classify("connect", &e);
                        log::warn!("leaderelection: {err}");
                        Err(err)
                    }
                }
            }
        }
    }

    /// An idle connection of the store's own, or a new one when the pool
    /// has room; waits for one to come back until `deadline` otherwise.
    /// Opening happens outside the lock, so a slow connect holds up nobody
    /// else.
    fn checkout_own(
        &self, op: &str, opts: &Opts, deadline: Instant, session: &AtomicU32,
    ) -> Result<(Conn, bool), StoreError> {
        let mut stale = Vec::new();
        let mut st = self.state.lock();
        let found = loop {
            if let Some((conn, since)) = st.idle.pop() {
                if since.elapsed() < self.idle_timeout {
                    break Some(conn);
                }
                st.open -= 1;
                stale.push(conn);
                continue;
            }
            if st.open < self.max {
                st.open += 1;
                break None;
            }
            if self.freed.wait_until(&mut st, deadline).timed_out() {
                drop(st);
                drop(stale);
                return Err(StoreError::retryable(format!(
                    "mysql {op}: all {} connections of the pool are busy",
                    self.max
                )));
            }
        };
        drop(st);
        drop(stale);
        if let Some(conn) = found {
            return Ok((conn, true));
        }
        session.store(CONNECTING, Ordering::SeqCst);
        match Conn::new(opts.clone()) {
            Ok(conn) => Ok((conn, false)),
            Err(e) => {
                self.free_slot();
                let err = sql::classify("connect", &e);
                log::warn!("leaderelection: {err}");
                Err(err)
            }
        }
    }

    fn put_back(&self, conn: Lent) {
        match conn {
            Lent::Own(conn) => {
                self.state.lock().idle.push((conn, Instant::now()));
                self.freed.notify_one();
            }
            #[cfg(unix)]
            Lent::Shared(b) => b.give_back(),
        }
    }

    /// Closes `conn` (it says goodbye if the socket still takes it) and
    /// frees its slot; never returns it to a pool.
    fn discard(&self, conn: Lent) {
        match conn {
            Lent::Own(conn) => {
                drop(conn);
                self.free_slot();
            }
            #[cfg(unix)]
            Lent::Shared(b) => b.discard(),
        }
    }

    fn free_slot(&self) {
        self.state.lock().open -= 1;
        self.freed.notify_one();
    }
}

/// Asks the server, on a connection of its own, to end the session of a
/// call the caller gave up on, or whose socket timed out (`KILL
/// CONNECTION`, which any user may do to its own sessions). A statement still waiting for a lock is then rolled
/// back instead of landing later: the server's smallest lock-wait bound
/// (1 s) can outlast a shorter operation timeout. Best effort, on a thread
/// of its own, at most one per pool slot at a time; a server that does not
/// answer (frozen, unreachable) only costs that thread its socket timeout.
/// `lasts` is how long the statement may still wait on the server: on a
/// user's pool, whose slots may all be busy, the kill waits that long for a
/// connection (after that the statement has ended by itself).
fn kill(inner: &Arc<Inner>, session: u32, lasts: Duration) {
    if session == NO_SESSION || session == CONNECTING {
        return;
    }
    if inner.killers.fetch_add(1, Ordering::SeqCst) >= inner.max {
        inner.killers.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let worker = Arc::clone(inner);
    let spawned = thread::Builder::new().name("le-mysql-kill".into()).spawn(move || {
        if let Err(e) = worker.kill_now(session, lasts) {
            log::debug!("leaderelection: mysql: ending abandoned session {session}: {e}");
        }
        worker.killers.fetch_sub(1, Ordering::SeqCst);
    });
    if spawned.is_err() {
        inner.killers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    /// `KILL CONNECTION session` on a fresh connection of the store's own,
    /// or on one borrowed from the user's pool (given back after, when it
    /// worked), waiting for one at most `lasts` plus the socket timeout.
    fn kill_now(&self, session: u32, lasts: Duration) -> Result<(), mysql::Error> {
        let sql = format!("KILL CONNECTION {session}");
        match &self.source {
            Source::Own(opts) => Conn::new(opts.clone())?.query_drop(sql),
            #[cfg(unix)]
            Source::Shared { pool, socket_timeout } => {
                let deadline = Instant::now() + lasts + *socket_timeout;
                let Some(mut b) = Borrowed::take(pool, deadline, *socket_timeout, &self.warned)? else {
                    return Err(mysql::DriverError::Timeout.into());
                };
                match b.conn().query_drop(sql) {
                    Ok(()) => {
                        b.give_back();
                        Ok(())
                    }
                    Err(e) => {
                        b.discard();
                        Err(e)
                    }
                }
            }
        }
    }
}

impl Inner {
    /// The `max_allowed_packet` a statement must fit (a command byte and
    /// the text): the server's, read on a connection of its own, or the
    /// URL's own smaller limit. `None` when it cannot be read.
    fn packet_limit(&self) -> Option<u64> {
        let q = "SELECT @@max_allowed_packet";
        match &self.source {
            Source::Own(opts) => {
                let server: Option<u64> = Conn::new(opts.clone()).ok()?.query_first(q).ok()??;
                let client = opts.get_max_allowed_packet().map(|l| l as u64);
                Some(client.map_or(server?, |c| server.map_or(c, |s| s.min(c))))
            }
            #[cfg(unix)]
            Source::Shared { pool, socket_timeout } => {
                let deadline = Instant::now() + *socket_timeout;
                let mut b = Borrowed::take(pool, deadline, *socket_timeout, &self.warned).ok()??;
                let limit = b.conn().query_first(q);
                match limit {
                    Ok(l) => {
                        b.give_back();
                        l
                    }
                    Err(_) => {
                        b.discard();
                        None
                    }
                }
            }
        }
    }
}

/// How long a deadlock victim waits before its `n`th try again: random in
/// 1 ms .. 2^min(n, 5) ms, so racers spread out and the wait stays short.
fn deadlock_pause(n: u32) -> Duration {
    let mut r = [0u8; 8];
    let random = getrandom::fill(&mut r).map_or(0, |()| u64::from_le_bytes(r));
    let span = 1u64 << n.min(5);
    Duration::from_micros(1_000 + random % (span * 1_000))
}

fn is_deadlock(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::MySqlError(m) if m.code == 1213)
}

/// Every row of every result set, as values. An error in any statement
/// comes back here (the crate yields it from that statement's result set),
/// and the statements after it do not run.
pub(crate) fn query(conn: &mut Conn, sql: &str) -> Result<Vec<Vec<Value>>, mysql::Error> {
    let mut result = conn.query_iter(sql)?;
    let mut rows = Vec::new();
    while let Some(set) = result.iter() {
        for row in set {
            rows.push(row?.unwrap());
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_locked_by_server_version() {
        for (v, yes) in [
            ("10.11.19-MariaDB-0+deb12u1", true),
            ("5.5.5-10.6.2-MariaDB-log", true),
            ("10.5.27-MariaDB", false),
            ("11.4.7-MariaDB-log", true),
            ("8.0.36", true),
            ("8.0.0-dmr", false),
            ("8.4.2", true),
            ("9.1.0", true),
            ("5.7.44-log", false),
            ("", false),
        ] {
            assert_eq!(skips_locked_rows(v), yes, "{v}");
        }
    }

    #[test]
    fn budgets_leave_room_for_the_command_byte() {
        assert_eq!(budget_for(16_384), 15_360);
        assert_eq!(budget_for(0), 1024);
        assert!(budget_for(u64::MAX) > 1 << 40);
    }

    fn mysql_opts() -> Opts {
        let opts = Opts::from_url(&crate::mysql::test_url()).expect("LE_MYSQL_URL is a MySQL URL");
        Opts::from(mysql::OptsBuilder::from_opts(opts).prefer_socket(false))
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// The limit a statement must fit is the server's, read on a connection
    /// of its own, whether the connections are the store's or a user's
    /// pool's; a smaller limit in the store's URL wins; `None` when the
    /// server cannot be reached.
    #[test]
    fn the_mysql_packet_limit_is_the_servers_or_the_urls_smaller_one() {
        let server: u64 = Conn::new(mysql_opts())
            .and_then(|mut c| c.query_first("SELECT @@max_allowed_packet"))
            .expect("the server's max_allowed_packet")
            .expect("a row");
        let own = |opts: mysql::OptsBuilder| Pool::new(Source::Own(Opts::from(opts)), 2, MINUTE);
        let opts = || mysql::OptsBuilder::from_opts(mysql_opts());
        assert_eq!(own(opts()).inner.packet_limit(), Some(server));
        assert!(server > 65_536, "the server's limit ({server}) is above the URL's of this test");
        assert_eq!(own(opts().max_allowed_packet(Some(65_536))).inner.packet_limit(), Some(65_536));
        assert_eq!(own(opts().ip_or_hostname(Some("127.0.0.1")).tcp_port(1)).inner.packet_limit(), None);
        let constraints = mysql::PoolConstraints::new(0, 2).expect("constraints");
        let users = mysql::Pool::new(opts().pool_opts(mysql::PoolOpts::default().with_constraints(constraints)))
            .expect("a user's pool");
        let shared = Pool::new(Source::Shared { pool: users, socket_timeout: Duration::from_secs(5) }, 2, MINUTE);
        assert_eq!(shared.inner.packet_limit(), Some(server));
    }

    /// Whether session `id` is still on the server.
    fn alive(admin: &mut Conn, id: u32) -> bool {
        let sql = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}");
        admin.query_first::<u64, _>(sql).expect("PROCESSLIST") == Some(1)
    }

    /// A session given up on is ended by the server (`KILL CONNECTION` on
    /// a connection of the store's own), by at most one thread per pool
    /// slot at a time: past that, none is started; and a call with no
    /// session yet has nothing to end.
    #[test]
    fn an_abandoned_mysql_session_is_killed_by_at_most_one_thread_per_slot() {
        let pool = Pool::new(Source::Own(mysql_opts()), 1, MINUTE);
        let mut admin = Conn::new(mysql_opts()).expect("a session");
        let victim = Conn::new(mysql_opts()).expect("a session");
        let id = victim.connection_id();
        for none in [NO_SESSION, CONNECTING] {
            kill(&pool.inner, none, Duration::ZERO);
            assert_eq!(pool.inner.killers.load(Ordering::SeqCst), 0, "no killer for {none}");
        }
        // The pool's one killer is busy.
        pool.inner.killers.store(1, Ordering::SeqCst);
        kill(&pool.inner, id, Duration::ZERO);
        assert_eq!(pool.inner.killers.load(Ordering::SeqCst), 1, "no killer started past the cap");
        assert!(alive(&mut admin, id));
        pool.inner.killers.store(0, Ordering::SeqCst);
        kill(&pool.inner, id, Duration::ZERO);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(&mut admin, id) || pool.inner.killers.load(Ordering::SeqCst) != 0 {
            assert!(Instant::now() < deadline, "session {id} not ended within 5 s");
            thread::sleep(Duration::from_millis(5));
        }
    }
}
