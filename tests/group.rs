//! The threaded group on MemStore: many elections per participant, the
//! single elector's API per election, joining and leaving, the fair share,
//! a hung store, shutdown. Real time, so every wait is for a condition
//! with a deadline, never a fixed nap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leaderelection::{Config, Election, Group, GroupConfig, JoinError, LeaderGuard, MemStore, WaitLeaderError};

mod threaded;
use threaded::{eventually, ms, timing};

const GROUP: &str = "shards";

fn config(store: &MemStore, id: &str) -> GroupConfig {
    GroupConfig::new(Config::new(store.clone(), GROUP).identity(id).timing(timing()))
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("shard-{i:03}")).collect()
}

fn join_all(g: &Group, names: &[String]) -> Vec<Election> {
    names.iter().map(|n| g.join(n).expect("join")).collect()
}

/// A fresh store with participant "a" alone on it, joined to `n`
/// elections: the store, the group and its handles.
fn alone(n: usize) -> (MemStore, Group, Vec<Election>) {
    let store = MemStore::new();
    let group = Group::start(config(&store, "a")).unwrap();
    let shards = join_all(&group, &names(n));
    (store, group, shards)
}

fn lead(e: &Election) -> LeaderGuard {
    e.wait_leader_timeout(Duration::from_secs(5)).unwrap_or_else(|err| panic!("{} never led: {err}", e.name()))
}

/// Watches `fleets` (each participant's handles, in the same order of
/// elections) for `d`: never two valid leaders of one election.
fn never_two(fleets: &[&[Election]], d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for i in 0..fleets[0].len() {
            let leaders = fleets.iter().filter(|f| f[i].is_leader()).count();
            assert!(leaders <= 1, "{}: {leaders} leaders at once", fleets[0][i].name());
        }
    }
}

#[test]
fn one_participant_leads_every_election_with_the_electors_api() {
    let (store, group, shards) = alone(40);
    for e in &shards {
        let guard = lead(e);
        assert!(guard.is_valid() && e.is_leader());
        assert_eq!(e.fence(), Some(guard.fence()));
        assert_eq!(store.peek(e.name()).unwrap().fence, guard.fence(), "the fence the database gave");
        assert!(e.guard().is_some());
        let st = e.status();
        assert!(st.is_leader && st.identity == group.identity() && st.name == e.name(), "{st}");
        drop(guard); // resigns this election's term
    }
    assert!(
        eventually(Duration::from_secs(5), || shards.iter().all(|e| e.is_leader())),
        "each resigned election is led again after the back-off"
    );
    let st = group.status();
    assert_eq!((st.elections, st.leading), (40, 40), "{st:?}");
    assert!(st.identity.starts_with("a#"));
    assert!(st.call_threads <= leaderelection::MAX_GROUP_CALL_THREADS);
    group.shutdown().unwrap();
    for e in &shards {
        assert!(store.peek(e.name()).unwrap().expired(), "{} was not released at shutdown", e.name());
    }
    assert!(shards.iter().all(|e| !e.is_leader()));
    assert_eq!(shards[0].wait_leader_timeout(ms(10)).unwrap_err(), WaitLeaderError::Stopped);
    assert!(group.status().stopped);
}

// Renewals go out as one batch per renew interval, whatever the number of
// elections: the store sees about one renewal batch per interval.
#[test]
fn a_hundred_terms_are_renewed_by_about_one_call_per_interval() {
    let (store, _group, shards) = alone(100);
    assert!(eventually(Duration::from_secs(5), || shards.iter().all(|e| e.is_leader())));
    let before = store.stats();
    let watch = ms(3_000);
    let t0 = Instant::now();
    while t0.elapsed() < watch {
        assert!(shards.iter().all(|e| e.is_leader()), "a term ended in steady state");
    }
    let after = store.stats();
    let (batches, renewals) = (after.batches - before.batches, after.renews - before.renews);
    let intervals = watch.as_millis() as u64 / timing().renew_interval.as_millis() as u64;
    assert!(renewals >= 100 * (intervals - 1), "{renewals} renewals in {intervals} intervals");
    assert!(batches <= intervals + 2, "{batches} batched calls in {intervals} renew intervals for 100 terms");
    assert_eq!(after.acquires, before.acquires, "no claims in steady state");
}

