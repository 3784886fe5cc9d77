//! The parts of the group chaos suite (tests/chaos_group.rs): the timings
//! and sizes, the paths and their tables ([`Path`], [`Tables`]), the one
//! clock every process shares ([`mono_ns`], [`Clock`]), the worker process
//! ([`worker`]), the fleet the scenarios drive ([`fleet`]) and the judge of
//! the terms the workers report ([`oracle`]).

mod clock;
pub mod fleet;
pub mod oracle;
pub mod worker;

pub use clock::{clock_ns, mono_ns, Clock, CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID};

use std::time::Duration;

use leaderelection::Timing;
use mysql::prelude::Queryable;

use crate::mysql_support::{self, SHARED};
use crate::pg_support::{self, DIRECT};

/// The timings of every group in the suite: a lease of 3 s, renewals and
/// looks every 500 ms, calls given up after 500 ms, a margin of 300 ms.
/// With the group's default tick (125 ms) the group's invariant holds:
/// 500 + 2*500 + 125 (retry delay) + 125 (tick) = 1750 ms <= 3000 - 300 ms.
pub const TIMING: Timing = Timing {
    lease_duration: Duration::from_millis(3000),
    renew_interval: Duration::from_millis(500),
    retry_period: Duration::from_millis(500),
    operation_timeout: Duration::from_millis(500),
    safety_margin: Duration::from_millis(300),
};

/// The grid step a group runs on with [`TIMING`]
/// (`leaderelection::group::core::default_tick`; the worker checks).
pub const TICK: Duration = Duration::from_millis(125);

/// How many elections each fleet runs: the same ones in every worker.
pub const ELECTIONS: usize = 1000;

/// [`ELECTIONS`], or `LE_CHAOS_GROUP_ELECTIONS` when set (for a quick run
/// while working on the suite; CI never sets it).
pub fn elections() -> usize {
    match std::env::var("LE_CHAOS_GROUP_ELECTIONS") {
        Ok(v) => v.parse().expect("LE_CHAOS_GROUP_ELECTIONS must be a number"),
        Err(_) => ELECTIONS,
    }
}

/// Every election led again, and the shares converged, within this of a
/// fault's start (a kill, a stop, a partition) or its end: a lease that
/// may still run on the database (a renewal that landed unanswered), a
/// renew interval for that renewal and one for the members' heartbeat to
/// count the change (the heartbeat goes every renew interval; a member is
/// counted out once its heartbeat's lease runs out), a retry period for
/// the next look, two operation timeouts (a call in flight, then the
/// claim), the group's tick (timers fire on its grid), and 1 s for
/// reconnecting on this loaded two-core machine.
pub const BOUND: Duration = Duration::from_millis(
    (TIMING.lease_duration.as_millis()
        + 2 * TIMING.renew_interval.as_millis()
        + TIMING.retry_period.as_millis()
        + 2 * TIMING.operation_timeout.as_millis()
        + TICK.as_millis()
        + 1000) as u64,
);

// ---- paths and tables ----------------------------------------------------

#[path = "../fleet_path/mod.rs"]
mod fleet_path;
pub use fleet_path::Path;

/// The scenario's table (and whatever else the store's `ensure_schema`
/// makes, all named after it), with a random tag in its name.
pub struct Tables {
    pub path: Path,
    tag: String,
    pub table: String,
}

impl Tables {
    /// Creates the table of a new scenario, directly (not through a proxy).
    pub fn create(path: Path) -> Tables {
        let tag = crate::support::random_tag();
        let t = Tables { path, table: format!("grp_{tag}"), tag };
        match path {
            Path::Maria => {
                mysql_support::store_on(SHARED, &t.table);
            }
            _ => {
                pg_support::store_on(DIRECT, &t.table);
            }
        }
        t
    }

    /// Drops every table whose name holds the scenario's tag.
    pub fn drop_all(&self) {
        let names: Vec<String> = match self.path {
            Path::Maria => {
                let mut c = mysql_support::admin(SHARED);
                let q = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()";
                let names: Vec<String> = c.query(q).unwrap_or_else(|e| panic!("{q}: {e}"));
                let mine: Vec<String> = names.into_iter().filter(|n| n.contains(&self.tag)).collect();
                if !mine.is_empty() {
                    let list: Vec<String> = mine.iter().map(|n| format!("`{n}`")).collect();
                    mysql_support::exec(&mut c, &format!("DROP TABLE IF EXISTS {}", list.join(", ")));
                }
                return;
            }
            _ => {
                let mut c = pg_support::client(DIRECT);
                let q = "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()";
                let rows = c.query(q, &[]).unwrap_or_else(|e| panic!("{q}: {e}"));
                rows.iter().map(|r| r.get::<_, String>(0)).filter(|n| n.contains(&self.tag)).collect()
            }
        };
        if !names.is_empty() {
            let list: Vec<String> = names.iter().map(|n| format!("public.\"{n}\"")).collect();
            let q = format!("DROP TABLE IF EXISTS {} CASCADE", list.join(", "));
            pg_support::client(DIRECT).batch_execute(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        }
    }
}
