//! The worker: one process of the fleet (the test binary run again, with
//! `LE_LEDGER_WORKER` set, on its `ledger_worker` test). It runs an elector,
//! and while it leads, writes one ledger row per transaction, as fast as
//! [`PACE`] allows:
//!
//! ```text
//! BEGIN; SET LOCAL idle_in_transaction_session_timeout = IDLE
//! <checked: store.check_lease(tx, guard)>   (unchecked: guard.is_valid() before BEGIN)
//! INSERT INTO ledger (fence, worker, seq, checked) ... RETURNING id
//!                                      <- the hold point (see below)
//! WITH c AS (UPDATE clock SET n = n + 1 RETURNING n) UPDATE ledger SET stamp = c.n ...
//! COMMIT
//! ```
//!
//! (on MariaDB: the session's `idle_transaction_timeout`, `START
//! TRANSACTION`, the same check and insert, `UPDATE clock SET n =
//! LAST_INSERT_ID(n + 1)`, `SELECT LAST_INSERT_ID()`, the stamp, `COMMIT`).
//! The clock comes after the hold point: a paused transaction holds no
//! lock on it, so the successor's commits are not held up by it, and the
//! clock's row lock, held to `COMMIT`, makes stamps commit order.
//!
//! It talks to the test on its standard streams. Out (one line per event,
//! `@ledger <event> key=value ...`, `err=` last): `lead`, `lost`, `held`,
//! `committed`, `failed` (with the stage that failed and the error),
//! `check_lost` (the check said the lease is gone), `quiet`. In: `hold`
//! (stop at the hold point of the next transaction, report `held`, and
//! wait), `go` (carry on from the hold point), `quit` (write no more: report
//! `quiet` once no transaction is under way, and idle). At the end of its
//! input (the test is gone) it exits.

use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::{Elector, ErrorKind, LeaderGuard, Store};
use mysql::prelude::Queryable;
use postgres::types::Type;

use super::{Mode, Path, PACE};
use crate::support::config;

/// Set in a worker's environment; the rest of its orders are in the other
/// `LE_LEDGER_*` variables.
pub const ENV: &str = "LE_LEDGER_WORKER";

/// What one worker is to do.
#[derive(Clone, Debug)]
pub struct Spec {
    pub path: Path,
    /// The database through the worker's own fault proxy, for both its
    /// elector's store and its own transactions.
    pub url: String,
    pub election_table: String,
    pub name: String,
    pub ledger: String,
    pub clock: String,
    pub id: String,
    pub mode: Mode,
    pub idle: Duration,
}

impl Spec {
    /// The variables that pass this spec to a worker process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV, "1".to_owned()),
            ("LE_LEDGER_PATH", self.path.as_str().to_owned()),
            ("LE_LEDGER_URL", self.url.clone()),
            ("LE_LEDGER_ELECTION", self.election_table.clone()),
            ("LE_LEDGER_NAME", self.name.clone()),
            ("LE_LEDGER_TABLE", self.ledger.clone()),
            ("LE_LEDGER_CLOCK", self.clock.clone()),
            ("LE_LEDGER_ID", self.id.clone()),
            ("LE_LEDGER_MODE", self.mode.as_str().to_owned()),
            ("LE_LEDGER_IDLE_MS", self.idle.as_millis().to_string()),
        ]
    }

    /// The spec in this process's environment, if it is a worker.
    pub fn from_env() -> Option<Spec> {
        std::env::var_os(ENV)?;
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("worker: {k} is not set"));
        Some(Spec {
            path: Path::parse(&var("LE_LEDGER_PATH")),
            url: var("LE_LEDGER_URL"),
            election_table: var("LE_LEDGER_ELECTION"),
            name: var("LE_LEDGER_NAME"),
            ledger: var("LE_LEDGER_TABLE"),
            clock: var("LE_LEDGER_CLOCK"),
            id: var("LE_LEDGER_ID"),
            mode: Mode::parse(&var("LE_LEDGER_MODE")),
            idle: Duration::from_millis(var("LE_LEDGER_IDLE_MS").parse().expect("LE_LEDGER_IDLE_MS")),
        })
    }
}

/// One line to the test.
fn report(line: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "@ledger {line}");
    let _ = out.flush();
}

