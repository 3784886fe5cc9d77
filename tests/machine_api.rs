//! The pure machine as a driver author sees it: a driver bug is reported,
//! not obeyed, and what the machine observed hides the leader's payload.
//! No threads, no clock: time is passed in.

use std::time::Duration;

use leaderelection::machine::{Call, EndReason, LocalTime, Machine, MachineConfig, Op, Outcome, Output};
use leaderelection::{DbTime, ElectionError, Lease, StoreError, Timing};

fn timing() -> Timing {
    Timing::default()
}

fn machine() -> Machine {
    Machine::new(MachineConfig::new("me", timing(), 7))
}

/// Runs the machine at `now` and returns the store call it asks for.
fn next_call(m: &mut Machine, now: LocalTime) -> Call {
    m.handle_timeout(now);
    while let Some(out) = m.poll_output() {
        if let Output::Call(call) = out {
            return call;
        }
    }
    panic!("no store call at {now:?}");
}

/// A lease held by `holder`, read on a database clock days away from any
/// local one.
fn lease(holder: &str, payload: &[u8]) -> Lease {
    lease_for(holder, 4, Duration::from_secs(15), payload)
}

fn lease_for(holder: &str, fence: u64, ttl: Duration, payload: &[u8]) -> Lease {
    Lease::granted("jobs", holder, fence, DbTime::from_unix_micros(3 * 86_400_000_000), ttl, payload)
}

fn secs(s: f64) -> LocalTime {
    LocalTime::from_duration(Duration::from_secs_f64(s))
}

fn outputs(m: &mut Machine) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

/// Inspect finds no row, acquire wins fence 1 for a full lease: the machine
/// leads from t = 0 and asks to renew at t = renew_interval.
fn leading_machine() -> Machine {
    let mut m = machine();
    let call = next_call(&mut m, LocalTime::ZERO);
    assert_eq!(call.op, Op::Inspect);
    m.handle_reply(LocalTime::ZERO, call.id, Outcome::Lease(Err(StoreError::no_lease("jobs"))));
    let call = next_call(&mut m, LocalTime::ZERO);
    assert!(matches!(call.op, Op::Acquire { .. }), "{call:?}");
    m.handle_reply(LocalTime::ZERO, call.id, Outcome::Lease(Ok(lease_for("me", 1, timing().lease_duration, b""))));
    assert!(outputs(&mut m).iter().any(|o| matches!(o, Output::TermStarted { fence: 1, .. })));
    assert!(m.is_leader(LocalTime::ZERO));
    m
}

