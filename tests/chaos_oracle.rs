//! The chaos suite's oracle judged on its own: synthetic records with one
//! known fault each, then live fleets on `MemStore` that must pass, and a
//! negative control (a cut-off leader that ignores its deadline) that must
//! fail with exactly the violations it commits.

mod support;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leaderelection::{MemStore, OpKind, Timing};
use support::oracle::{Behaviour, Call, Cut, Oracle, Participant, Report, Skewed, Switch, Violation};
use support::{random_tag, wait_for};

const LEASE: Duration = Duration::from_millis(600);
const RETRY: Duration = Duration::from_millis(80);
/// 100 + 2*100 + 50 = 350 ms <= 600 - 100 = 500 ms.
const TIMING: Timing = Timing {
    lease_duration: LEASE,
    renew_interval: Duration::from_millis(100),
    retry_period: RETRY,
    operation_timeout: Duration::from_millis(100),
    safety_margin: Duration::from_millis(100),
};
/// Scheduling noise allowed on top of the failover bound `lease + retry`
/// (the retry period is jittered by up to 20 %).
const SLACK: Duration = Duration::from_millis(300);

/// The live scenarios run one at a time: their watchers sample every ~0.25 ms
/// and their margins are 100 ms, so they should not compete for two cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- synthetic records ----------------------------------------------------

fn at(o: &Oracle, ms: u64) -> Instant {
    o.origin() + Duration::from_millis(ms)
}

/// A renewal by `who` sent at `ms`, answered 2 ms later.
fn sent(o: &Oracle, who: &str, ms: u64, confirmed: bool) {
    let (sent, returned) = (at(o, ms), at(o, ms + 2));
    o.record_call(Call { participant: who.into(), op: OpKind::Renew, sent, returned, confirmed });
}

fn term(o: &Oracle, who: &str, fence: u64, from: u64, to: u64) {
    o.record_interval(who, fence, at(o, from), at(o, to));
}

/// An oracle that has recorded a confirmed renewal for each `(who, ms)` of
/// `sends`, then a term for each `(who, fence, from, to)` of `terms`.
fn recorded(sends: &[(&str, u64)], terms: &[(&str, u64, u64, u64)]) -> Arc<Oracle> {
    let o = Oracle::new(LEASE);
    for &(who, ms) in sends {
        sent(&o, who, ms, true);
    }
    for &(who, fence, from, to) in terms {
        term(&o, who, fence, from, to);
    }
    o
}

#[test]
fn a_clean_sequence_passes_with_its_figures() {
    let o = Oracle::new(LEASE);
    sent(&o, "a", 5, true);
    term(&o, "a", 1, 10, 300);
    sent(&o, "a", 200, true);
    sent(&o, "b", 690, true);
    term(&o, "b", 2, 700, 1000);
    sent(&o, "a", 1090, true);
    term(&o, "a", 3, 1100, 1200);
    let r = o.check().unwrap_or_else(|v| panic!("clean run rejected: {v:?}"));
    let ms = Duration::from_millis;
    let want = Report {
        terms: 3,
        fences: vec![1, 2, 3],
        leaders: vec!["a".into(), "b".into()],
        max_failover: ms(400),
        max_valid_after_send: ms(310),
        leaderless: ms(1200 - 290 - 300 - 100),
        span: ms(1200),
    };
    assert_eq!(r, want);
    let line = r.to_string();
    assert!(line.starts_with("3 terms by [a, b], fences [1, 2, 3]; max failover 400.0 ms"), "{line}");
}

#[test]
fn an_empty_run_has_no_leader() {
    let o = Oracle::new(LEASE);
    assert_eq!(o.leader_now(), None);
    assert_eq!(o.wait_leader(Duration::from_millis(30)), None);
    let r = o.check().expect("nothing happened, nothing broken");
    assert_eq!((r.terms, r.leaders.len()), (0, 0));
}

#[test]
fn overlaps_are_caught_between_participants_and_within_one() {
    let o = recorded(
        &[("a", 0), ("b", 390), ("a", 990)],
        &[("a", 1, 0, 500), ("b", 2, 400, 800), ("a", 3, 1000, 1200), ("a", 4, 1150, 1300)],
    );
    let v = o.check().expect_err("two overlaps went unnoticed");
    let want = [
        Violation::Overlap { first: ("a".into(), 1), second: ("b".into(), 2), from_ms: 400.0, to_ms: 500.0 },
        Violation::Overlap { first: ("a".into(), 3), second: ("a".into(), 4), from_ms: 1150.0, to_ms: 1200.0 },
    ];
    assert_eq!(v, want);
    assert_eq!(v[0].to_string(), "overlap: a#1 and b#2 both valid from 400.0 ms to 500.0 ms");
}

