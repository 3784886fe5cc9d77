//! A long-running worker: one of several replicas writes to a ledger table,
//! the others wait to take over.
//!
//! The leader holds one guard for its whole term, asks `is_valid()` before
//! each write, and writes in a transaction of its own, taken from an r2d2
//! pool, that first runs the store's `check_lease`: once the check has
//! passed, no other term can commit a claim before this transaction
//! commits, so a leader paused after the check (a stall, `SIGSTOP`, a
//! frozen VM) either commits before its successor leads or not at all.
//! Each row is stamped with the term's fence.
//!
//! ```sh
//! cargo run --example worker --features postgres,mysql -- \
//!     --dsn postgres://app@db.internal/app --id worker-1 --for 10m
//! ```
//!
//! Options: `--dsn URL` (or `DATABASE_URL`; `postgres://` or `mysql://`),
//! `--id NAME` (default `worker`), `--name ELECTION` (default
//! `ledger-writer`), `--ledger TABLE` (default `ledger`), `--for DURATION`
//! (run that long, then shut down cleanly; default a day), `--every
//! DURATION` (between writes; default 200ms), `--lease DURATION` (default
//! 15s). Durations are `500ms`, `5s`, `2m`, `1h`.

mod common;

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::{AnyStore, Config, Elector, LeaderGuard, StoreError, WaitLeaderError};
use mysql::prelude::Queryable;

use common::Flags;

fn main() -> ExitCode {
    common::exit("worker", run())
}

fn run() -> Result<(), Box<dyn Error>> {
    let args = Args::parse()?;
    let ledger = Ledger::open(&args.dsn, &args.ledger)?;
    let config =
        common::lease_timings(Config::new(ledger.store(), args.name.as_str()), args.lease).identity(args.id.as_str());
    let elector = Elector::start(config)?;
    let stop_at = Instant::now() + args.run_for;
    let mut written = 0u64;

    loop {
        let guard = match elector.wait_leader_deadline(stop_at) {
            Ok(guard) => guard,
            Err(WaitLeaderError::Timeout) => break,
            Err(e) => return Err(e.into()),
        };
        println!("{} leads term fence={}", args.id, guard.fence());
        while guard.is_valid() && Instant::now() < stop_at {
            match ledger.write(&guard, &args.id, written + 1) {
                Ok(()) => {
                    written += 1;
                    println!("{} wrote seq={written} fence={}", args.id, guard.fence());
                }
                // The term is over on the database: nothing was written.
                Err(e) if e.is_lease_lost() => println!("{} write refused: {e}", args.id),
                Err(e) => eprintln!("{} write failed: {e}", args.id),
            }
            guard.wait_lost_timeout(args.every);
        }
        println!("{} term fence={} over", args.id, guard.fence());
        if Instant::now() >= stop_at {
            break;
        }
        // The guard drops here, before waiting for the next term.
    }
    elector.shutdown()?; // ends the term and releases the lease: a successor leads at once
    println!("{} stopped after {written} writes", args.id);
    Ok(())
}

/// The ledger: the store that elects its writer and a pool of the
/// program's own connections that write to it, on the same database.
enum Ledger {
    Postgres { store: PostgresStore, pool: r2d2::Pool<PgConnector>, insert: String },
    Mysql { store: MySqlStore, pool: r2d2::Pool<MysqlConnector>, insert: String },
}

