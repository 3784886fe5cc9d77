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
//! # The pieces
//!
//! - [`Config`] and [`Elector`]: one participant, its threads and its guard.
//! - [`Store`]: the four-operation contract a database store implements;
//!   [`MemStore`] is the in-memory reference.
//! - [`machine`]: the election as a pure state machine. The elector drives
//!   it; so does the repository's fleet simulation (the unpublished
//!   `leaderelection-sim` crate), which tests this same code on virtual time.
//! - [`testing`]: guards for unit-testing your own leader-only code.
//!
//! # Crate features
//!
//! | feature | adds | pulls in |
//! |---|---|---|
//! | *(default)* | everything above | `crossbeam-channel`, `parking_lot`, `getrandom`, `log` |
//! | `storetest` | `storetest`, the acceptance suite for any `Store` | nothing |
//! | `mysql` | `mysql::MySqlStore` (also re-exported as `MySqlStore`) for MySQL 8 and MariaDB 10.5+, its own pool, TLS via `ssl-mode=REQUIRED`/`VERIFY_CA`/`VERIFY_IDENTITY` | the `mysql` crate without default features (pure-Rust `flate2` backend, its protocol crate `mysql_common`, `url`, `regex`, `serde_json`, `sha1`/`sha2`), `native-tls` (OpenSSL on Linux, shared with `postgres`) |
//! | `metrics` | each elector's figures ([`Status`]'s counters, a leader gauge, store-call latency) through the [`metrics`](https://docs.rs/metrics/0.24) facade, for any exporter; names in the README's "Operating" section | `metrics` (the facade, with its hasher `rapidhash`) |
//! | `postgres` | `postgres::PostgresStore` (also re-exported as `PostgresStore`), pooled, TLS via `sslmode=require` | `tokio-postgres` (and with it `tokio`, used internally on a current-thread runtime per connection; no async in the API), `r2d2`, `native-tls` + `postgres-native-tls` (OpenSSL on Linux) |
#![warn(missing_docs)]
// One audited exception, `mysql::borrowed::with_socket`: shutting down the
// socket of a connection borrowed from a user's `mysql::Pool`.
#![deny(unsafe_code)]

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod any;
mod config;
mod elector;
mod error;
mod guard;
mod handoff;
pub mod ident;
mod identity;
mod lease;
pub mod machine;
mod memstore;
#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod slot;
mod status;
mod store;
#[cfg(feature = "storetest")]
pub mod storetest;
mod sync;
pub mod testing;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use any::{connect, connect_table, AnyStore};
pub use config::{
    default_safety_margin, Config, ConfigError, Problem, Timing, DEFAULT_LEASE_DURATION, DEFAULT_OPERATION_TIMEOUT,
    DEFAULT_RENEW_INTERVAL, DEFAULT_RETRY_PERIOD, MAX_DURATION, MAX_IDENTITY_LEN, MAX_NAME_LEN, MAX_PAYLOAD_LEN,
    MIN_DEFAULT_SAFETY_MARGIN,
};
pub use elector::{Elector, StartError, WaitLeaderError};
pub use error::{ElectionError, OpKind};
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
pub use store::{ErrorKind, Store, StoreError};
