//! Leader election for processes that share nothing but a database.
//!
//! Run the same service in several clusters or data centres, or run cron
//! jobs and batch programs on several hosts: if the only thing they have in
//! common is a PostgreSQL or MySQL/MariaDB database, this crate elects exactly
//! one of them to lead, with no async runtime — plain OS threads, and a
//! [`LeaderGuard`] your work loop holds and asks [`LeaderGuard::is_valid`]
//! before every write.
//!
//! ```
//! use leaderelection::{Config, Elector, MemStore};
//! use std::time::Duration;
//!
//! // MemStore elects among threads of one process; production code passes a
//! // database store instead.
//! let store = MemStore::new();
//! let a = Elector::start(Config::new(store.clone(), "invoice-reconciler").identity("a"))?;
//! let guard = a.wait_leader_timeout(Duration::from_secs(5))?;
//! let b = Elector::start(Config::new(store.clone(), "invoice-reconciler").identity("b"))?;
//!
//! assert!(guard.is_valid());          // ask before every write ...
//! let fence = guard.fence();          // ... and stamp the write with the fence
//! assert!(!b.is_leader());
//!
//! drop(guard);                        // resigning hands over at once
//! let next = b.wait_leader_timeout(Duration::from_secs(5))?;
//! assert!(next.fence() > fence);      // a new term, a higher fence
//! # drop(next);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The work loop
//!
//! Hold one guard for as long as the term lasts and there is work, and wait
//! for the next term only once it has ended. A guard taken per batch and
//! dropped after it resigns after every batch, and leadership moves between
//! replicas each time. Drop the old guard before waiting again (see
//! [`Elector::wait_leader`]).
//!
//! ```
//! use leaderelection::{Config, Elector, MemStore};
//! use std::time::Duration;
//!
//! let elector = Elector::start(Config::new(MemStore::new(), "invoice-reconciler"))?;
//! let mut batches = vec![vec![1, 2], vec![3]];    // stands in for your queue
//! let mut written = Vec::new();
//!
//! let guard = elector.wait_leader()?;             // one term for all the batches
//! while guard.is_valid() {                        // re-reads the monotonic clock
//!     match batches.pop() {
//!         Some(batch) => written.extend(batch.into_iter().map(|job| (job, guard.fence()))),
//!         None => break, // a service would wait instead: guard.wait_lost_timeout(…)
//!     }
//! }
//! assert!(written.iter().all(|&(_, fence)| fence == guard.fence())); // one term, one fence
//! drop(guard);                                    // resigns: a successor takes over at once
//! elector.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Guards, terms and shutdown
//!
//! - **[`Elector::start`]** spawns a renewal thread, a watchdog thread and
//!   (when needed) worker threads for store calls. It returns at once.
//! - **[`LeaderGuard`]** is a handle on one term. [`is_valid()`](LeaderGuard::is_valid)
//!   is true only while that term is live and its deadline has not passed,
//!   and once false it stays false. [`fence()`](LeaderGuard::fence) is the
//!   term's fencing token. [`lost()`](LeaderGuard::lost) is a crossbeam
//!   `Receiver` that turns ready when the term ends, for use in `select!`.
//!   [`wait_lost_timeout(d)`](LeaderGuard::wait_lost_timeout) blocks.
//! - **Dropping the last guard of a live term resigns it.** The lease is
//!   released so a successor can take over at once, and this process waits
//!   two retry periods before it campaigns again (a follower polls within
//!   1.2). A leader whose work loop returned or panicked therefore hands over
//!   rather than renew a lease nobody uses. [`LeaderGuard::resign`] does the
//!   same and returns the release error. A program that only polls
//!   [`Elector::is_leader`] and never takes a guard keeps leading until it
//!   shuts down.
//! - **No overlap.** While any guard of an ended term is alive, the elector
//!   starts no new term, so two terms of one process never overlap in your
//!   code.
//! - **[`Elector::shutdown`]** (and `Drop`) invalidates the term first, then
//!   releases the lease, then joins the threads. A renewal still in flight is
//!   waited for first (up to the operation timeout), since one that landed
//!   after the release would extend the lease again and keep the successor
//!   out for a whole lease. [`Elector::shutdown_without_release`] stops the
//!   same way but leaves the lease to run out, as a crash would.
//! - **[`Elector::status`]** shows the leader last seen (identity, fence,
//!   payload), this participant's fence and `valid_until`, `last_error`, and
//!   `held_back`: guards of an ended term are still alive, so no new term
//!   starts. Drop the old guard before waiting for the next term — `guard =
//!   elector.wait_leader()?` keeps it alive while it waits, and waits
//!   forever.
//! - **Callbacks**, if you prefer them:
//!   [`on_started_leading(|guard| …)`](Config::on_started_leading) runs on its
//!   own thread for the whole term,
//!   [`on_stopped_leading(|| …)`](Config::on_stopped_leading) after it
//!   returns, and [`on_new_leader(|identity, fence| …)`](Config::on_new_leader)
//!   is advisory. Shutdown waits for `on_started_leading` to return, so
//!   return when the guard turns invalid, and do not shut the elector down
//!   from inside a callback.
//!
//! [`Config`]'s setters give each default; the timing rule they must satisfy,
//! and why, is in the repository's `docs/design.md` (Configuration).
//!
//! # Leaders and readers
//!
//! A common shape, taken from services that use Kubernetes leases: every
//! replica does the reading work (serving requests, watching state), and only
//! the leader writes shared state. Check [`LeaderGuard::is_valid`] right
//! before each write and let the readers find the leader through
//! [`Status::leader`], whose `payload` the leader set with [`Config::payload`]
//! (an address, for instance). It is often the only channel between clusters
//! that exists.
//!
//! # Testing your own code
//!
//! [`testing`] gives you guards without a store or a thread:
//!
//! ```
//! use leaderelection::testing::{follower_guard, TestTerm};
//! # fn my_leader_step(guard: &leaderelection::LeaderGuard) { let _ = guard.is_valid(); }
//!
//! let term = TestTerm::new(42);
//! let guard = term.guard();        // hold it: dropping the last guard resigns
//! my_leader_step(&guard);          // runs as leader with fence 42
//! term.end();                      // leadership lost mid-way
//! my_leader_step(&guard);          // now sees an invalid guard
//! my_leader_step(&follower_guard());
//! assert!(!term.resigned());       // it lost the term; it did not resign
//! ```
//!
//! [`MemStore`] runs the real elector — renewal, watchdog, fencing — in one
//! process. It can offset or advance its database clock, fail every call
//! ([`MemStore::set_failing`]), or hang every call like a stopped server
//! ([`MemStore::pause`]).
//!
//! # Your own store
//!
//! A store is four methods ([`Store`]: `acquire`, `renew`, `release`,
//! `inspect`). The `storetest` feature exposes the acceptance suite the
//! built-in stores pass: `leaderelection::storetest::run_all(&my_store)`, and
//! `storetest::run_operator_cases(&my_store, &operator)`, where `operator`
//! implements `storetest::Operator` (delete a row, write an older copy of a
//! row back, drop and re-create the table) so the suite can check that fences
//! keep growing across those events.
//!
//! # How it stays safe
//!
//! - **Only database time.** Every store statement returns the lease's expiry
//!   *and* the server's `now`; only their difference is used. A [`DbTime`]
//!   cannot be compared with a local clock at all, so a host whose clock is
//!   days off changes nothing.
//! - **Deadline anchored at send time.** A lease reported valid for `ttl`
//!   becomes the local monotonic deadline
//!   `sent_at + min(ttl, requested) - safety_margin`, where `sent_at` was read
//!   before the request left.
//! - **A watchdog that never waits on the database.** Store calls run on
//!   worker threads; a call that hangs past the operation timeout is
//!   abandoned, and the term ends at its deadline regardless.
//!   [`LeaderGuard::is_valid`] re-reads the monotonic clock on every call.
//! - **Fences.** Each term carries a token that strictly increases across the
//!   election. A participant that stepped down locally releases and takes a
//!   fresh token rather than resume the old one.
//!
//! All eleven guarantees, how each is checked and what is not guaranteed are
//! in the repository's `docs/design.md`; faults and their measured effects in
//! `docs/failure-modes.md`; status, metrics, logs, alerts and operators' SQL
//! in `docs/operating.md`; the `leaderelection` command-line tool in
//! `docs/cli.md`.
//!
//! # The pieces
//!
//! - [`Config`] and [`Elector`]: one participant, its threads and its guard.
//! - [`Group`] and [`Election`]: many elections of one participant on a
//!   fixed handful of threads, their store calls batched, with an optional
//!   fair share among the processes of the group ([`group`]).
//! - [`Store`]: the four-operation contract a database store implements;
//!   [`MemStore`] is the in-memory reference.
//! - `postgres::PostgresStore` and `mysql::MySqlStore` (features `postgres`
//!   and `mysql`): the database stores; their module pages describe the
//!   schema, the statements, timeouts, TLS and errors.
//! - [`machine`]: the election as a pure state machine. The elector drives
//!   it; so does the repository's fleet simulation (the unpublished
//!   `leaderelection-sim` crate), which tests this same code on virtual time.
//! - [`slot`]: work that must run once per schedule slot, whoever leads.
//! - [`testing`]: guards for unit-testing your own leader-only code.
//!
//! # Crate features
//!
//! | feature | adds | pulls in |
//! |---|---|---|
//! | *(default)* | everything above | `crossbeam-channel`, `parking_lot`, `getrandom`, `log` |
//! | `storetest` | `storetest`, the acceptance suite for any `Store` | nothing |
//! | `mysql` | `mysql::MySqlStore` (also re-exported as `MySqlStore`) for MySQL 8 and MariaDB 10.5+, its own pool, TLS via `ssl-mode=REQUIRED`/`VERIFY_CA`/`VERIFY_IDENTITY` | the `mysql` crate without default features (pure-Rust `flate2` backend, its protocol crate `mysql_common`, `url`, `regex`, `serde_json`, `sha1`/`sha2`), `native-tls` (OpenSSL on Linux, shared with `postgres`) |
//! | `metrics` | each elector's figures ([`Status`]'s counters, a leader gauge, store-call latency) through the [`metrics`](https://docs.rs/metrics/0.24) facade, for any exporter; the names are in the repository's `docs/operating.md` (Metrics) | `metrics` (the facade, with its hasher `rapidhash`); the exporter is yours |
//! | `postgres` | `postgres::PostgresStore` (also re-exported as `PostgresStore`), pooled, TLS via `sslmode=require` | `tokio-postgres` (and with it `tokio`, used internally on a current-thread runtime per connection; no async in the API), `r2d2`, `native-tls` + `postgres-native-tls` (OpenSSL on Linux), and the sync `postgres` client whose transactions `PostgresStore::check_lease` takes |
//!
//! The command-line tool is not a feature: it is the workspace's `cli/`
//! package (`leaderelection-cli`, binary `leaderelection`), built on the
//! `postgres` and `mysql` features plus `lexopt` and `libc`.
//!
//! Logging goes through the `log` crate: term start and end at `info`,
//! failures and early ends at `warn` (the lines are listed in
//! `docs/operating.md`, Logs). No log line, error or `Debug` output carries a
//! payload or a password.
#![warn(missing_docs)]
// One audited exception, `mysql::borrowed::with_socket`: shutting down the
// socket of a connection borrowed from a user's `mysql::Pool`.
#![deny(unsafe_code)]

