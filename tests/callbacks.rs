//! Callbacks that panic: a bug in user code must not stop the elector from
//! electing, nor the later callbacks from running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leaderelection::{Config, Elector, MemStore};

mod threaded;
use threaded::{eventually, timing};

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

#[test]
fn panicking_callbacks_are_contained_and_the_next_terms_still_start() {
    let store = MemStore::new();
    let (started, stopped, observed) = (counter(), counter(), counter());
    let (s1, s2, s3) = (started.clone(), stopped.clone(), observed.clone());
    let a = Elector::start(
        Config::new(store.clone(), "jobs")
            .identity("a")
            .timing(timing())
            .on_started_leading(move |guard| {
                s1.fetch_add(1, Ordering::SeqCst);
                assert!(guard.is_valid());
                panic!("bug in the leader's work loop (fence {})", guard.fence());
            })
            .on_stopped_leading(move || {
                s2.fetch_add(1, Ordering::SeqCst);
                panic!("bug in on_stopped_leading");
            })
            .on_new_leader(move |_, _| {
                s3.fetch_add(1, Ordering::SeqCst);
                panic!("bug in on_new_leader");
            }),
    )
    .unwrap();
    // The work loop's panic drops its guard, which resigns the term; the
    // elector campaigns again and each callback keeps being called.
    assert!(
        eventually(Duration::from_secs(10), || started.load(Ordering::SeqCst) >= 2
            && stopped.load(Ordering::SeqCst) >= 1
            && observed.load(Ordering::SeqCst) >= 2),
        "started {}, stopped {}, observed {}",
        started.load(Ordering::SeqCst),
        stopped.load(Ordering::SeqCst),
        observed.load(Ordering::SeqCst)
    );
    assert!(store.stats().releases >= 1, "the panicked term was released, not left to run out");
    assert!(store.peek("jobs").expect("row").fence >= 2, "a fresh fence for the next term");
    a.shutdown().unwrap();
    assert!(a.status().stopped);
}
