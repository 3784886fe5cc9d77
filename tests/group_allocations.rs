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

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use leaderelection::{Config, Group, GroupConfig, MemStore};
use threaded::{eventually, timing};

/// The system allocator, recording the address of every allocation made on
/// a group's driver thread while [`TRACKING`] is on, and forgetting it when
/// it is freed (on any thread).
struct Tracking;

#[global_allocator]
static ALLOC: Tracking = Tracking;

static TRACKING: AtomicBool = AtomicBool::new(false);
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
/// One test at a time: the count is the process's.
static SERIAL: Mutex<()> = Mutex::new(());
const DRIVER: &str = "leaderelection-group";

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// 0 not known yet, 1 a driver, 2 another thread.
    static DRIVER_THREAD: Cell<u8> = const { Cell::new(0) };
}

fn on_driver() -> bool {
    match DRIVER_THREAD.with(Cell::get) {
        1 => true,
        2 => false,
        _ => {
            let yes = std::thread::current().name() == Some(DRIVER);
            DRIVER_THREAD.with(|c| c.set(if yes { 1 } else { 2 }));
            yes
        }
    }
}

fn hook(f: impl FnOnce()) {
    if IN_HOOK.try_with(|h| h.replace(true)) == Ok(false) {
        f();
        IN_HOOK.with(|h| h.set(false));
    }
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && TRACKING.load(Ordering::Relaxed) {
            hook(|| {
                if on_driver() {
                    if let Ok(mut live) = LIVE.lock() {
                        live.get_or_insert_with(HashSet::new).insert(p as usize);
                    }
                }
            });
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        hook(|| {
            if let Ok(mut live) = LIVE.lock() {
                if let Some(set) = live.as_mut() {
                    set.remove(&(p as usize));
                }
            }
        });
        // SAFETY: as the caller promised for `p` and `layout`.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised; the new block is recorded like an
        // allocation, the old one forgotten like a free.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            hook(|| {
                if let Ok(mut live) = LIVE.lock() {
                    let set = live.get_or_insert_with(HashSet::new);
                    let was = set.remove(&(p as usize));
                    if was || (TRACKING.load(Ordering::Relaxed) && on_driver()) {
                        set.insert(q as usize);
                    }
                }
            });
        }
        q
    }
}

fn live() -> usize {
    LIVE.lock().unwrap().as_ref().map_or(0, HashSet::len)
}

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

    TRACKING.store(true, Ordering::SeqCst);
    let s1 = store.stats();
    let enough = eventually(Duration::from_secs(30), || {
        let s = store.stats();
        s.renews >= s1.renews + 10 * N as u64 && s.inspects >= s1.inspects + 10 * N as u64
    });
    TRACKING.store(false, Ordering::SeqCst);
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
    TRACKING.store(true, Ordering::SeqCst);
    let kept: Vec<String> = std::thread::Builder::new()
        .name(DRIVER.into())
        .spawn(|| (0..N).map(|i| format!("left behind {i}")).collect())
        .unwrap()
        .join()
        .unwrap();
    TRACKING.store(false, Ordering::SeqCst);
    let left = live();
    assert!(left >= before + N, "{left} live allocations counted, {before} + {N} strings expected");
    drop(kept);
    assert!(live() + N <= left, "freeing them is counted too");
}
