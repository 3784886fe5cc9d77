//! The group's configuration checks (the threaded group is tested in
//! `tests/group.rs`, its core in `core_tests.rs`).

use super::*;
use crate::MemStore;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn template() -> Config {
    Config::new(MemStore::new(), "shards")
        .lease_duration(ms(5_000))
        .renew_interval(ms(1_000))
        .retry_period(ms(1_000))
        .operation_timeout(ms(1_000))
}

#[test]
fn a_valid_group_and_its_default_tick() {
    let c = GroupConfig::new(template());
    assert!(c.validate().is_ok());
    assert_eq!(c.get_tick(), ms(250));
    assert_eq!(GroupConfig::new(Config::new(MemStore::new(), "g")).get_tick(), ms(500));
}

#[test]
fn the_template_must_not_carry_callbacks() {
    let c = GroupConfig::new(template().on_started_leading(|_| {}));
    let e = c.validate().unwrap_err();
    assert_eq!(e.field(), "on_started_leading");
    assert!(e.to_string().contains("set it on the GroupConfig"), "{e}");
    for (c, field) in [
        (GroupConfig::new(template().on_stopped_leading(|| {})), "on_stopped_leading"),
        (GroupConfig::new(template().on_new_leader(|_, _| {})), "on_new_leader"),
    ] {
        assert_eq!(c.validate().unwrap_err().field(), field);
    }
    let group_callbacks = GroupConfig::new(template()).on_started_leading(|_, _| {}).on_new_leader(|_, _, _| {});
    assert!(group_callbacks.validate().is_ok());
}

#[test]
fn the_tick_is_checked_against_the_intervals_and_the_invariant() {
    let e = GroupConfig::new(template()).tick(Duration::ZERO).validate().unwrap_err();
    assert_eq!((e.field(), e.problem()), ("tick", &Problem::Zero));
    let e = GroupConfig::new(template()).tick(ms(1_001)).validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid config: tick: tick (1.001s) must not exceed the shorter of renew_interval and retry_period (1s)"
    );
    // 1 + 2*1 + 0.25 = 3.25 s fits 5 - 1 = 4 s; with a 1 s tick, 4.25 s does not.
    // The boundary is inclusive: 1 + 2*1.25 + 0.25 + 0.25 = 4 s.
    assert!(GroupConfig::new(template().operation_timeout(ms(1_250))).validate().is_ok());
    let e = GroupConfig::new(template().operation_timeout(ms(1_251))).validate().unwrap_err();
    assert_eq!(e.field(), "tick");
    let e = GroupConfig::new(template()).tick(ms(1_000)).validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid config: tick: in a group, renew_interval + 2*operation_timeout + retry_delay + tick \
         (1s + 2*1s + 250ms + 1s = 4.25s) must not exceed lease_duration - safety_margin (5s - 1s = 4s)"
    );
    // A single elector would take these timings: the tick is what a group adds.
    assert!(template().validate().is_ok());
}

#[test]
fn a_bad_name_or_payload_is_refused_before_the_driver_sees_it() {
    let group = Group::start(GroupConfig::new(template())).unwrap();
    for (name, field) in [("", "name"), ("a\nb", "name")] {
        match group.join(name) {
            Err(JoinError::Config(e)) => assert_eq!(e.field(), field),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    match group.join_with_payload("ok", vec![0; MAX_PAYLOAD_LEN + 1]) {
        Err(JoinError::Config(e)) => assert_eq!(e.field(), "payload"),
        other => panic!("{other:?}"),
    }
    let long = "x".repeat(MAX_NAME_LEN + 1);
    assert!(matches!(group.join(&long), Err(JoinError::Config(_))));
    assert_eq!(group.status().elections, 0);
}
