//! The threaded elector on MemStore: the guard's life, shutdown, a hung
//! store, callbacks. Real time, so every wait is for a condition with a
//! deadline, never a fixed nap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{Config, ElectionError, Elector, ErrorKind, MemStore, Timing, WaitLeaderError};

mod threaded;
use threaded::{alone, alone_until_failing_ends_the_term, eventually, forward_calls, lead, ms, start, timing, NAME};

fn config(store: &MemStore, id: &str) -> Config {
    Config::new(store.clone(), NAME).identity(id).timing(timing())
}

#[test]
fn three_participants_elect_exactly_one() {
    let store = MemStore::new();
    let fleet: Vec<Elector> = ["a", "b", "c"].iter().map(|id| start(&store, id)).collect();
    assert!(eventually(Duration::from_secs(5), || fleet.iter().any(|e| e.is_leader())));
    let first = fleet.iter().find_map(|e| e.fence());
    // Watch for a while: never two at once.
    let until = Instant::now() + ms(1500);
    while Instant::now() < until {
        let leaders = fleet.iter().filter(|e| e.is_leader()).count();
        assert!(leaders <= 1, "{leaders} leaders at once");
    }
    let leader = fleet.iter().find(|e| e.is_leader()).expect("still one leader");
    assert_eq!(leader.fence(), first, "one term, renewed, never re-elected");
    let followers: Vec<_> = fleet.iter().filter(|e| !e.is_leader()).collect();
    assert_eq!(followers.len(), 2);
    for f in followers {
        assert!(eventually(Duration::from_secs(2), || {
            f.status().leader.is_some_and(|l| l.identity == leader.identity() && l.valid)
        }));
    }
}

#[test]
fn dropping_the_last_guard_resigns_and_hands_over_at_once() {
    let (store, a, guard) = alone();
    let fence = guard.fence();
    let copy = guard.clone();
    let b = start(&store, "b");
    drop(guard);
    assert!(copy.is_valid(), "a clone keeps the term");
    let dropped_at = Instant::now();
    drop(copy);
    let next = lead(&b);
    let handover = dropped_at.elapsed();
    // b polls every 200 ms +-20 %: well under a lease (1.5 s).
    assert!(handover < ms(700), "handover took {handover:?}");
    assert!(next.fence() > fence);
    assert!(!a.is_leader());
}

#[test]
fn a_guard_taken_right_after_the_last_drop_does_not_cancel_the_resignation() {
    let (store, a, first) = alone();
    let fence = first.fence();
    drop(first);
    // Whatever the renewal thread has processed yet, the dropped term is over.
    if let Some(g) = a.guard() {
        assert!(g.fence() > fence, "a guard of the resigned term was handed out");
    }
    assert!(eventually(Duration::from_secs(2), || store.stats().releases >= 1), "released");
}

#[test]
fn resign_reports_the_release_and_waits_before_campaigning_again() {
    let (store, a, guard) = alone();
    // The back-off runs from when the renewal thread takes the resignation,
    // which is after this instant and before resign() returns.
    let resigned_at = Instant::now();
    let fence = guard.fence();
    guard.resign().expect("release worked");
    assert!(store.peek(NAME).unwrap().expired(), "released on the server before resign returned");
    // Alone, a takes it back, but only after two retry periods.
    let again = lead(&a);
    assert!(resigned_at.elapsed() >= ms(400), "two retry periods: {:?}", resigned_at.elapsed());
    assert!(again.fence() > fence);
}

#[test]
fn a_resign_whose_release_is_cut_short_by_shutdown_is_not_reported_as_released() {
    let store = MemStore::new();
    let a = Arc::new(start(&store, "a"));
    let guard = lead(&a);
    store.pause(); // the release will hang
    let resigning = thread::spawn(move || guard.resign());
    assert!(eventually(ms(2000), || !a.is_leader()), "resign ends the term before its release is sent");
    a.shutdown_without_release();
    let result = resigning.join().unwrap();
    assert!(matches!(result, Err(ElectionError::Stopped)), "{result:?}");
    store.resume();
}

#[test]
fn resigning_a_term_that_already_ended_reports_nothing_to_release() {
    let (store, _a, guard) = alone_until_failing_ends_the_term(ErrorKind::Fatal);
    store.set_failing(None);
    assert!(guard.resign().is_ok(), "an ended term has nothing of ours to hand over");
}

