//! The parts of the `Group` API that `tests/group.rs` does not lean on, on
//! MemStore: the names and Debug output, every `JoinError`'s message and
//! source, a tick over the longest duration, `wait_leader` and
//! `wait_leader_deadline`, and `leave_without_release`. Real time, so
//! every wait is for a condition with a deadline, never a fixed nap.

use std::error::Error as _;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use leaderelection::{
    Config, Group, GroupConfig, JoinError, MemStore, Problem, WaitLeaderError, MAX_DURATION, MAX_NAME_LEN,
};

mod threaded;
use threaded::{eventually, ms, timing};

const GROUP: &str = "shards";

fn config(store: &MemStore, id: &str) -> GroupConfig {
    GroupConfig::new(Config::new(store.clone(), GROUP).identity(id).timing(timing()))
}

/// The group's and the election's names and identity, and what their Debug
/// output shows (and that it names no store internals).
#[test]
fn names_identities_and_debug_output() {
    let store = MemStore::new();
    let cfg = config(&store, "a").fair_share(true);
    let shown = format!("{cfg:?}");
    assert!(shown.starts_with("GroupConfig { template: "), "{shown}");
    assert!(shown.contains("fair_share: true"), "{shown}");
    assert!(shown.contains(&format!("tick: {:?}", cfg.get_tick())), "{shown}");
    let cfg = config(&store, "a").tick(ms(50));
    assert!(format!("{cfg:?}").contains("tick: 50ms"), "{cfg:?}");

    let group = Group::start(cfg).unwrap();
    assert_eq!(group.name(), GROUP);
    assert!(group.identity().starts_with("a#"), "{}", group.identity());
    assert_eq!(format!("{group:?}"), format!("Group {{ name: {GROUP:?}, identity: {:?} }}", group.identity()));

    let e = group.join("shard-1").unwrap();
    assert_eq!(e.identity(), group.identity());
    let guard = e.wait_leader_timeout(Duration::from_secs(5)).expect("leads");
    assert_eq!(
        format!("{e:?}"),
        format!("Election {{ name: \"shard-1\", identity: {:?}, is_leader: true }}", group.identity())
    );
    drop(guard);
    e.leave().unwrap();
    assert!(format!("{e:?}").ends_with("is_leader: false }"), "{e:?}");
    group.shutdown().unwrap();
}

/// Every refusal of `join` says why; only a configuration problem has a
/// source, the `ConfigError` naming the field.
#[test]
fn join_errors_say_why_and_keep_their_source() {
    let store = MemStore::new();
    let group = Group::start(config(&store, "a")).unwrap();

    let long = "x".repeat(MAX_NAME_LEN + 1);
    let e = group.join(&long).unwrap_err();
    let JoinError::Config(inner) = &e else { panic!("{e:?}") };
    assert_eq!(inner.field(), "name");
    assert_eq!(e.to_string(), format!("cannot join the election: {inner}"));
    let source = e.source().expect("a config error has its source");
    assert_eq!(source.to_string(), inner.to_string());

    let _kept = group.join("shard-1").unwrap();
    let e = group.join("shard-1").unwrap_err();
    assert!(matches!(&e, JoinError::Duplicate(n) if n == "shard-1"), "{e:?}");
    assert_eq!(e.to_string(), "cannot join the election \"shard-1\": the group already runs it");
    assert!(e.source().is_none());

    group.shutdown().unwrap();
    let e = group.join("shard-2").unwrap_err();
    assert!(matches!(e, JoinError::Stopped), "{e:?}");
    assert_eq!(e.to_string(), "cannot join the election: the group has stopped");
    assert!(e.source().is_none());

    let e = JoinError::OutOfKeys;
    assert!(e.to_string().contains("4294967295 elections") && e.to_string().contains("start a new Group"), "{e}");
    assert!(e.source().is_none());
}

/// A tick longer than the longest duration a config takes is refused as
/// such (before it is compared with the intervals), and the group does
/// not start.
#[test]
fn a_tick_over_the_longest_duration_is_refused() {
    let tick = MAX_DURATION + ms(1);
    let cfg = config(&MemStore::new(), "a").tick(tick);
    let e = cfg.validate().unwrap_err();
    assert_eq!((e.field(), e.problem()), ("tick", &Problem::TooLongDuration { value: tick, max: MAX_DURATION }));
    let err = match Group::start(cfg) {
        Ok(_) => panic!("a group started with a tick of {tick:?}"),
        Err(e) => e,
    };
    // The error is shared with `Elector::start`, so it names neither.
    let text = err.to_string();
    assert!(text.starts_with("cannot start: invalid config: tick: "), "{text}");
}

