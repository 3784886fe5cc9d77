//! The pure machine as a driver author sees it: a driver bug is reported,
//! not obeyed, and what the machine observed hides the leader's payload.
//! No threads, no clock: time is passed in.

use std::time::Duration;

use leaderelection::machine::{Call, LocalTime, Machine, MachineConfig, Op, Outcome, Output};
use leaderelection::{DbTime, Lease, Timing};

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
    let now = DbTime::from_unix_micros(3 * 86_400_000_000);
    Lease {
        name: "jobs".into(),
        holder: holder.into(),
        fence: 4,
        acquired_at: now,
        renewed_at: now,
        expires_at: now.saturating_add(Duration::from_secs(15)),
        now,
        payload: payload.to_vec(),
    }
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