impl Ledger {
    fn open(dsn: &str, table: &str) -> Result<Ledger, Box<dyn Error>> {
        if table.is_empty() || !table.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err("--ledger takes letters, digits and underscores".into());
        }
        let store = leaderelection::connect(dsn)?;
        store.ensure_schema()?;
        match store {
            AnyStore::Postgres(store) => {
                let pool = pool(PgConnector(dsn.parse()?))?;
                pool.get()?.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS \"{table}\" (id bigserial PRIMARY KEY, worker text NOT NULL, \
                     fence bigint NOT NULL, seq bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT now())"
                ))?;
                let insert = format!("INSERT INTO \"{table}\" (worker, fence, seq) VALUES ($1, $2, $3)");
                Ok(Ledger::Postgres { store, pool, insert })
            }
            AnyStore::Mysql(store) => {
                let pool = pool(MysqlConnector(mysql::Opts::from_url(dsn)?))?;
                pool.get()?.query_drop(format!(
                    "CREATE TABLE IF NOT EXISTS `{table}` (id bigint AUTO_INCREMENT PRIMARY KEY, worker \
                     varchar(255) NOT NULL, fence bigint NOT NULL, seq bigint NOT NULL, written_at timestamp(6) \
                     NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB"
                ))?;
                let insert = format!("INSERT INTO `{table}` (worker, fence, seq) VALUES (?, ?, ?)");
                Ok(Ledger::Mysql { store, pool, insert })
            }
            _ => Err("a DSN this example has no ledger for".into()),
        }
    }

    /// The store the elector campaigns on (clones share its pool).
    fn store(&self) -> AnyStore {
        match self {
            Ledger::Postgres { store, .. } => AnyStore::Postgres(store.clone()),
            Ledger::Mysql { store, .. } => AnyStore::Mysql(store.clone()),
        }
    }

    /// One row, stamped with the term's fence, committed only if the term
    /// still holds the lease on the database.
    fn write(&self, guard: &LeaderGuard, worker: &str, seq: u64) -> Result<(), StoreError> {
        let fence = i64::try_from(guard.fence()).map_err(|_| StoreError::fatal("fence out of range"))?;
        let seq = i64::try_from(seq).map_err(|_| StoreError::fatal("seq out of range"))?;
        let other = |e: &dyn Error| StoreError::retryable(e.to_string());
        match self {
            Ledger::Postgres { store, pool, insert } => {
                let mut conn = pool.get().map_err(|e| other(&e))?;
                let mut tx = conn.transaction().map_err(|e| other(&e))?;
                store.check_lease(&mut tx, guard)?;
                tx.execute(insert.as_str(), &[&worker, &fence, &seq]).map_err(|e| other(&e))?;
                tx.commit().map_err(|e| other(&e))
            }
            Ledger::Mysql { store, pool, insert } => {
                let mut conn = pool.get().map_err(|e| other(&e))?;
                let mut tx = conn.start_transaction(mysql::TxOpts::default()).map_err(|e| other(&e))?;
                store.check_lease(&mut tx, guard)?;
                tx.exec_drop(insert.as_str(), (worker, fence, seq)).map_err(|e| other(&e))?;
                tx.commit().map_err(|e| other(&e))
            }
        }
    }
}

/// A small pool of the program's own connections.
fn pool<M: r2d2::ManageConnection>(manager: M) -> Result<r2d2::Pool<M>, r2d2::Error> {
    r2d2::Pool::builder().max_size(2).connection_timeout(Duration::from_secs(5)).build(manager)
}

/// r2d2's side of a plain `postgres::Client`.
struct PgConnector(postgres::Config);

impl r2d2::ManageConnection for PgConnector {
    type Connection = postgres::Client;
    type Error = postgres::Error;
    fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        self.0.connect(postgres::NoTls)
    }
    fn is_valid(&self, conn: &mut postgres::Client) -> Result<(), postgres::Error> {
        conn.is_valid(Duration::from_secs(2))
    }
    fn has_broken(&self, conn: &mut postgres::Client) -> bool {
        conn.is_closed()
    }
}

/// r2d2's side of a plain `mysql::Conn`.
struct MysqlConnector(mysql::Opts);

impl r2d2::ManageConnection for MysqlConnector {
    type Connection = mysql::Conn;
    type Error = mysql::Error;
    fn connect(&self) -> Result<mysql::Conn, mysql::Error> {
        mysql::Conn::new(self.0.clone())
    }
    fn is_valid(&self, conn: &mut mysql::Conn) -> Result<(), mysql::Error> {
        conn.ping()
    }
    fn has_broken(&self, _: &mut mysql::Conn) -> bool {
        false
    }
}

struct Args {
    dsn: String,
    id: String,
    name: String,
    ledger: String,
    run_for: Duration,
    every: Duration,
    lease: Duration,
}

impl Args {
    fn parse() -> Result<Args, Box<dyn Error>> {
        let f = Flags::parse(&["--id", "--name", "--ledger", "--for", "--every", "--lease"])?;
        Ok(Args {
            dsn: f.dsn()?,
            id: f.text("--id", "worker"),
            name: f.text("--name", "ledger-writer"),
            ledger: f.text("--ledger", "ledger"),
            run_for: f.duration("--for", Duration::from_secs(86_400))?,
            every: f.duration("--every", Duration::from_millis(200))?,
            lease: f.duration("--lease", Duration::from_secs(15))?,
        })
    }
}