#[test]
fn a_resign_with_every_call_thread_hung_fails_at_once_and_says_why() {
    // Calls abandoned at a 100 ms timeout pile up on a frozen store until all
    // four call threads are stuck (about 1 s), well before the 2.8 s deadline.
    let timing = Timing { operation_timeout: ms(100), lease_duration: ms(3000), ..timing() };
    let store = MemStore::new();
    let a = Elector::start(Config::new(store.clone(), NAME).identity("a").timing(timing)).unwrap();
    let guard = lead(&a);
    store.pause();
    let all_hung = eventually(ms(2000), || {
        a.status().last_error.is_some_and(|e| e.to_string().contains("still hung")) && guard.is_valid()
    });
    assert!(all_hung, "{:?}", a.status());
    let started = Instant::now();
    let result = guard.resign();
    assert!(started.elapsed() < ms(100), "no thread to wait on: {:?}", started.elapsed());
    let err = result.expect_err("the release could not even start");
    assert!(err.to_string().contains("hung"), "{err}");
    store.resume();
    let back = a.wait_leader_timeout(Duration::from_secs(5)).expect("leads again once the store answers");
    drop(back);
    a.shutdown().unwrap();
}

#[test]
fn a_process_never_overlaps_two_terms_in_user_code() {
    let (store, a, old) = alone();
    // The store fails for longer than the lease: the term ends locally.
    store.set_failing(Some(ErrorKind::Retryable));
    assert!(!old.wait_lost_timeout(Duration::from_secs(3)).timed_out());
    assert!(!old.is_valid());
    store.set_failing(None);
    // The lease is free again, but the old guard is still held: a watches
    // without campaigning. Wait until it has seen the free lease a few times.
    let inspects = store.stats().inspects;
    assert!(eventually(Duration::from_secs(5), || store.stats().inspects >= inspects + 3));
    assert!(!a.is_leader(), "no new term while a guard of the old one lives");
    assert_eq!(store.stats().acquires, 1, "no acquire while held back");
    let fence = old.fence();
    drop(old);
    let new = lead(&a);
    assert!(new.fence() > fence);
}

#[test]
fn shutdown_invalidates_then_releases_and_a_follower_takes_over() {
    let (store, a, guard) = alone();
    let b = start(&store, "b");
    let t0 = Instant::now();
    a.shutdown().expect("released");
    assert!(!guard.is_valid(), "invalid before shutdown returned");
    // Released: either still free, or already b's under a new fence.
    let row = store.peek(NAME).unwrap();
    assert!(!row.held_by("a"), "{row:?}");
    assert!(a.status().stopped);
    assert_eq!(a.wait_leader_timeout(ms(10)).unwrap_err(), WaitLeaderError::Stopped);
    let next = lead(&b);
    assert!(t0.elapsed() < ms(700), "clean handover took {:?}", t0.elapsed());
    assert!(next.fence() > guard.fence());
    // Idempotent.
    a.shutdown().unwrap();
}

#[test]
fn drop_of_the_elector_releases_too() {
    let (store, a, guard) = alone();
    drop(a);
    assert!(!guard.is_valid());
    assert!(store.peek(NAME).unwrap().expired());
}

#[test]
fn a_crashed_leader_is_replaced_after_the_lease() {
    let (store, a, guard) = alone();
    let b = start(&store, "b");
    assert!(eventually(Duration::from_secs(2), || b.status().leader.is_some()));
    let crashed = Instant::now();
    a.shutdown_without_release();
    assert!(!guard.is_valid());
    assert!(store.peek(NAME).unwrap().held_by(a.identity()), "lease left in place");
    let next = lead(&b);
    let failover = crashed.elapsed();
    assert!(failover <= ms(1500 + 500), "failover took {failover:?}");
    assert!(failover >= ms(500), "b cannot lead before the lease runs out: {failover:?}");
    assert!(next.fence() > guard.fence());
}

#[test]
fn a_hung_store_steps_the_leader_down_at_its_deadline() {
    let (store, a, guard) = alone();
    store.pause(); // every call from now on hangs, like a SIGSTOPped server
    let deadline = guard.valid_until();
    // The channel itself fires (the watchdog drops its sender at the deadline).
    let fired = guard.lost().recv_timeout(Duration::from_secs(5));
    assert!(matches!(fired, Err(crossbeam_channel::RecvTimeoutError::Disconnected)), "{fired:?}");
    let woke = Instant::now();
    assert!(!guard.is_valid());
    assert!(woke >= deadline, "not before the deadline");
    assert!(woke - deadline < ms(100), "watchdog {:?} late", woke - deadline);
    assert!(!a.is_leader());
    assert!(eventually(Duration::from_secs(1), || matches!(
        a.status().last_error,
        Some(
            ElectionError::LeaseExpiredLocally { .. }
                | ElectionError::Timeout { .. }
                | ElectionError::TooManyHungCalls { .. }
        )
    )));
    // Shutdown does not wait on the hung store either.
    let t0 = Instant::now();
    let result = a.shutdown();
    assert!(t0.elapsed() < ms(1000), "shutdown took {:?}", t0.elapsed());
    assert!(result.is_err(), "the release could not complete");
    store.resume();
}