// The Rust blocks of README.md and docs/*.md, compiled by `cargo test --doc`.
// They use the database stores, so they are compiled only with both
// features on: `cargo test --doc --features postgres,mysql -- doctests`.
#[cfg(all(doctest, feature = "postgres", feature = "mysql"))]
mod doctests {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/cli.md")]
    struct Cli;
    #[doc = include_str!("../docs/design.md")]
    struct Design;
    #[doc = include_str!("../docs/failure-modes.md")]
    struct FailureModes;
    #[doc = include_str!("../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod any;
pub mod batch;
mod config;
mod elector;
mod error;
mod feed;
pub mod group;
mod guard;
mod handoff;
pub mod ident;
mod identity;
mod lease;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod lockfeed;
pub mod machine;
mod memstore;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
mod setters;
pub mod slot;
mod status;
mod store;
#[cfg(feature = "storetest")]
pub mod storetest;
mod sync;
pub mod testing;
mod threads;
mod timing;
mod workers;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use any::{connect, connect_table, AnyStore};
pub use batch::{BatchItem, Heartbeat, Members};
pub use config::Config;
pub use elector::{Elector, StartError, WaitLeaderError};
pub use error::{ElectionError, OpKind};
pub use group::{Election, Group, GroupConfig, GroupStatus, JoinError, MAX_GROUP_CALL_THREADS};
pub use guard::{LeaderGuard, LeaseCheck, WaitTimeoutResult};
pub use identity::{base_identity, generate_identity, IdentityError};
pub use lease::{DbTime, Lease};
pub use memstore::{MemStats, MemStore};
#[cfg(feature = "mysql")]
pub use mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
pub use slot::{period_slot, SlotClaim, MAX_SLOT_LEN};
pub use status::{LeaderInfo, Status, TermsEnded};
pub use store::{ErrorKind, Released, Store, StoreError};
pub use timing::{
    default_safety_margin, ConfigError, Problem, Timing, DEFAULT_LEASE_DURATION, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_PERIOD, MAX_DURATION, MAX_IDENTITY_LEN, MAX_NAME_LEN, MAX_PAYLOAD_LEN,
    MIN_DEFAULT_SAFETY_MARGIN,
};
