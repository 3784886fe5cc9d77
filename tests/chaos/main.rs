//! The chaos suite: a live fleet of electors on real servers, one fault at a
//! time, judged by one oracle (tests/support/oracle.rs). Every scenario runs
//! on PostgreSQL direct, on PostgreSQL through PgBouncer in transaction mode
//! and on MariaDB, wherever the fault applies; each prints its figures
//! (`chaos <path>/<scenario> …` lines, and one `RESULT` line from the
//! oracle).
//!
//! The oracle asserts, for every scenario: no two participants valid at
//! once, fences strictly increasing from term to term, and every
//! participant valid no longer than the lease after its last confirmed
//! send. Each scenario adds that someone leads again within
//! [`rig::RECOVERY`] of the fault healing, and what else its fault
//! promises. Faults on the network go through a proxy per participant on
//! the machine's shared servers; faults on a server use servers of the
//! scenario's own (tests/support/pg_server.rs, maria_server.rs).
//!
//! Run with `bash scripts/test.sh`, or alone (after `source scripts/db.sh;
//! source scripts/mysql.sh`):
//! `cargo test --features postgres,mysql --test chaos -- --test-threads 6`.
//! The ten-minute soak: `bash scripts/chaos-soak.sh`.

#[path = "../support/mod.rs"]
mod support;
// For the paths' names (fleet_path::Path), shared with the multi-process
// chaos suites.
#[allow(dead_code)]
#[path = "../fleet_path/mod.rs"]
mod fleet_path;
#[path = "../mysql_support/mod.rs"]
mod mysql_support;
#[path = "../pg_support/mod.rs"]
mod pg_support;

mod rig;
mod scenarios;