#[test]
fn leadership_comes_back_after_the_store_recovers() {
    let (store, a, first) = alone();
    store.pause();
    first.wait_lost();
    let fence = first.fence();
    drop(first);
    thread::sleep(ms(800)); // stay paused past several abandoned calls (fault duration, not a wait for an outcome)
    store.resume();
    let second = lead(&a);
    assert!(second.fence() > fence, "a fresh fence after a local step-down");
}

#[test]
fn database_clock_days_away_changes_nothing() {
    for offset_days in [-3i64, 3] {
        let store = MemStore::new();
        store.set_offset(offset_days * 86_400_000_000);
        let a = start(&store, "a");
        let guard = lead(&a);
        let left = guard.valid_until().saturating_duration_since(Instant::now());
        assert!(left > ms(900) && left <= ms(1300), "{left:?}");
        // It renews and stays valid throughout, well past the first lease.
        let until = Instant::now() + ms(1600);
        while Instant::now() < until {
            assert!(guard.is_valid());
            thread::sleep(ms(5));
        }
        assert_eq!(store.peek(NAME).unwrap().fence, guard.fence(), "still the first term");
    }
}

#[test]
fn a_fatal_error_is_reported_and_nobody_leads() {
    let store = MemStore::new();
    store.set_failing(Some(ErrorKind::Fatal));
    let a = start(&store, "a");
    assert!(eventually(Duration::from_secs(2), || a.status().last_error.is_some_and(|e| e.is_fatal())));
    assert_eq!(a.wait_leader_timeout(ms(500)).unwrap_err(), WaitLeaderError::Timeout);
    store.set_failing(None);
    lead(&a);
    assert!(a.status().last_error.is_none(), "cleared by success");
}

#[test]
fn callbacks_run_in_order_on_their_own_threads() {
    let store = MemStore::new();
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let (e1, e2, e3) = (events.clone(), events.clone(), events.clone());
    let on_own_thread = Arc::new(AtomicBool::new(false));
    let flag = on_own_thread.clone();
    let a = Elector::start(
        config(&store, "a")
            .on_new_leader(move |id, fence| e1.lock().unwrap().push(format!("new {id} {fence}")))
            .on_started_leading(move |guard| {
                flag.store(thread::current().name() == Some("leaderelection-leading"), Ordering::SeqCst);
                e2.lock().unwrap().push(format!("started {}", guard.fence()));
                guard.wait_lost();
                e2.lock().unwrap().push("returning".into());
            })
            .on_stopped_leading(move || e3.lock().unwrap().push("stopped".into())),
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(5), || events.lock().unwrap().len() >= 2));
    a.shutdown().unwrap();
    let got = events.lock().unwrap().clone();
    let f = store.peek(NAME).unwrap().fence;
    let a = a.identity();
    assert_eq!(got, [format!("new {a} {f}"), format!("started {f}"), "returning".into(), "stopped".into()]);
    assert!(on_own_thread.load(Ordering::SeqCst));
}

#[test]
fn only_an_on_new_leader_callback_does_not_resign_terms() {
    let store = MemStore::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let a = Elector::start(config(&store, "a").on_new_leader(move |id, f| s.lock().unwrap().push((id.to_owned(), f))))
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || a.is_leader()));
    let f = a.fence().expect("leading");
    // It keeps its one term across several renewals.
    let until = Instant::now() + ms(1000);
    while Instant::now() < until {
        assert_eq!(a.fence(), Some(f));
        thread::sleep(ms(5));
    }
    assert_eq!(store.stats().releases, 0);
    assert_eq!(*seen.lock().unwrap(), [(a.identity().to_owned(), f)]);
}

#[test]
fn a_callback_that_returns_early_resigns_the_term() {
    let store = MemStore::new();
    let a = Elector::start(config(&store, "a").on_started_leading(|_guard| {})).unwrap();
    // Let a lead (and resign) once before b joins, so b cannot win the first term.
    assert!(eventually(Duration::from_secs(5), || store.stats().releases >= 1));
    let before = store.peek(NAME).unwrap().fence;
    let b = start(&store, "b");
    // a's callback returns at once, every term: b must get to lead too.
    let guard = lead(&b);
    assert!(guard.fence() > before);
    assert!(store.stats().releases >= 1);
    drop(a);
}