#[test]
fn two_participants_never_both_lead_an_election_and_share_them_fairly() {
    let store = MemStore::new();
    let all = names(30);
    let a = Group::start(config(&store, "a").fair_share(true)).unwrap();
    let b = Group::start(config(&store, "b").fair_share(true)).unwrap();
    let fa = join_all(&a, &all);
    let fb = join_all(&b, &all);
    let both_lead_share = || {
        let (sa, sb) = (a.status(), b.status());
        let counted = sa.live_members == Some(2) && sb.live_members == Some(2);
        let (la, lb) = (sa.leading, sb.leading);
        counted
            && la + lb == 30
            && la <= 15
            && lb <= 15
            && fa.iter().zip(&fb).all(|(x, y)| x.is_leader() || y.is_leader())
    };
    assert!(eventually(Duration::from_secs(10), both_lead_share), "a {:?} b {:?}", a.status(), b.status());
    never_two(&[&fa, &fb], ms(1_500));
    // a leaves the group: b takes every election over.
    a.shutdown().unwrap();
    assert!(eventually(Duration::from_secs(5), || fb.iter().all(|e| e.is_leader())), "b took over: {:?}", b.status());
    assert_eq!(b.status().live_members, Some(1));
}

#[test]
fn joining_and_leaving_at_run_time() {
    let store = MemStore::new();
    let a = Group::start(config(&store, "a")).unwrap();
    let b = Group::start(config(&store, "b")).unwrap();
    let x = a.join("x").unwrap();
    // Held until a leaves: dropping the last guard resigns, and b, joining
    // meanwhile, could then lead before the assertion below (seen once on a
    // loaded CI run).
    let held = lead(&x);
    let fence = held.fence();
    assert!(matches!(a.join("x"), Err(JoinError::Duplicate(n)) if n == "x"));
    let bx = b.join("x").unwrap();
    assert!(!bx.is_leader());
    // a leaves x: the lease is released and b takes it at its next look.
    let left = Instant::now();
    x.leave().unwrap();
    drop(held);
    assert!(x.leave().is_ok(), "leaving again does nothing");
    assert_eq!(x.wait_leader_timeout(ms(10)).unwrap_err(), WaitLeaderError::Stopped);
    let next = lead(&bx);
    assert!(next.fence() > fence);
    assert!(left.elapsed() < ms(1_500), "handed over after {:?}", left.elapsed());
    // The name is free again in a.
    let again = a.join("x").unwrap();
    assert!(!again.is_leader());
    drop(next);
    drop(bx); // leaves b's x: a leads it again
    lead(&again);
    assert_eq!(a.status().elections, 1);
    a.shutdown().unwrap();
    assert!(matches!(a.join("y"), Err(JoinError::Stopped)));
}

#[test]
fn a_hung_store_ends_every_term_at_its_deadline_and_leading_resumes_after() {
    let (store, group, shards) = alone(20);
    let guards: Vec<LeaderGuard> = shards.iter().map(lead).collect();
    store.pause();
    let paused = Instant::now();
    // Every term ends by its local deadline: no later than a lease after
    // the pause began (the last renewal was sent before it).
    for g in &guards {
        g.wait_lost_timeout(timing().lease_duration + ms(200));
        assert!(!g.is_valid());
    }
    let took = paused.elapsed();
    assert!(took <= timing().lease_duration + ms(100), "terms outlived the lease by {took:?}");
    // The driver hears of the watchdog's end a moment later. The last
    // error then moves on to the looks that cannot start either.
    let expired = |e: &Election| {
        let st = e.status();
        st.terms_ended.expired == 1 && st.terms_ended.total() == 1 && st.last_error.is_some()
    };
    assert!(eventually(Duration::from_secs(2), || shards.iter().all(expired)), "{}", shards[0].status());
    drop(guards);
    store.resume();
    assert!(eventually(Duration::from_secs(10), || shards.iter().all(|e| e.is_leader())), "{:?}", group.status());
}