#[test]
fn a_fence_that_does_not_increase_is_caught() {
    let o = recorded(&[("a", 0), ("b", 190), ("c", 390)], &[("a", 5, 0, 100), ("b", 5, 200, 300), ("c", 4, 400, 500)]);
    let v = o.check().expect_err("repeated and falling fences went unnoticed");
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(matches!(&v[0], Violation::FenceNotIncreasing { later, .. } if later == &("b".to_string(), 5)), "{v:?}");
    assert!(matches!(&v[1], Violation::FenceNotIncreasing { later, .. } if later == &("c".to_string(), 4)), "{v:?}");
}

#[test]
fn validity_past_the_lease_after_the_last_confirmed_send_is_caught() {
    let o = Oracle::new(LEASE);
    sent(&o, "a", 0, true);
    sent(&o, "a", 650, false); // failed: confirms nothing
    sent(&o, "a", 710, true); // after the end: does not count
    term(&o, "a", 1, 5, 700);
    sent(&o, "b", 750, false);
    term(&o, "b", 2, 800, 900); // never confirmed at all
    let v = o.check().expect_err("late validity went unnoticed");
    let want = [
        Violation::LateValidity {
            term: ("a".into(), 1),
            end_ms: 700.0,
            last_confirmed_send_ms: Some(0.0),
            lease: LEASE,
        },
        Violation::LateValidity { term: ("b".into(), 2), end_ms: 900.0, last_confirmed_send_ms: None, lease: LEASE },
    ];
    assert_eq!(v, want);
    assert!(v[0].to_string().contains("700.0 ms after its last confirmed send at 0.0 ms"), "{}", v[0]);
    // Exactly the lease is still in bounds.
    let o = recorded(&[("a", 0)], &[("a", 1, 5, 600)]);
    assert_eq!(o.check().expect("end = send + lease is allowed").max_valid_after_send, LEASE);
}

// ---- live fleets on MemStore ----------------------------------------------

fn fleet(o: &Arc<Oracle>, mem: &MemStore, name: &str, ids: &[&str]) -> Vec<Participant> {
    ids.iter().map(|id| Participant::start(o, id, mem.clone(), name, TIMING)).collect()
}

fn pass(o: &Oracle) -> Report {
    o.check().unwrap_or_else(|v| {
        let lines: Vec<String> = v.iter().map(|x| x.to_string()).collect();
        panic!("oracle found {} violations:\n{}", v.len(), lines.join("\n"))
    })
}

