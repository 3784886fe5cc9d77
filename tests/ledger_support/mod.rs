//! The parts of the lease-checked-writes chaos suite (tests/chaos_ledger.rs):
//! the paths and their tables ([`Path`], [`Tables`]), the worker process
//! ([`worker`]), the fleet of worker processes the scenarios drive
//! ([`fleet`]) and the ledger's judge ([`oracle`]).
#![allow(dead_code)]

pub mod fleet;
pub mod oracle;
pub mod worker;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use leaderelection::postgres::PostgresStore;

use crate::pg_support::{self, BOUNCER, DIRECT};
use crate::support::TIMING;
use oracle::Row;

/// How long the server lets a worker's transaction sit idle before it ends
/// the session and rolls the transaction back (PostgreSQL
/// `idle_in_transaction_session_timeout`, set with `SET LOCAL` in every
/// transaction; MariaDB `idle_transaction_timeout`, whole seconds). A
/// checked transaction holds every claim off while it is open, so without
/// this a leader stopped inside one would hold the election forever. It
/// must exceed the lease (a live leader's transactions last milliseconds),
/// and, for the negative control to show its violation, how long an
/// unchecked paused transaction waits for the successor's first row
/// (about a lease and 0.5 s).
pub const IDLE: Duration = Duration::from_secs(6);

/// The pause between two transactions of a leading worker.
pub const PACE: Duration = Duration::from_millis(40);

/// The bound stated for someone to lead again once a leader is gone (or
/// its transaction ended): a lease that may still run on the database, a
/// renewal interval, a retry period, two operation timeouts (a claim in
/// flight and the one that wins), and 1 s for this loaded two-core machine.
pub const RECOVERY: Duration = Duration::from_millis(
    (TIMING.lease_duration.as_millis()
        + TIMING.renew_interval.as_millis()
        + TIMING.retry_period.as_millis()
        + 2 * TIMING.operation_timeout.as_millis()
        + 1000) as u64,
);

/// Whether leaders run the lease check in their transactions, or only ask
/// `guard.is_valid()` before each (the negative control).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Checked,
    Unchecked,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Checked => "checked",
            Mode::Unchecked => "unchecked",
        }
    }

    pub fn parse(s: &str) -> Mode {
        match s {
            "checked" => Mode::Checked,
            "unchecked" => Mode::Unchecked,
            _ => panic!("unknown mode {s:?}"),
        }
    }
}

/// The way the workers reach the election's database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// PostgreSQL, directly.
    Pg,
    /// PostgreSQL through PgBouncer in transaction mode.
    Bouncer,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Path {
    pub fn as_str(self) -> &'static str {
        match self {
            Path::Pg => "postgres",
            Path::Bouncer => "pgbouncer",
        }
    }

    pub fn parse(s: &str) -> Path {
        match s {
            "postgres" => Path::Pg,
            "pgbouncer" => Path::Bouncer,
            _ => panic!("unknown path {s:?}"),
        }
    }

    /// The variable holding the URL of this path (it fails with how to set
    /// it when missing).
    fn var(self) -> &'static str {
        match self {
            Path::Pg => DIRECT,
            Path::Bouncer => BOUNCER,
        }
    }

    /// Where the workers' fault proxies forward to.
    pub fn upstream(self) -> SocketAddr {
        let (host, port) = pg_support::host_port(self.var());
        let ip = if host == "localhost" { "127.0.0.1".to_owned() } else { host };
        SocketAddr::new(ip.parse().expect("the test server's host is an IP address"), port)
    }

    /// The URL a worker uses, through local port `port` (its proxy's).
    pub fn url_via(self, port: u16) -> String {
        pg_support::dsn_via(self.var(), "127.0.0.1", port, None, "")
    }
}

/// The tables of one scenario: the election's, the ledger and its clock.
pub struct Tables {
    pub path: Path,
    pub election: String,
    pub ledger: String,
    pub clock: String,
}

impl Tables {
    /// Creates the tables of a new scenario (names with a random tag).
    pub fn create(path: Path) -> Tables {
        let tag = crate::support::random_tag();
        let t = Tables {
            path,
            election: format!("ledger_elect_{tag}"),
            ledger: format!("ledger_{tag}"),
            clock: format!("ledger_{tag}_clock"),
        };
        let mut c = pg_support::client(DIRECT);
        c.batch_execute(&format!(
            "CREATE TABLE public.\"{l}\" (id bigserial PRIMARY KEY, fence bigint NOT NULL, worker text NOT NULL, \
             seq bigint NOT NULL, checked boolean NOT NULL, stamp bigint UNIQUE, \
             written_at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE public.\"{k}\" (n bigint NOT NULL);
             INSERT INTO public.\"{k}\" VALUES (0);",
            l = t.ledger,
            k = t.clock
        ))
        .unwrap_or_else(|e| panic!("creating the ledger tables: {e}"));
        let store = PostgresStore::builder(&pg_support::dsn(DIRECT))
            .table("public", t.election.clone())
            .build()
            .unwrap_or_else(|e| panic!("election store: {e}"));
        store.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
        t
    }

    /// Every committed row of the ledger.
    pub fn rows(&self) -> Vec<Row> {
        let mut c = pg_support::client(DIRECT);
        let q = format!(
            "SELECT stamp::text, fence::text, worker, seq::text FROM public.\"{}\" WHERE stamp IS NOT NULL ORDER BY stamp",
            self.ledger
        );
        let rows = c.simple_query(&q).unwrap_or_else(|e| panic!("reading the ledger: {e}"));
        rows.into_iter()
            .filter_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => Some(Row {
                    stamp: r.get(0).unwrap().parse().unwrap(),
                    fence: r.get(1).unwrap().parse().unwrap(),
                    worker: r.get(2).unwrap().to_owned(),
                    seq: r.get(3).unwrap().parse().unwrap(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Rows without a stamp: there must be none (the stamp is written in
    /// the same transaction as the row).
    pub fn unstamped(&self) -> i64 {
        let mut c = pg_support::client(DIRECT);
        let q = format!("SELECT count(*)::text FROM public.\"{}\" WHERE stamp IS NULL", self.ledger);
        let rows = c.simple_query(&q).unwrap_or_else(|e| panic!("counting unstamped rows: {e}"));
        rows.iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|n| n.parse().ok()),
                _ => None,
            })
            .expect("a count")
    }

    /// Drops the scenario's tables.
    pub fn drop_all(&self) {
        let mut c = pg_support::client(DIRECT);
        let q = format!(
            "DROP TABLE IF EXISTS public.\"{}\", public.\"{}\", public.\"{}\", public.\"{}_slots\"",
            self.ledger, self.clock, self.election, self.election
        );
        if let Err(e) = c.batch_execute(&q) {
            eprintln!("chaos-ledger: dropping {}: {e}", self.ledger);
        }
    }
}
