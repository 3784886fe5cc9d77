//! What a group's driver keeps of the leases it reads (issue 20).
//!
//! The driver runs every election's state machine and publishes each
//! election's status after each reading of its lease. An allocation it
//! makes for that and keeps until the next reading (a copy of the holder's
//! identity, say) is small and long-lived, made among the batches' large
//! short-lived buffers: with glibc's allocator thousands of them a second
//! pinned the heap's pages, and a process running 10,000 elections on
//! MariaDB grew without bound (BENCHMARKS.md, row 8). This binary counts,
//! with an allocator of its own, the allocations made on the driver's
//! thread over ten renewals of every election that are still live at the
//! end: a leading group and a following one, on MemStore, on short timings
//! (4,144 of 500 elections before the fix, 142 after).
//! Its own test binary: the count is the process's.

mod threaded;
mod tracking;

use std::time::Duration;

use leaderelection::{Config, Group, GroupConfig, MemStore};
use threaded::{eventually, timing};
use tracking::{live, Tracking, SERIAL};

const DRIVER: &str = "leaderelection-group";

#[global_allocator]
static ALLOC: Tracking = Tracking { thread: DRIVER };

const N: usize = 500;

#[test]
fn ten_renewals_of_every_election_leave_nothing_new_on_the_driver() {
    let _one = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let store = MemStore::new();
    let start = |id: &str, payload: &[u8]| {
        let cfg = Config::new(store.clone(), "g").identity(id).timing(timing()).payload(payload.to_vec());
        Group::start(GroupConfig::new(cfg)).unwrap()
    };
    let leading = start("leader-a", b"http://10.0.0.7:8080");
    let names: Vec<String> = (0..N).map(|i| format!("shard-{i}")).collect();
    let mine: Vec<_> = names.iter().map(|n| leading.join(n).unwrap()).collect();
    assert!(eventually(Duration::from_secs(20), || leading.status().leading == N), "{:?}", leading.status());
    let following = start("follower-b", b"");
    let theirs: Vec<_> = names.iter().map(|n| following.join(n).unwrap()).collect();
    // Warm up: every election renewed and looked at a few times.
    let s0 = store.stats();
    assert!(eventually(Duration::from_secs(20), || {
        let s = store.stats();
        s.renews >= s0.renews + 3 * N as u64 && s.inspects >= s0.inspects + 3 * N as u64
    }));

    tracking::start();
    let s1 = store.stats();
    let enough = eventually(Duration::from_secs(30), || {
        let s = store.stats();
        s.renews >= s1.renews + 10 * N as u64 && s.inspects >= s1.inspects + 10 * N as u64
    });
    tracking::stop();
    assert!(enough, "ten renewals and looks of every election within 30 s: {:?}", store.stats());
    let left = live();
    let s2 = store.stats();
    eprintln!(
        "driver allocations still live: {left} after {} renewals and {} looks of {N} elections",
        s2.renews - s1.renews,
        s2.inspects - s1.inspects
    );
    assert!(mine.iter().all(|e| e.is_leader()) && theirs.iter().all(|e| !e.is_leader()));
    // What stays is structure, not readings: the nodes of the drivers'
    // timer maps, which split and merge as elections' deadlines move (142
    // of 280 and 376 bytes when this was written). A copy kept per reading
    // would leave at least one per election and group, 2 × N.
    assert!(
        left < N,
        "{left} allocations the drivers made over ten readings of each of {N} elections are still live \
         (a reading should update what the driver keeps in place)"
    );
    leading.shutdown().unwrap();
    following.shutdown().unwrap();
}

/// The negative control: the count does see what a driver-named thread
/// makes and something else keeps.
#[test]
fn the_count_sees_what_a_driver_leaves_behind() {
    let _one = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = live();
    let kept = tracking::strings_made_on(DRIVER, N);
    let left = live();
    assert!(left >= before + N, "{left} live allocations counted, {before} + {N} strings expected");
    drop(kept);
    assert!(live() + N <= left, "freeing them is counted too");
}