#[test]
fn followers_read_the_leaders_payload() {
    let store = MemStore::new();
    let a = Elector::start(config(&store, "a").payload(b"https://a.internal:8443".to_vec())).unwrap();
    let _g = lead(&a);
    let b = start(&store, "b");
    assert!(eventually(Duration::from_secs(2), || {
        b.status().leader.is_some_and(|l| {
            leaderelection::base_identity(&l.identity) == "a" && l.payload == b"https://a.internal:8443"
        })
    }));
}

#[test]
fn status_of_a_leader() {
    let (_store, a, g) = alone();
    let st = a.status();
    assert!(st.is_leader);
    assert_eq!(st.fence, Some(g.fence()));
    assert_eq!(leaderelection::base_identity(&st.identity), "a");
    assert!(st.identity.starts_with("a#") && st.identity.len() == 18, "{}", st.identity);
    let until = st.valid_until.unwrap();
    assert!(until > Instant::now());
    assert!(a.guard().is_some());
}

#[test]
fn a_bad_config_is_refused_with_the_field_named() {
    let err = Elector::start(Config::new(MemStore::new(), "")).unwrap_err();
    assert_eq!(err.to_string(), "cannot start: invalid config: name: must not be empty");
    let err = Elector::start(Config::new(MemStore::new(), "x").renew_interval(Duration::from_secs(60))).unwrap_err();
    assert!(err.to_string().contains("renew_interval"), "{err}");
}

#[test]
fn host_and_pid_are_the_identity_when_none_is_set() {
    let a = Elector::start(Config::new(MemStore::new(), "x")).unwrap();
    let pid = format!("-{}#", std::process::id());
    assert!(a.identity().contains(&pid), "{}", a.identity());
}

/// One elector's view of a store that drops the instance tag from every
/// identity, as the row's holder was before electors had one: the negative
/// control of the test below. Rows it reads back name that elector (once
/// it knows its identity) wherever they name the bare identity.
struct OneHolderPerName {
    inner: MemStore,
    me: std::sync::OnceLock<String>,
}

impl OneHolderPerName {
    fn back(&self, mut l: leaderelection::Lease) -> leaderelection::Lease {
        if let Some(me) = self.me.get() {
            if l.holder == leaderelection::base_identity(me) {
                l.holder = me.clone();
            }
        }
        l
    }
}

impl leaderelection::Store for OneHolderPerName {
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
        let _ = self.me.set(identity.to_owned());
        self.inner.acquire(name, leaderelection::base_identity(identity), ttl, payload, timeout).map(|l| self.back(l))
    }
    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
        let l = self.inner.renew(name, leaderelection::base_identity(identity), fence, ttl, payload, timeout)?;
        Ok(self.back(l))
    }
    fn release(
        &self, name: &str, identity: &str, fence: u64, timeout: Duration,
    ) -> Result<(), leaderelection::StoreError> {
        self.inner.release(name, leaderelection::base_identity(identity), fence, timeout)
    }
    fn inspect(&self, name: &str, timeout: Duration) -> Result<leaderelection::Lease, leaderelection::StoreError> {
        self.inner.inspect(name, timeout).map(|l| self.back(l))
    }
}

/// How long two electors were both leading while `pair` was sampled every
/// millisecond for `within`.
fn both_leading(pair: &[Elector; 2], within: Duration) -> usize {
    let until = Instant::now() + within;
    let mut both = 0;
    while Instant::now() < until {
        both += usize::from(pair.iter().all(Elector::is_leader));
        thread::sleep(ms(1));
    }
    both
}