/// An error as one line.
fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string().replace(['\n', '\r'], " ")
}

/// A PostgreSQL client error as one line: the server's SQLSTATE and
/// message when it sent one, else the error and its cause.
fn pg_line(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return one_line(format_args!("{} {}: {}", db.severity(), db.code().code(), db.message()));
    }
    match std::error::Error::source(e) {
        Some(cause) => one_line(format_args!("{e}: {cause}")),
        None => one_line(e),
    }
}

/// A statement that failed, and where.
pub struct Failure {
    pub stage: &'static str,
    pub err: String,
    /// The check said the term no longer holds the lease.
    pub lease_lost: bool,
}

/// One path's way of writing a ledger row.
trait Writer {
    /// A clone of the writer's store, for the worker's elector.
    fn store(&self) -> Box<dyn Store>;
    /// Opens a transaction, runs the check (`checked`), inserts the row;
    /// the row's id.
    fn begin(&mut self, guard: &LeaderGuard, seq: u64, checked: bool) -> Result<i64, Failure>;
    /// Stamps the row from the clock and commits; the stamp.
    fn finish(&mut self, id: i64) -> Result<i64, Failure>;
}

/// Runs the worker if this process is one; otherwise returns at once.
pub fn run_if_asked() {
    if let Some(spec) = Spec::from_env() {
        run(spec)
    }
}