fn ended(outs: &[Output]) -> Vec<EndReason> {
    outs.iter()
        .filter_map(|o| match o {
            Output::TermEnded { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn a_renewal_that_leaves_less_than_the_margin_ends_the_term_instead_of_extending_it() {
    let mut m = leading_machine();
    let sent = secs(5.0);
    let call = next_call(&mut m, sent);
    assert!(matches!(call.op, Op::Renew { fence: 1, .. }), "{call:?}");
    // The server confirms, but with 2 s left: sent_at + 2 s - 1.5 s margin
    // is already behind the reply at sent_at + 0.6 s.
    let now = secs(5.6);
    m.handle_reply(now, call.id, Outcome::Lease(Ok(lease_for("me", 1, Duration::from_secs(2), b""))));
    let outs = outputs(&mut m);
    assert_eq!(ended(&outs), [EndReason::ExpiredLocally]);
    assert!(!outs.iter().any(|o| matches!(o, Output::DeadlineExtended { .. })), "{outs:?}");
    assert!(!m.is_leader(now) && m.term().is_none());
}

#[test]
fn a_renewal_answer_naming_someone_else_ends_the_term_as_lost() {
    let mut m = leading_machine();
    let call = next_call(&mut m, secs(5.0));
    let now = secs(5.1);
    m.handle_reply(now, call.id, Outcome::Lease(Ok(lease_for("other", 2, Duration::from_secs(15), b""))));
    let outs = outputs(&mut m);
    assert_eq!(ended(&outs), [EndReason::LeaseLost]);
    assert!(m.last_error().and_then(ElectionError::store_error).is_some_and(StoreError::is_lease_lost));
    assert!(!m.is_leader(now));
    // It polls again at once, and has nothing to give back: the server
    // holds the lease for someone else.
    let next = outs.iter().find_map(|o| match o {
        Output::Call(c) => Some(c.op),
        _ => None,
    });
    assert_eq!(next, Some(Op::Inspect), "{outs:?}");
}

#[test]
fn a_release_answered_with_the_wrong_kind_fails_and_shutdown_still_finishes() {
    let mut m = leading_machine();
    let now = secs(1.0);
    m.shutdown(now);
    let call = next_call(&mut m, now);
    assert_eq!(call.op, Op::Release { fence: 1 });
    m.handle_reply(now, call.id, Outcome::Lease(Ok(lease_for("me", 1, Duration::from_secs(15), b""))));
    let outs = outputs(&mut m);
    let released = outs.iter().find_map(|o| match o {
        Output::Released { fence: 1, result } => Some(result.clone()),
        _ => None,
    });
    assert!(released.expect("the release is reported").is_err_and(|e| e.is_fatal()));
    assert!(matches!(outs.last(), Some(Output::Stopped)), "{outs:?}");
    assert!(m.is_stopped());
}

#[test]
fn a_second_shutdown_changes_nothing() {
    let mut m = leading_machine();
    m.shutdown_without_release(secs(1.0));
    let first = outputs(&mut m);
    assert_eq!(ended(&first), [EndReason::Shutdown]);
    assert!(matches!(first.last(), Some(Output::Stopped)), "no release was asked for: {first:?}");
    m.shutdown(secs(2.0));
    m.shutdown_without_release(secs(3.0));
    assert!(outputs(&mut m).is_empty());
    assert!(m.is_stopped() && m.poll_timeout().is_none());
}

#[test]
fn a_machine_reports_who_it_is_and_its_timings() {
    let m = machine();
    assert_eq!(m.identity(), "me");
    assert_eq!(m.timing(), &timing());
}

#[test]
fn an_answer_of_the_wrong_kind_is_a_fatal_error_and_no_term() {
    let mut m = machine();
    let now = LocalTime::ZERO;
    let call = next_call(&mut m, now);
    assert!(!matches!(call.op, Op::Release { .. }), "a fresh participant does not release first: {call:?}");
    // A driver bug: a release answer to an inspect or acquire.
    m.handle_reply(now, call.id, Outcome::Released(Ok(())));
    let err = m.last_error().expect("the bug is reported");
    assert!(err.is_fatal(), "{err}");
    let text = err.store_error().expect("as a store error").message().to_owned();
    assert!(text.contains("wrong kind of outcome"), "{text}");
    assert!(!m.is_leader(now));
    assert!(m.term().is_none());
}

#[test]
fn the_observed_leader_shows_its_payload_size_not_its_bytes() {
    let mut m = machine();
    let now = LocalTime::ZERO;
    let call = next_call(&mut m, now);
    m.handle_reply(now, call.id, Outcome::Lease(Ok(lease("other", b"secret-address"))));
    let seen = m.observed().expect("the holder was observed");
    assert_eq!((seen.identity.as_str(), seen.fence, seen.valid), ("other", 4, true));
    let dbg = format!("{seen:?}");
    assert!(dbg.contains("payload_len: 14"), "{dbg}");
    assert!(!dbg.contains("secret"), "{dbg}");
    assert!(!m.is_leader(now), "someone else holds a valid lease");
}

/// `highest_fence`: none before anything is read, the fence a term led
/// under, and the fence of a row found held under the machine's own
/// identity before its first claim (an earlier run's term, never led
/// under again).
#[test]
fn the_highest_fence_is_the_last_led_or_found_under_its_identity() {
    assert_eq!(machine().highest_fence(), 0);
    assert_eq!(leading_machine().highest_fence(), 1);
    let mut m = machine();
    let call = next_call(&mut m, LocalTime::ZERO);
    assert_eq!(call.op, Op::Inspect);
    m.handle_reply(LocalTime::ZERO, call.id, Outcome::Lease(Ok(lease_for("me", 9, timing().lease_duration, b""))));
    assert_eq!(m.highest_fence(), 9);
    assert!(!m.is_leader(LocalTime::ZERO), "an earlier run's term is not this machine's");
}