#[test]
fn callbacks_name_the_election_and_a_kept_guard_keeps_the_term() {
    let store = MemStore::new();
    let kept: Arc<Mutex<HashMap<String, LeaderGuard>>> = Arc::default();
    let (stopped, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let cfg = {
        let (kept, stopped, seen) = (Arc::clone(&kept), Arc::clone(&stopped), Arc::clone(&seen));
        config(&store, "a")
            .on_started_leading(move |name, guard| {
                kept.lock().unwrap().insert(name.to_owned(), guard);
            })
            .on_stopped_leading(move |_| {
                stopped.fetch_add(1, Ordering::SeqCst);
            })
            .on_new_leader(move |name, _, fence| seen.lock().unwrap().push((name.to_owned(), fence)))
    };
    let group = Group::start(cfg).unwrap();
    let shards = join_all(&group, &names(5));
    assert!(eventually(Duration::from_secs(5), || kept.lock().unwrap().len() == 5));
    assert!(shards.iter().all(|e| e.is_leader()), "a kept guard keeps its term");
    for e in &shards {
        let fence = e.fence().unwrap();
        assert!(eventually(Duration::from_secs(2), || seen.lock().unwrap().contains(&(e.name().to_owned(), fence))));
    }
    // Dropping the kept guard resigns that election's term.
    let g = kept.lock().unwrap().remove("shard-002").unwrap();
    let fence = g.fence();
    drop(g);
    assert!(eventually(Duration::from_secs(2), || stopped.load(Ordering::SeqCst) >= 1));
    assert!(eventually(Duration::from_secs(5), || shards[2].fence().is_some_and(|f| f > fence)));
    kept.lock().unwrap().clear();
    group.shutdown().unwrap();
}

#[test]
fn shutdown_without_release_leaves_the_leases_to_run_out() {
    let (store, group, shards) = alone(10);
    assert!(eventually(Duration::from_secs(5), || shards.iter().all(|e| e.is_leader())));
    group.shutdown_without_release();
    assert!(shards.iter().all(|e| !e.is_leader()), "every guard turned invalid first");
    for e in &shards {
        assert!(!store.peek(e.name()).unwrap().expired(), "{} was released", e.name());
    }
}

/// Issue 33: a callback may shut its own group down, or drop the last
/// handle to it: the callback thread is not joined from itself (before the
/// fix, "Resource deadlock avoided"), the shutdown's result comes back, and
/// a second shutdown returns the same result.
#[test]
fn a_callback_can_shut_its_own_group_down_or_drop_the_last_handle() {
    for drop_it in [false, true] {
        let store = MemStore::new();
        let slot: Arc<Mutex<Option<Arc<Group>>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let cfg = {
            let (slot, tx) = (Arc::clone(&slot), Mutex::new(tx));
            config(&store, "a").on_started_leading(move |_, guard| {
                drop(guard);
                let Some(group) = slot.lock().unwrap().take() else { return };
                let result = if drop_it {
                    drop(group);
                    Ok(())
                } else {
                    let first = group.shutdown().map_err(|e| e.to_string());
                    let second = group.shutdown().map_err(|e| e.to_string());
                    assert_eq!(second, first, "a second shutdown returns the first's result");
                    first
                };
                tx.lock().unwrap().send(result).unwrap();
            })
        };
        let group = Arc::new(Group::start(cfg).unwrap());
        let election = group.join("shard-000").unwrap();
        *slot.lock().unwrap() = Some(Arc::clone(&group));
        let group = if drop_it {
            drop(group);
            None
        } else {
            Some(group)
        };
        let result = rx.recv_timeout(Duration::from_secs(10)).expect("the callback's shutdown came back");
        assert_eq!(result, Ok(()), "drop_it {drop_it}");
        assert!(!election.is_leader());
        assert!(eventually(Duration::from_secs(2), || store.peek("shard-000").is_some_and(|l| l.expired())));
        if let Some(group) = group {
            assert!(group.shutdown().is_ok(), "and from the program after it");
        }
    }
}