fn run(spec: Spec) -> ! {
    let orders = Arc::new(Orders::default());
    let (go_tx, go_rx) = mpsc::channel::<()>();
    {
        let orders = orders.clone();
        thread::spawn(move || {
            for line in io::stdin().lock().lines() {
                match line.as_deref().map(str::trim) {
                    Ok("hold") => orders.hold.store(true, Ordering::SeqCst),
                    Ok("quit") => orders.quit.store(true, Ordering::SeqCst),
                    Ok("go") => {
                        let _ = go_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // The test is gone (or closed our input): so are we.
            std::process::exit(0);
        });
    }
    let mut w: Box<dyn Writer> = match spec.path {
        Path::Pg | Path::Bouncer => Box::new(PgWriter::new(&spec)),
        Path::Maria => Box::new(MariaWriter::new(&spec)),
    };
    let elector =
        Elector::start(config(w.store(), &spec.name, &spec.id)).unwrap_or_else(|e| panic!("worker elector: {e}"));
    lead_and_write(&mut *w, &elector, spec.mode, &orders, &go_rx)
}

/// What the test asked for.
#[derive(Default)]
struct Orders {
    hold: AtomicBool,
    quit: AtomicBool,
}

impl Orders {
    /// Once asked to quit: says so and idles for good (the elector runs on).
    fn quit_if_asked(&self) {
        if self.quit.load(Ordering::SeqCst) {
            report(format_args!("quiet"));
            loop {
                thread::park();
            }
        }
    }
}

fn lead_and_write(w: &mut dyn Writer, elector: &Elector, mode: Mode, orders: &Orders, go: &Receiver<()>) -> ! {
    let checked = mode == Mode::Checked;
    let mut seq = 0u64;
    loop {
        orders.quit_if_asked();
        let Ok(guard) = elector.wait_leader_timeout(Duration::from_millis(200)) else { continue };
        let fence = guard.fence();
        report(format_args!("lead fence={fence}"));
        // The unchecked worker's only test, before every transaction.
        while guard.is_valid() {
            orders.quit_if_asked();
            seq += 1;
            let id = match w.begin(&guard, seq, checked) {
                Ok(id) => id,
                Err(f) if f.lease_lost => {
                    report(format_args!("check_lost fence={fence} seq={seq} err={}", f.err));
                    break;
                }
                Err(f) => {
                    report(format_args!("failed fence={fence} seq={seq} stage={} err={}", f.stage, f.err));
                    thread::sleep(PACE);
                    continue;
                }
            };
            if orders.hold.swap(false, Ordering::SeqCst) {
                report(format_args!("held fence={fence} seq={seq}"));
                let _ = go.recv();
            }
            match w.finish(id) {
                Ok(stamp) => report(format_args!("committed fence={fence} seq={seq} stamp={stamp}")),
                Err(f) => report(format_args!("failed fence={fence} seq={seq} stage={} err={}", f.stage, f.err)),
            }
            thread::sleep(PACE);
        }
        report(format_args!("lost fence={fence}"));
    }
}

/// PostgreSQL, directly or through PgBouncer: the sync `postgres` client,
/// with unnamed statements only (`query_typed`, `batch_execute`), which
/// PgBouncer in transaction mode carries.
struct PgWriter {
    store: PostgresStore,
    id: String,
    url: String,
    client: Option<postgres::Client>,
    insert: String,
    stamp: String,
    begin: String,
}

impl PgWriter {
    fn new(spec: &Spec) -> PgWriter {
        let store = PostgresStore::builder(&spec.url)
            .table("public", spec.election_table.clone())
            .build()
            .unwrap_or_else(|e| panic!("worker store: {e}"));
        let (l, k) = (&spec.ledger, &spec.clock);
        PgWriter {
            store,
            id: spec.id.clone(),
            url: format!("{}?connect_timeout=2", spec.url),
            client: None,
            // Per transaction: through PgBouncer, a session setting would
            // stay on whichever server connection it landed on.
            begin: format!("BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}", spec.idle.as_millis()),
            insert: format!(
                "INSERT INTO public.\"{l}\" (fence, worker, seq, checked) VALUES ($1, $2, $3, $4) RETURNING id"
            ),
            stamp: format!(
                "WITH c AS (UPDATE public.\"{k}\" SET n = n + 1 RETURNING n) \
                 UPDATE public.\"{l}\" SET stamp = c.n FROM c WHERE id = $1 RETURNING c.n"
            ),
        }
    }

    fn client(&mut self) -> Result<&mut postgres::Client, Failure> {
        if self.client.is_none() {
            let c = postgres::Client::connect(&self.url, postgres::NoTls).map_err(|e| Failure {
                stage: "connect",
                err: pg_line(&e),
                lease_lost: false,
            })?;
            self.client = Some(c);
        }
        Ok(self.client.as_mut().unwrap())
    }

    /// A failure that leaves the connection in an unknown state: drop it.
    fn broken(&mut self, stage: &'static str, e: &postgres::Error) -> Failure {
        self.client = None;
        Failure { stage, err: pg_line(e), lease_lost: false }
    }
}

impl Writer for PgWriter {
    fn store(&self) -> Box<dyn Store> {
        Box::new(self.store.clone())
    }

    fn begin(&mut self, guard: &LeaderGuard, seq: u64, checked: bool) -> Result<i64, Failure> {
        let begin = self.begin.clone();
        let store = self.store.clone();
        let c = self.client()?;
        if let Err(e) = c.batch_execute(&begin) {
            return Err(self.broken("begin", &e));
        }
        if checked {
            if let Err(e) = store.check_lease(c, guard) {
                if e.kind() == ErrorKind::LeaseLost {
                    let _ = c.batch_execute("ROLLBACK");
                    return Err(Failure { stage: "check", err: one_line(e), lease_lost: true });
                }
                self.client = None;
                return Err(Failure { stage: "check", err: one_line(e), lease_lost: false });
            }
        }
        let fence = guard.fence() as i64;
        let worker = self.id.clone();
        let seq = seq as i64;
        let insert = self.insert.clone();
        let c = self.client.as_mut().unwrap();
        match c.query_typed(
            &insert,
            &[(&fence, Type::INT8), (&worker, Type::TEXT), (&seq, Type::INT8), (&checked, Type::BOOL)],
        ) {
            Ok(rows) => Ok(rows[0].get(0)),
            Err(e) => Err(self.broken("insert", &e)),
        }
    }

    fn finish(&mut self, id: i64) -> Result<i64, Failure> {
        let stamp = self.stamp.clone();
        let c = self.client()?;
        let n: i64 = match c.query_typed(&stamp, &[(&id, Type::INT8)]) {
            Ok(rows) => rows[0].get(0),
            Err(e) => return Err(self.broken("stamp", &e)),
        };
        let c = self.client.as_mut().unwrap();
        match c.batch_execute("COMMIT") {
            Ok(()) => Ok(n),
            Err(e) => Err(self.broken("commit", &e)),
        }
    }
}

/// MariaDB: the `mysql` crate's plain connection over TCP (to the proxy),
/// its session ending transactions idle for longer than the spec says
/// (`idle_transaction_timeout`, whole seconds). The clock is bumped with
/// `LAST_INSERT_ID(n + 1)`, which hands the new value to this session.
struct MariaWriter {
    store: MySqlStore,
    id: String,
    opts: mysql::Opts,
    conn: Option<mysql::Conn>,
    session: String,
    insert: String,
    bump: String,
    stamp: String,
}

impl MariaWriter {
    fn new(spec: &Spec) -> MariaWriter {
        let store = MySqlStore::builder(&spec.url)
            .table(spec.election_table.clone())
            .build()
            .unwrap_or_else(|e| panic!("worker store: {e}"));
        let opts = mysql::OptsBuilder::from_opts(mysql::Opts::from_url(&spec.url).expect("worker URL"))
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(2)))
            .into();
        let (l, k) = (&spec.ledger, &spec.clock);
        MariaWriter {
            store,
            id: spec.id.clone(),
            opts,
            conn: None,
            session: format!("SET SESSION idle_transaction_timeout = {}", spec.idle.as_secs().max(1)),
            insert: format!("INSERT INTO `{l}` (fence, worker, seq, checked) VALUES (?, ?, ?, ?)"),
            bump: format!("UPDATE `{k}` SET n = LAST_INSERT_ID(n + 1)"),
            stamp: format!("UPDATE `{l}` SET stamp = ? WHERE id = ?"),
        }
    }

    fn conn(&mut self) -> Result<&mut mysql::Conn, Failure> {
        if self.conn.is_none() {
            let mut c = mysql::Conn::new(self.opts.clone()).map_err(|e| Failure {
                stage: "connect",
                err: one_line(e),
                lease_lost: false,
            })?;
            c.query_drop(&self.session).map_err(|e| Failure {
                stage: "connect",
                err: one_line(e),
                lease_lost: false,
            })?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().unwrap())
    }

    /// Any error: the connection is closed, never reused (the crate may
    /// leave a reply behind on it).
    fn broken(&mut self, stage: &'static str, e: impl std::fmt::Display) -> Failure {
        self.conn = None;
        Failure { stage, err: one_line(e), lease_lost: false }
    }
}

impl Writer for MariaWriter {
    fn store(&self) -> Box<dyn Store> {
        Box::new(self.store.clone())
    }

    fn begin(&mut self, guard: &LeaderGuard, seq: u64, checked: bool) -> Result<i64, Failure> {
        let store = self.store.clone();
        let c = self.conn()?;
        if let Err(e) = c.query_drop("START TRANSACTION") {
            return Err(self.broken("begin", e));
        }
        if checked {
            if let Err(e) = store.check_lease(c, guard) {
                if e.kind() == ErrorKind::LeaseLost {
                    let _ = c.query_drop("ROLLBACK");
                    return Err(Failure { stage: "check", err: one_line(e), lease_lost: true });
                }
                return Err(self.broken("check", e));
            }
        }
        let params = (guard.fence() as i64, self.id.clone(), seq as i64, checked);
        let insert = self.insert.clone();
        let c = self.conn.as_mut().unwrap();
        match c.exec_drop(&insert, params) {
            Ok(()) => Ok(c.last_insert_id() as i64),
            Err(e) => Err(self.broken("insert", e)),
        }
    }

    fn finish(&mut self, id: i64) -> Result<i64, Failure> {
        let (bump, stamp) = (self.bump.clone(), self.stamp.clone());
        let c = self.conn()?;
        let n = c.query_drop(&bump).and_then(|()| c.query_first::<i64, _>("SELECT LAST_INSERT_ID()"));
        let n = match n {
            Ok(Some(n)) => n,
            Ok(None) => return Err(self.broken("stamp", "SELECT LAST_INSERT_ID() returned no row")),
            Err(e) => return Err(self.broken("stamp", e)),
        };
        let c = self.conn.as_mut().unwrap();
        if let Err(e) = c.exec_drop(&stamp, (n, id)) {
            return Err(self.broken("stamp", e));
        }
        match c.query_drop("COMMIT") {
            Ok(()) => Ok(n),
            Err(e) => Err(self.broken("commit", e)),
        }
    }
}