/// `wait_leader` blocks until the election is this participant's, and
/// `wait_leader_deadline` gives up at its deadline while another leads,
/// and says `Stopped` once the election has left.
#[test]
fn wait_leader_waits_for_the_term_and_the_deadline_gives_up() {
    let store = MemStore::new();
    let (a, b) = (Group::start(config(&store, "a")).unwrap(), Group::start(config(&store, "b")).unwrap());
    let ea = a.join("shard-1").unwrap();
    let first = ea.wait_leader().expect("the only participant leads");
    assert!(first.is_valid());
    let eb = b.join("shard-1").unwrap();

    let started = Instant::now();
    let until = started + ms(150);
    assert_eq!(eb.wait_leader_deadline(until).unwrap_err(), WaitLeaderError::Timeout);
    assert!(Instant::now() >= until, "gave up {:?} early", until - Instant::now());
    assert!(!eb.is_leader());

    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(|| tx.send(eb.wait_leader()).unwrap());
        drop(first);
        ea.leave().unwrap(); // releases the lease: b's next look claims it
        let guard = rx.recv_timeout(Duration::from_secs(10)).expect("b's wait_leader returned").expect("b leads");
        assert!(guard.is_valid());
        assert_eq!(eb.fence(), Some(guard.fence()));
        assert_eq!(store.peek("shard-1").unwrap().holder, b.identity());
    });

    eb.leave().unwrap();
    assert_eq!(eb.wait_leader_deadline(Instant::now() + ms(500)).unwrap_err(), WaitLeaderError::Stopped);
    assert_eq!(eb.wait_leader().unwrap_err(), WaitLeaderError::Stopped);
}

/// `leave_without_release` ends the term at once but leaves the lease to
/// run out, as a crash would: the row still names the participant, and
/// another takes the election over only after it expires. Leaving again
/// does nothing.
#[test]
fn leave_without_release_leaves_the_lease_to_run_out() {
    let store = MemStore::new();
    let (a, b) = (Group::start(config(&store, "a")).unwrap(), Group::start(config(&store, "b")).unwrap());
    let ea = a.join("shard-1").unwrap();
    let guard = ea.wait_leader_timeout(Duration::from_secs(5)).expect("a leads");
    let fence = guard.fence();
    let eb = b.join("shard-1").unwrap();

    let left_at = Instant::now();
    ea.leave_without_release();
    assert!(!guard.is_valid() && !ea.is_leader(), "the term ended at once");
    let row = store.peek("shard-1").unwrap();
    assert!(!row.expired() && row.holder == a.identity() && row.fence == fence, "{row:?}");
    assert!(eventually(Duration::from_secs(5), || a.status().elections == 0), "{:?}", a.status());
    assert!(ea.leave().is_ok(), "leaving again does nothing");

    let gb = eb.wait_leader_timeout(Duration::from_secs(10)).expect("b takes over after the lease ran out");
    assert!(gb.fence() > fence);
    // The lease ran 1.5 s from a's last renewal, at most a renew interval
    // (0.3 s) before it left; a released lease would have gone within a
    // retry period (0.2 s).
    assert!(left_at.elapsed() >= timing().lease_duration / 2, "taken over after {:?}", left_at.elapsed());
    drop(guard);
}

/// A join while the group shuts down (its release held up by a store that
/// hangs) is refused as `Stopped`, never half-made; the shutdown ends once
/// the store answers.
#[test]
fn a_join_during_shutdown_is_refused_as_stopped() {
    let store = MemStore::new();
    let group = Group::start(config(&store, "a")).unwrap();
    let e = group.join("shard-1").unwrap();
    e.wait_leader_timeout(Duration::from_secs(5)).expect("leads");
    store.pause();
    thread::scope(|s| {
        let shutting = s.spawn(|| group.shutdown());
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut n = 0;
        let refused = loop {
            n += 1;
            match group.join(&format!("late-{n}")) {
                Ok(late) => drop(late),
                Err(err) => break err,
            }
            assert!(Instant::now() < deadline, "joins were still taken 5 s into the shutdown");
        };
        assert!(matches!(refused, JoinError::Stopped), "{refused:?}");
        store.resume();
        let _ = shutting.join().expect("the shutdown returned");
    });
    assert!(group.status().stopped);
    assert!(matches!(group.join("later"), Err(JoinError::Stopped)));
}
