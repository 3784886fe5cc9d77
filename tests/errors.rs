//! The errors a program sees, through the public API: what each says, what
//! it keeps as `source()`, and the predicates callers branch on. Durations in
//! messages are checked for presence, not spelling.

use std::error::Error as _;
use std::time::{Duration, Instant};

use leaderelection::{
    Config, ConfigError, ElectionError, Elector, Lease, MemStore, OpKind, StartError, Store, StoreError,
    WaitLeaderError,
};

mod threaded;
use threaded::{eventually, ms};

#[test]
fn each_operation_names_itself() {
    let names: Vec<String> =
        [OpKind::Inspect, OpKind::Acquire, OpKind::Renew, OpKind::Release].iter().map(|op| op.to_string()).collect();
    assert_eq!(names, ["inspect", "acquire", "renew", "release"]);
}

#[test]
fn a_store_failure_names_the_operation_and_keeps_the_store_error() {
    let store_error = StoreError::fatal("permission denied for table leases");
    let e = ElectionError::Store { op: OpKind::Release, error: store_error.clone() };
    assert_eq!(e.to_string(), "release failed: permission denied for table leases");
    assert!(e.is_fatal());
    assert_eq!(e.store_error().map(StoreError::message), Some("permission denied for table leases"));
    let source = e.source().expect("the store error is the source");
    assert_eq!(source.downcast_ref::<StoreError>().map(StoreError::is_fatal), Some(true));

    let retryable = ElectionError::Store { op: OpKind::Renew, error: StoreError::retryable("connection reset") };
    assert!(!retryable.is_fatal(), "only a fatal store error is fatal");
    assert!(retryable.store_error().is_some_and(StoreError::is_retryable));
}

#[test]
fn a_timeout_names_the_operation_and_is_neither_fatal_nor_a_store_error() {
    let e = ElectionError::Timeout { op: OpKind::Acquire, after: Duration::from_secs(3) };
    let text = e.to_string();
    assert!(text.starts_with("acquire gave no answer within "), "{text}");
    assert!(text.contains('3'), "the timeout is in the message: {text}");
    assert!(!e.is_fatal());
    assert!(e.store_error().is_none());
    assert!(e.source().is_none());
}

#[test]
fn a_local_expiry_explains_itself_with_and_without_a_cause() {
    let bare = ElectionError::LeaseExpiredLocally { cause: None };
    assert_eq!(bare.to_string(), "lease expired locally before a renewal confirmed it");
    assert!(bare.source().is_none());
    assert!(!bare.is_fatal() && bare.store_error().is_none());

    let cause = ElectionError::Timeout { op: OpKind::Renew, after: ms(300) };
    let e = ElectionError::LeaseExpiredLocally { cause: Some(Box::new(cause.clone())) };
    let text = e.to_string();
    assert!(text.starts_with("lease expired locally before a renewal confirmed it: renew gave no answer"), "{text}");
    let source = e.source().expect("the cause is the source");
    assert_eq!(source.to_string(), cause.to_string());
    assert!(source.downcast_ref::<ElectionError>().is_some());
    // A fatal cause does not make the expiry itself fatal: it is a report of
    // why renewals stopped, not the failure that needs a person.
    let fatal_cause = ElectionError::LeaseExpiredLocally {
        cause: Some(Box::new(ElectionError::Store { op: OpKind::Renew, error: StoreError::fatal("x") })),
    };
    assert!(!fatal_cause.is_fatal());
}

#[test]
fn hung_calls_and_a_stopped_elector_say_so() {
    let hung = ElectionError::TooManyHungCalls { hung: 4 };
    assert_eq!(hung.to_string(), "4 store calls are still hung; not starting another");
    assert!(hung.source().is_none() && !hung.is_fatal());
    let stopped = ElectionError::Stopped;
    assert_eq!(stopped.to_string(), "elector stopped");
    assert!(stopped.source().is_none() && stopped.store_error().is_none());
}

#[test]
fn a_refused_config_comes_back_from_start_with_the_field() {
    let err = match Elector::start(Config::new(MemStore::new(), "")) {
        Ok(_) => panic!("an empty election name must be refused"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(text.starts_with("cannot start: invalid config: name: "), "{text}");
    assert!(matches!(&err, StartError::Config(c) if c.field() == "name"));
    let source = err.source().and_then(|s| s.downcast_ref::<ConfigError>()).expect("the config error is the source");
    assert_eq!(source.field(), "name");
}

#[test]
fn a_thread_that_cannot_be_spawned_is_reported_with_its_cause() {
    let err =
        StartError::Spawn(std::io::Error::new(std::io::ErrorKind::OutOfMemory, "resource temporarily unavailable"));
    assert_eq!(err.to_string(), "cannot start: spawning a thread failed: resource temporarily unavailable");
    let io = err.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io error is the source");
    assert_eq!(io.kind(), std::io::ErrorKind::OutOfMemory);
}

#[test]
fn waits_say_whether_time_ran_out_or_the_elector_stopped() {
    let store = MemStore::new();
    // Someone else holds the lease, so this participant stays a follower.
    store.acquire("jobs", "other", Duration::from_secs(60), b"", Duration::from_secs(1)).unwrap();
    let e = Elector::start(Config::new(store.clone(), "jobs").identity("me")).unwrap();
    assert_eq!(e.name(), "jobs");

    let t0 = Instant::now();
    let waited = e.wait_leader_deadline(t0 + ms(100));
    assert_eq!(waited.unwrap_err(), WaitLeaderError::Timeout);
    assert!(t0.elapsed() >= ms(100), "returned before the deadline");
    assert_eq!(WaitLeaderError::Timeout.to_string(), "timed out waiting for leadership");

    e.shutdown().unwrap();
    let after = e.wait_leader_deadline(Instant::now() + Duration::from_secs(5));
    assert_eq!(after.unwrap_err(), WaitLeaderError::Stopped, "no waiting once stopped");
    assert_eq!(e.wait_leader().unwrap_err(), WaitLeaderError::Stopped);
    assert_eq!(WaitLeaderError::Stopped.to_string(), "elector stopped while waiting for leadership");
    assert!(WaitLeaderError::Stopped.source().is_none());
}

/// A store whose every call panics, like a store with a bug.
struct PanickingStore;

impl Store for PanickingStore {
    fn acquire(&self, _: &str, _: &str, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
        panic!("bug in acquire")
    }
    fn renew(&self, _: &str, _: &str, _: u64, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
        panic!("bug in renew")
    }
    fn release(&self, _: &str, _: &str, _: u64, _: Duration) -> Result<(), StoreError> {
        panic!("bug in release")
    }
    fn inspect(&self, _: &str, _: Duration) -> Result<Lease, StoreError> {
        panic!("bug in inspect")
    }
}

#[test]
fn a_store_that_panics_is_a_fatal_error_not_a_dead_elector() {
    let e = Elector::start(Config::new(PanickingStore, "jobs").identity("me")).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || e.status().last_error.is_some_and(|err| err.is_fatal())),
        "the panic was not reported: {:?}",
        e.status()
    );
    let err = e.status().last_error.expect("reported");
    assert_eq!(err.store_error().map(StoreError::message), Some("store call panicked"));
    assert!(!e.is_leader());
    // The elector is still alive and shuts down normally.
    assert!(!e.status().stopped);
    e.shutdown().unwrap();
    assert!(e.status().stopped);
}
