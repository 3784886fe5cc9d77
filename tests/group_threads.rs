//! A group's threads do not grow with its elections (issue 20): 2,000
//! elections on MemStore run on the group's driver, watchdog and at most
//! two store-call workers. Its own test binary, so no other test's
//! threads are counted.

use std::time::Duration;

use leaderelection::{Config, Group, GroupConfig, MemStore, MAX_GROUP_CALL_THREADS};

mod threaded;
use threaded::{eventually, timing};

/// The threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

/// The names of this process's threads that start with `prefix`.
fn named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn two_thousand_elections_run_on_a_bounded_number_of_threads() {
    let before = threads();
    let store = MemStore::new();
    let group = Group::start(GroupConfig::new(Config::new(store.clone(), "g").identity("a").timing(timing()))).unwrap();
    let shards: Vec<_> = (0..2_000).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    assert!(eventually(Duration::from_secs(20), || group.status().leading == 2_000), "{:?}", group.status());
    // Let it renew a few intervals, then count.
    assert!(eventually(Duration::from_secs(5), || store.stats().renews >= 3 * 2_000));
    let ours = named("leaderelection");
    let added = threads() - before;
    // The driver, the watchdog, the call workers (comm is 15 bytes long:
    // "leaderelection-" covers every name).
    assert!(ours.len() <= 2 + MAX_GROUP_CALL_THREADS, "{ours:?}");
    assert_eq!(added, ours.len(), "threads other than the group's appeared: {ours:?}");
    assert!(shards.iter().all(|e| e.is_leader()));
    group.shutdown().unwrap();
    // The workers end once their channel closes; the driver and watchdog
    // are joined.
    assert!(eventually(Duration::from_secs(5), || named("leaderelection").is_empty()), "{:?}", named("leaderelection"));
}
