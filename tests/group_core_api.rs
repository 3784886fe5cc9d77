//! The sans-IO group core (`leaderelection::group::core`) through its
//! public API, for what the unit tests beside it do not ask: its size
//! accessors and configuration, and what a batch entry's Debug output
//! shows (the payload's length, never its bytes).

use std::sync::Arc;
use std::time::Duration;

use leaderelection::group::core::{default_tick, BatchOp, GroupCall, GroupMachine, GroupMachineConfig};
use leaderelection::machine::LocalTime;
use leaderelection::Timing;

fn timing() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(5),
        renew_interval: Duration::from_secs(1),
        retry_period: Duration::from_secs(1),
        operation_timeout: Duration::from_secs(1),
        safety_margin: Duration::from_secs(1),
    }
}

#[test]
fn size_config_and_a_batch_entrys_debug_output() {
    let mut g = GroupMachine::new(GroupMachineConfig::new("a#0123456789abcdef", "shards", timing(), 7));
    assert!(g.is_empty());
    assert_eq!(g.len(), 0);
    let cfg = g.config();
    assert_eq!((cfg.identity.as_str(), cfg.group.as_str(), cfg.seed), ("a#0123456789abcdef", "shards", 7));
    assert_eq!(cfg.tick, default_tick(&timing()));

    let key = g.join(LocalTime::ZERO, "shard-1".into(), Arc::from(&b"secret-payload"[..])).unwrap();
    g.join(LocalTime::ZERO, "shard-2".into(), Arc::from(&b""[..])).unwrap();
    assert!(!g.is_empty());
    assert_eq!(g.len(), 2);

    // The first grid instant: one look for both.
    g.handle_timeout(LocalTime::ZERO + default_tick(&timing()));
    let Some(GroupCall::Batch(b)) = g.poll_call() else { panic!("a batch of looks") };
    assert_eq!((b.op, b.entries.len()), (BatchOp::Inspect, 2));
    let first = b.entries.iter().find(|e| e.key == key).expect("shard-1's entry");
    let shown = format!("{first:?}");
    assert!(shown.starts_with("BatchEntry { key: "), "{shown}");
    assert!(shown.contains("name: \"shard-1\"") && shown.contains("fence: 0"), "{shown}");
    assert!(shown.contains("payload_len: 14") && !shown.contains("secret"), "{shown}");
}

/// An election that left (without release, as a follower with no call in
/// flight) stops at once; `forget` then drops it, and its name may join
/// again. Before it has stopped, `forget` does nothing.
#[test]
fn a_stopped_election_is_forgotten_and_its_name_may_join_again() {
    let mut g = GroupMachine::new(GroupMachineConfig::new("a#0123456789abcdef", "shards", timing(), 7));
    let key = g.join(LocalTime::ZERO, "shard-1".into(), Arc::from(&b""[..])).unwrap();
    g.forget(key);
    assert_eq!(g.len(), 1, "a running election is not forgotten");
    g.leave(LocalTime::ZERO, key, false);
    let mut stopped = false;
    while let Some((k, out)) = g.poll_event() {
        stopped |= k == key && matches!(out, leaderelection::machine::Output::Stopped);
    }
    assert!(stopped, "the election stopped");
    g.forget(key);
    assert!(g.is_empty(), "{} elections", g.len());
    assert!(g.join(LocalTime::ZERO, "shard-1".into(), Arc::from(&b""[..])).is_ok(), "the name joins again");
    assert_eq!(g.len(), 1);
}
