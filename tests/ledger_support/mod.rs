//! The parts of the lease-checked-writes chaos suite (tests/chaos_ledger.rs):
//! the paths and their tables ([`Path`], [`Tables`]), the worker process
//! ([`worker`]), the fleet of worker processes the scenarios drive
//! ([`fleet`]) and the ledger's judge ([`oracle`]).
#![allow(dead_code)]

pub mod fleet;
pub mod oracle;
pub mod worker;

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::mysql_support::{self, SHARED};
use crate::pg_support::{self, DIRECT};
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
/// its transaction ended); see [`crate::support::RECOVERY`].
pub use crate::support::RECOVERY;

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

#[path = "../fleet_path/mod.rs"]
mod fleet_path;
pub use fleet_path::Path;

/// The tables of one scenario: the election's (and whatever else its
/// store's `ensure_schema` makes, all named after it), the ledger and its
/// clock. Every name holds the scenario's random tag.
pub struct Tables {
    pub path: Path,
    tag: String,
    pub election: String,
    pub ledger: String,
    pub clock: String,
}

/// One query's rows as text, on the path's admin connection (PostgreSQL
/// direct for both PostgreSQL paths).
fn text_rows(path: Path, q: &str) -> Vec<Vec<String>> {
    match path {
        Path::Maria => {
            let mut c = mysql_support::admin(SHARED);
            let rows: Vec<mysql::Row> = c.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
            rows.into_iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| match r.as_ref(i) {
                            Some(mysql::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                            Some(mysql::Value::Int(n)) => n.to_string(),
                            Some(mysql::Value::UInt(n)) => n.to_string(),
                            other => panic!("{q}: unexpected value {other:?}"),
                        })
                        .collect()
                })
                .collect()
        }
        _ => {
            let mut c = pg_support::client(DIRECT);
            let msgs = c.simple_query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
            msgs.into_iter()
                .filter_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).map(|i| r.get(i).unwrap_or_default().to_owned()).collect())
                    }
                    _ => None,
                })
                .collect()
        }
    }
}

fn execute(path: Path, q: &str) {
    match path {
        Path::Maria => mysql_support::exec(&mut mysql_support::admin(SHARED), q),
        _ => pg_support::client(DIRECT).batch_execute(q).unwrap_or_else(|e| panic!("{q}: {e}")),
    }
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
            tag,
        };
        let (l, k) = (&t.ledger, &t.clock);
        match path {
            Path::Maria => {
                execute(
                    path,
                    &format!(
                        "CREATE TABLE `{l}` (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL, \
                         worker VARCHAR(16) NOT NULL, seq BIGINT NOT NULL, checked BOOLEAN NOT NULL, \
                         stamp BIGINT NULL UNIQUE, written_at DATETIME(6) NOT NULL DEFAULT NOW(6)) ENGINE = InnoDB"
                    ),
                );
                execute(path, &format!("CREATE TABLE `{k}` (n BIGINT NOT NULL) ENGINE = InnoDB"));
                execute(path, &format!("INSERT INTO `{k}` VALUES (0)"));
                mysql_support::store_on(SHARED, &t.election);
            }
            _ => {
                execute(
                    path,
                    &format!(
                        "CREATE TABLE public.\"{l}\" (id bigserial PRIMARY KEY, fence bigint NOT NULL, \
                         worker text NOT NULL, seq bigint NOT NULL, checked boolean NOT NULL, stamp bigint UNIQUE, \
                         written_at timestamptz NOT NULL DEFAULT clock_timestamp());
                         CREATE TABLE public.\"{k}\" (n bigint NOT NULL);
                         INSERT INTO public.\"{k}\" VALUES (0);"
                    ),
                );
                pg_support::store_on(DIRECT, &t.election);
            }
        }
        t
    }

    fn quoted(&self, table: &str) -> String {
        match self.path {
            Path::Maria => format!("`{table}`"),
            _ => format!("public.\"{table}\""),
        }
    }

    /// Every committed row of the ledger.
    pub fn rows(&self) -> Vec<Row> {
        let q = format!(
            "SELECT stamp, fence, worker, seq FROM {} WHERE stamp IS NOT NULL ORDER BY stamp",
            self.quoted(&self.ledger)
        );
        text_rows(self.path, &q)
            .into_iter()
            .map(|r| Row {
                stamp: r[0].parse().unwrap(),
                fence: r[1].parse().unwrap(),
                worker: r[2].clone(),
                seq: r[3].parse().unwrap(),
            })
            .collect()
    }

    /// Rows without a stamp: there must be none (the stamp is written in
    /// the same transaction as the row).
    pub fn unstamped(&self) -> i64 {
        let q = format!("SELECT count(*) FROM {} WHERE stamp IS NULL", self.quoted(&self.ledger));
        text_rows(self.path, &q)[0][0].parse().unwrap()
    }

    /// Drops every table of the scenario (those `ensure_schema` made too).
    pub fn drop_all(&self) {
        let schema = match self.path {
            Path::Maria => "DATABASE()",
            _ => "current_schema()",
        };
        let q = format!("SELECT table_name FROM information_schema.tables WHERE table_schema = {schema}");
        let names: Vec<String> =
            text_rows(self.path, &q).into_iter().map(|r| r[0].clone()).filter(|n| n.contains(&self.tag)).collect();
        if names.is_empty() {
            return;
        }
        let list: Vec<String> = names.iter().map(|n| self.quoted(n)).collect();
        execute(self.path, &format!("DROP TABLE IF EXISTS {}", list.join(", ")));
    }
}