/// Watches `fleet` for `d`, failing at once if two lead together.
fn observe(fleet: &[Participant], d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        let leading: Vec<&str> = fleet.iter().filter(|p| p.is_leader()).map(|p| p.id()).collect();
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Crashes whoever leads `fleet` and waits for a successor; returns the
/// crashed one's id and how long the failover took.
fn crash_leader(o: &Oracle, fleet: &mut Vec<Participant>) -> (String, Duration) {
    let who = o.leader_now().expect("someone leads before the crash");
    let i = fleet.iter().position(|p| p.id() == who).expect("the leader is in the fleet");
    let began = Instant::now();
    fleet.remove(i).crash();
    let bound = LEASE + RETRY + SLACK;
    assert!(o.wait_leader(bound).is_some(), "nobody took over within {bound:?} of crashing {who}");
    let took = began.elapsed();
    let next = o.leader_now().expect("a successor leads");
    assert_ne!(next, who, "the crashed participant still leads");
    (who, took)
}

#[test]
fn three_honest_participants_hold_one_term_then_fail_over_on_a_crash() {
    let _serial = serial();
    let o = Oracle::new(LEASE);
    let mem = MemStore::new();
    let mut f = fleet(&o, &mem, &format!("oracle-{}", random_tag()), &["a", "b", "c"]);
    let first = o.wait_leader(Duration::from_secs(3)).expect("nobody led within 3 s");
    observe(&f, Duration::from_secs(2));
    let steady = pass(&o);
    assert_eq!(steady.terms, 1, "leadership moved without a fault: {steady}");
    let renews = o.calls().iter().filter(|c| c.op == OpKind::Renew && c.confirmed).count();
    assert!(renews >= 10, "2 s at renew 100 ms confirmed only {renews} renewals");

    let (crashed, took) = crash_leader(&o, &mut f);
    observe(&f, Duration::from_millis(300));
    for p in f {
        p.stop();
    }
    let r = pass(&o);
    assert_eq!(r.terms, 2, "{r}");
    assert!(r.fences[1] > r.fences[0], "{r}");
    assert_eq!(r.leaders[0], crashed, "{r}");
    // The crashed term's lease had to run out on the store first.
    assert!(took > LEASE - TIMING.safety_margin - TIMING.renew_interval, "failover in {took:?} beat the lease");
    println!("first leader after {first:?}; failover after crash {took:?}; {r}");
}

#[test]
fn participants_seeing_the_database_clock_days_apart_elect_and_fail_over() {
    let _serial = serial();
    let o = Oracle::new(LEASE);
    let mem = MemStore::new();
    let name = format!("oracle-skew-{}", random_tag());
    const DAY: i64 = 86_400_000_000;
    let mut f: Vec<Participant> = [("a", 3 * DAY), ("b", -2 * DAY), ("c", 7 * DAY + 1)]
        .into_iter()
        .map(|(id, off)| Participant::start(&o, id, Skewed::new(mem.clone(), off), &name, TIMING))
        .collect();
    o.wait_leader(Duration::from_secs(3)).expect("nobody led within 3 s");
    observe(&f, Duration::from_millis(500));
    let (_, took) = crash_leader(&o, &mut f);
    for p in f {
        p.stop();
    }
    let r = pass(&o);
    assert_eq!(r.terms, 2, "{r}");
    println!("skewed: failover after crash {took:?}; {r}");
}

/// Leader `a` sits behind a [`Switch`]; once the followers have seen it and
/// it has renewed a few times, the switch is cut as `how` says. Returns the oracle's verdict after `a`'s
/// watcher has let go and everyone has stopped.
fn cut_off_leader(behaviour: Behaviour, how: Cut) -> Result<Report, Vec<Violation>> {
    let o = Oracle::new(LEASE);
    let mem = MemStore::new();
    let name = format!("oracle-cut-{}", random_tag());
    let switch = Switch::new(mem.clone());
    let a = Participant::start_with(&o, "a", switch.clone(), &name, TIMING, behaviour);
    assert!(wait_for(Duration::from_secs(3), || a.is_leader()), "a did not lead alone within 3 s");
    let others = fleet(&o, &mem, &name, &["b", "c"]);
    let seen = wait_for(Duration::from_secs(2), || {
        others.iter().all(|p| {
            p.elector().status().leader.is_some_and(|l| leaderelection::base_identity(&l.identity) == "a" && l.valid)
        })
    });
    assert!(seen, "the followers never saw a lead");
    let renewals = || o.calls().iter().filter(|c| c.participant == "a" && c.op == OpKind::Renew && c.confirmed).count();
    assert!(wait_for(Duration::from_secs(2), || renewals() >= 3), "a renewed only {} times in 2 s", renewals());

    switch.cut(how);
    let bound = LEASE + RETRY + TIMING.operation_timeout + SLACK;
    assert!(wait_for(bound, || others.iter().any(Participant::is_leader)), "nobody replaced a within {bound:?}");
    let a_done = || !o.intervals().iter().any(|i| i.participant == "a" && i.open);
    assert!(wait_for(3 * LEASE + SLACK, a_done), "a's watcher never let go of its term");
    a.stop();
    for p in others {
        p.stop();
    }
    o.check()
}

#[test]
fn a_cut_off_leader_that_ignores_its_deadline_is_convicted() {
    let _serial = serial();
    let v = cut_off_leader(Behaviour::IgnoresDeadline(2 * LEASE), Cut::Fail).expect_err("the negative control passed");
    let overlap = v.iter().any(|x| matches!(x, Violation::Overlap { first, .. } if first.0 == "a"));
    let late = v.iter().any(|x| matches!(x, Violation::LateValidity { term, .. } if term.0 == "a"));
    assert!(overlap && late, "want an overlap and a late validity of a, got {v:?}");
    println!("negative control: {}", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("; "));
}

#[test]
fn an_honest_leader_cut_off_steps_down_in_time() {
    let _serial = serial();
    for how in [Cut::Fail, Cut::Hang] {
        let r = cut_off_leader(Behaviour::Honest, how).unwrap_or_else(|v| panic!("{how:?}: {v:?}"));
        assert_eq!((r.terms, r.leaders[0].as_str()), (2, "a"), "{how:?}: {r}");
        assert!(r.fences[1] > r.fences[0], "{how:?}: {r}");
        println!("honest, cut {how:?}: {r}");
    }
}
