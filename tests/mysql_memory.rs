//! What a MySQL store's batch call leaves behind in the memory of the
//! thread it ran on.
//!
//! Each call runs on a thread of its own, and with glibc's allocator a
//! thread's allocations come from that thread's arena. Answers the caller
//! keeps (a group keeps every election's last lease for seconds) must not
//! be made of the call thread's allocations: sprinkled among a batch's
//! large short-lived buffers they pinned those arenas' pages, and a
//! process running 10,000 elections on MariaDB grew by about 0.2 MiB a
//! second without bound (BENCHMARKS.md, row 8). This binary counts, with
//! an allocator of its own, the allocations made on the store's call
//! threads that are still live once the calls have returned and their
//! threads have ended, while the test holds every lease they answered.
//! Against the shared MariaDB; run with `bash scripts/test.sh`.

mod mysql_support;
mod support;
mod tracking;

use std::time::{Duration, Instant};

use leaderelection::mysql::MySqlStore;
use leaderelection::{BatchItem, Lease, Store};
use mysql_support::{url, SHARED};
use support::random_tag;
use tracking::{live, Tracking, SERIAL};

#[global_allocator]
static ALLOC: Tracking = Tracking { thread: "le-mysql-call" };

const N: usize = 300;
const T: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);

/// Runs the store's batch calls once: claims (on a first round), renewals
/// and inspections of all `names`; every lease they answered.
fn calls(store: &MySqlStore, names: &[String], fences: &mut Vec<u64>) -> Vec<Lease> {
    let mut kept = Vec::new();
    let items = |fences: &[u64]| -> Vec<BatchItem<'_>> {
        names
            .iter()
            .enumerate()
            .map(|(k, n)| BatchItem { name: n, fence: fences.get(k).copied().unwrap_or(0), payload: b"p" })
            .collect()
    };
    if fences.is_empty() {
        for r in store.acquire_many("me", TTL, &items(&[]), T) {
            let lease = r.unwrap_or_else(|e| panic!("claim: {e}"));
            fences.push(lease.fence);
            kept.push(lease);
        }
    }
    for r in store.renew_many("me", TTL, &items(fences), T) {
        kept.push(r.unwrap_or_else(|e| panic!("renewal: {e}")));
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for r in store.inspect_many(&refs, T) {
        kept.push(r.unwrap_or_else(|e| panic!("inspection: {e}")));
    }
    kept
}

#[test]
fn leases_a_batch_answers_are_not_made_on_its_call_thread() {
    let _one = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let store = MySqlStore::builder(&url(SHARED)).table("le_memtest").build().expect("store");
    store.ensure_schema().unwrap_or_else(|e| panic!("ensure_schema: {e}"));
    let tag = random_tag();
    let names: Vec<String> = (0..N).map(|i| format!("mem-{tag}-{i:04}")).collect();
    let mut fences = Vec::new();
    // A first round opens the pool's connections and reads the server's
    // limits: long-lived, and made on call threads as they should be.
    let first = calls(&store, &names, &mut fences);
    assert_eq!(first.len(), 3 * N);

    tracking::start();
    let kept: Vec<Lease> = (0..3).flat_map(|_| calls(&store, &names, &mut fences)).collect();
    tracking::stop();
    assert_eq!(kept.len(), 6 * N, "every renewal and inspection answered");

    // A call thread ends after handing its answer over: wait until what it
    // held is gone, while the leases are still held here.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = live();
    while left >= N / 10 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = live();
    }
    eprintln!("call-thread allocations still live: {left} (while holding {} leases)", kept.len());
    assert!(
        left < N / 10,
        "{left} allocations made on the store's call threads are still live while {} answered leases are held \
         (each lease's name and holder should be the caller's own)",
        kept.len()
    );
    drop(kept);
}

/// The negative control: the allocator does see what a call thread makes
/// and something else keeps.
#[test]
fn the_count_sees_what_a_call_thread_leaves_behind() {
    let _one = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept = tracking::strings_made_on("le-mysql-call", N);
    let left = live();
    assert!(left > N, "{left} live allocations counted, {N} strings and their vector expected");
    drop(kept);
    assert!(live() < left - N, "freeing them is counted too");
}
