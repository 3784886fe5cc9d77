//! The threaded group on MemStore where its store calls hang or its
//! callbacks panic: what its status says and that it runs on. Real time,
//! so every wait is for a condition with a deadline, never a fixed nap.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderelection::{
    Config, Group, GroupConfig, LeaderGuard, Lease, MemStore, Members, Store, StoreError, Timing,
    MAX_GROUP_CALL_THREADS,
};

mod threaded;
use threaded::{eventually, timing};

const FIVE: Duration = Duration::from_secs(5);

fn config(store: &MemStore, id: &str) -> GroupConfig {
    GroupConfig::new(Config::new(store.clone(), "cov-shards").identity(id).timing(timing()))
}

/// A member whose store hangs: once every call worker is stuck, the calls
/// due next (renewals with the heartbeat, heartbeats alone, looks) are not
/// started; they fail at once, the status says why, and the terms end at
/// their deadlines. When the store answers again the member counts itself
/// in and leads again.
#[test]
fn a_hung_store_refuses_calls_once_every_worker_is_stuck_and_the_status_says_so() {
    let store = MemStore::new();
    let group = Group::start(config(&store, "a").fair_share(true)).unwrap();
    let shards: Vec<_> = (0..3).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
    assert!(eventually(FIVE, || group.status().live_members == Some(1)), "{:?}", group.status());

    store.pause();
    let refused = || {
        let st = group.status();
        st.call_threads == MAX_GROUP_CALL_THREADS
            && st.last_error.as_ref().is_some_and(|e| {
                e.is_retryable()
                    && e.message()
                        == format!("{MAX_GROUP_CALL_THREADS} store calls are still hung; not starting another")
            })
    };
    assert!(eventually(FIVE, refused), "{:?}", group.status());
    assert!(eventually(FIVE, || shards.iter().all(|e| !e.is_leader())), "terms end at their deadlines");
    assert!(!group.status().stopped, "the group runs on");

    store.resume();
    assert!(eventually(FIVE, || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
    assert!(eventually(FIVE, || group.status().last_error.is_none()), "{:?}", group.status());
    assert_eq!(group.status().live_members, Some(1));
    group.shutdown().unwrap();
}

/// Group callbacks that panic are each caught: the callback thread goes on
/// to the next event, so every election's start is still told, and the
/// group runs and shuts down as usual.
#[test]
fn a_group_callback_that_panics_stops_none_of_the_others() {
    let store = MemStore::new();
    // Each term's guard is kept (dropping it would resign the term).
    let started: Arc<Mutex<Vec<(String, LeaderGuard)>>> = Arc::default();
    let seen = Arc::clone(&started);
    let group = Group::start(
        config(&store, "a")
            .on_new_leader(|name, _, _| panic!("on_new_leader of {name} panicked (on purpose)"))
            .on_stopped_leading(|name| panic!("on_stopped_leading of {name} panicked (on purpose)"))
            .on_started_leading(move |name, guard| seen.lock().unwrap().push((name.to_owned(), guard))),
    )
    .unwrap();
    let shards: Vec<_> = (0..3).map(|i| group.join(&format!("shard-{i}")).unwrap()).collect();
    let count = || started.lock().unwrap().len();
    assert!(eventually(FIVE, || count() == 3), "{count} starts told", count = count());
    let mut names: Vec<String> = started.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(names, ["shard-0", "shard-1", "shard-2"]);
    // A term ends (its stopped callback panics); the next starts and is told.
    let first = {
        let mut terms = started.lock().unwrap();
        let i = terms.iter().position(|(n, _)| n == "shard-0").unwrap();
        terms.remove(i).1
    };
    let fence = first.fence();
    first.resign().unwrap();
    assert!(eventually(FIVE, || count() == 3), "{count} starts told", count = count());
    let next = started.lock().unwrap().iter().find(|(n, _)| n == "shard-0").map(|(_, g)| g.fence());
    assert!(next.is_some_and(|f| f > fence), "{next:?} after {fence}");
    assert!(shards.iter().all(|e| e.is_leader()));
    assert!(!group.status().stopped);
    group.shutdown().unwrap();
}

/// An election joined with a payload of its own publishes that one, not
/// the group's: the store's row and another member's view show it.
#[test]
fn an_election_joined_with_its_own_payload_publishes_it() {
    let store = MemStore::new();
    let template =
        Config::new(store.clone(), "cov-payloads").identity("a").timing(timing()).payload(b"group-wide".to_vec());
    let a = Group::start(GroupConfig::new(template)).unwrap();
    let own = a.join_with_payload("cov-own", b"10.0.0.7:8080".to_vec()).unwrap();
    let plain = a.join("cov-plain").unwrap();
    assert!(eventually(FIVE, || own.is_leader() && plain.is_leader()), "{:?}", a.status());
    assert_eq!(store.peek("cov-own").unwrap().payload, b"10.0.0.7:8080");
    assert_eq!(store.peek("cov-plain").unwrap().payload, b"group-wide");
    let b = Group::start(config(&store, "b")).unwrap();
    let seen = b.join("cov-own").unwrap();
    let payload = || seen.status().leader.filter(|l| l.valid).map(|l| l.payload);
    assert!(eventually(FIVE, || payload().is_some()), "{}", seen.status());
    assert_eq!(payload().unwrap(), b"10.0.0.7:8080");
    b.shutdown().unwrap();
    a.shutdown().unwrap();
}

/// A MemStore whose `leave_group` tells `entered`, then waits for `open`
/// (at most 10 s).
struct SlowLeave {
    inner: MemStore,
    entered: Mutex<std::sync::mpsc::Sender<()>>,
    open: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Store for SlowLeave {
    fn acquire(&self, n: &str, id: &str, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.inner.acquire(n, id, ttl, p, t)
    }
    fn renew(&self, n: &str, id: &str, f: u64, ttl: Duration, p: &[u8], t: Duration) -> Result<Lease, StoreError> {
        self.inner.renew(n, id, f, ttl, p, t)
    }
    fn release(&self, n: &str, id: &str, f: u64, t: Duration) -> Result<(), StoreError> {
        self.inner.release(n, id, f, t)
    }
    fn inspect(&self, n: &str, t: Duration) -> Result<Lease, StoreError> {
        self.inner.inspect(n, t)
    }
    fn heartbeat(&self, g: &str, m: &str, leading: u32, ttl: Duration, t: Duration) -> Result<Members, StoreError> {
        self.inner.heartbeat(g, m, leading, ttl, t)
    }
    fn leave_group(&self, g: &str, m: &str, t: Duration) -> Result<(), StoreError> {
        let _ = self.entered.lock().unwrap().send(());
        let _ = self.open.lock().unwrap().recv_timeout(Duration::from_secs(10));
        self.inner.leave_group(g, m, t)
    }
}

/// An election whose group is shutting down has been ended and released
/// with the others: leaving it then answers at once, while the group
/// still waits for its own leave, and the shutdown ends as usual.
#[test]
fn leaving_an_election_the_shutdown_already_ended_answers_at_once() {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (open, open_rx) = std::sync::mpsc::channel();
    let inner = MemStore::new();
    let store = SlowLeave { inner: inner.clone(), entered: Mutex::new(entered_tx), open: Mutex::new(open_rx) };
    let ms = Duration::from_millis;
    // A long operation timeout: the group waits that long for its leave.
    let t = Timing {
        lease_duration: ms(7_000),
        renew_interval: ms(1_000),
        retry_period: ms(500),
        operation_timeout: ms(2_000),
        safety_margin: ms(500),
    };
    let group =
        Group::start(GroupConfig::new(Config::new(store, "cov-leave").identity("a").timing(t)).fair_share(true))
            .unwrap();
    let x = group.join("cov-leave-x").unwrap();
    assert!(eventually(Duration::from_secs(10), || x.is_leader()), "{:?}", group.status());
    assert!(eventually(FIVE, || group.status().live_members == Some(1)), "{:?}", group.status());
    std::thread::scope(|scope| {
        let shutdown = scope.spawn(|| group.shutdown());
        entered.recv_timeout(FIVE).expect("the group's leave reached the store");
        assert!(eventually(FIVE, || x.status().stopped), "{}", x.status());
        assert!(inner.peek("cov-leave-x").unwrap().expired(), "released with the others");
        let asked = std::time::Instant::now();
        assert!(x.leave().is_ok());
        assert!(asked.elapsed() < ms(1_000), "the leave waited {:?}", asked.elapsed());
        open.send(()).unwrap();
        assert!(shutdown.join().unwrap().is_ok());
    });
}