/// Two electors given one identity (two processes started with the same
/// `--identity`, a cron job overlapping its own previous run) are two
/// participants: each adds an instance tag, so the second's claim is not
/// the holder renewing, and they never both lead. The negative control: a
/// store that drops the tags, as the row's holder was before, lets both
/// lead on one fence, and the sampler sees it.
#[test]
fn two_electors_with_one_identity_never_both_lead() {
    let store = MemStore::new();
    let pair = [start(&store, "web"), start(&store, "web")];
    assert_ne!(pair[0].identity(), pair[1].identity());
    assert!(eventually(Duration::from_secs(5), || pair.iter().any(Elector::is_leader)));
    assert_eq!(both_leading(&pair, ms(1500)), 0, "two electors named web led at once");
    let leader = pair.iter().position(Elector::is_leader).expect("one leads");
    let other = &pair[1 - leader];
    assert!(eventually(Duration::from_secs(2), || {
        other.status().leader.is_some_and(|l| l.identity == pair[leader].identity() && l.valid)
    }));
    let fence = pair[leader].fence().unwrap();
    pair[leader].shutdown_without_release();
    let g = other.wait_leader_timeout(Duration::from_secs(5)).expect("the other takes over after the lease");
    assert!(g.fence() > fence);

    let shared = MemStore::new();
    let control = [0, 1].map(|_| {
        let untagged = std::sync::Arc::new(OneHolderPerName { inner: shared.clone(), me: Default::default() });
        let e = Elector::start(Config::new(std::sync::Arc::clone(&untagged), NAME).identity("web").timing(timing()))
            .unwrap();
        let _ = untagged.me.set(e.identity().to_owned());
        e
    });
    assert!(both_leading(&control, ms(1500)) > 0, "the negative control never saw two leaders");
}

#[test]
fn debug_output_shows_no_payload_bytes() {
    let store = MemStore::new();
    let config = config(&store, "a").payload(b"secret-bearer-token".to_vec());
    assert!(!format!("{config:?}").contains("secret"), "{config:?}");
    let a = Elector::start(config).unwrap();
    let _g = lead(&a);
    let status = format!("{:?} {:?} {:?}", a.status(), a, store.peek(NAME));
    assert!(!status.contains("secret"), "{status}");
    assert!(status.contains("payload_len: 19"), "{status}");
}

/// A MemStore whose renewals take `hold` inside the store, like a renewal
/// waiting on the server, and that records whether a release ever came in
/// while a renewal was still inside: a renewal that commits after the release
/// extends the released lease (on PostgreSQL it can carry an older `now()`
/// than the release), and the successor waits a whole lease.
struct SlowRenewals {
    inner: MemStore,
    hold: Duration,
    renewing: std::sync::atomic::AtomicUsize,
    entered: crossbeam_channel::Sender<()>,
    overlapped: AtomicBool,
}

impl leaderelection::Store for SlowRenewals {
    forward_calls!(inner => acquire, inspect);

    fn renew(
        &self, name: &str, id: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<leaderelection::Lease, leaderelection::StoreError> {
        self.renewing.fetch_add(1, Ordering::SeqCst);
        let _ = self.entered.try_send(());
        thread::sleep(self.hold); // the store's own latency, not a wait for an outcome
        let result = self.inner.renew(name, id, fence, ttl, payload, timeout);
        self.renewing.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn release(&self, name: &str, id: &str, fence: u64, timeout: Duration) -> Result<(), leaderelection::StoreError> {
        if self.renewing.load(Ordering::SeqCst) > 0 {
            self.overlapped.store(true, Ordering::SeqCst);
        }
        self.inner.release(name, id, fence, timeout)
    }
}

#[test]
fn shutdown_releases_only_after_the_renewal_in_flight_has_returned() {
    // Renewals spend 250 ms of the 300 ms operation timeout in the store; the
    // shutdown must come while one is inside, which a loaded machine may
    // miss, so up to five tries, each counted only when it caught one.
    for attempt in 1..=5 {
        let (entered, renewals) = crossbeam_channel::bounded(1);
        let store = Arc::new(SlowRenewals {
            inner: MemStore::new(),
            hold: ms(250),
            renewing: Default::default(),
            entered,
            overlapped: AtomicBool::new(false),
        });
        let a = Elector::start(Config::new(Arc::clone(&store), NAME).identity("a").timing(timing())).unwrap();
        let guard = lead(&a);
        renewals.recv_timeout(Duration::from_secs(5)).expect("a renewal within the renew interval");
        let caught = store.renewing.load(Ordering::SeqCst) > 0;
        let t0 = Instant::now();
        let result = a.shutdown();
        let took = t0.elapsed();
        assert!(!guard.is_valid());
        assert!(!store.overlapped.load(Ordering::SeqCst), "the release went out while a renewal was in the store");
        result.expect("released");
        let row = store.inner.peek(NAME).unwrap();
        assert!(row.expired(), "released after the renewal returned: {row:?}");
        assert!(took < ms(2 * 300 + 200), "at most about two operation timeouts: {took:?}");
        if caught {
            return;
        }
        eprintln!("attempt {attempt}: the renewal had returned before shutdown began; again");
    }
    panic!("in five tries the shutdown never began while a renewal was in the store");
}
