//! `Config` and `ConfigError` through the public API: what a program reads
//! back from a config, and how a refusal names the field and the problem.

use std::time::Duration;

use leaderelection::{Config, MemStore, Problem, Timing, MAX_PAYLOAD_LEN};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config() -> Config {
    Config::new(MemStore::new(), "invoice-reconciler").identity("me")
}

#[test]
fn a_config_reads_back_its_name_and_timings() {
    let c = config();
    assert_eq!(c.name(), "invoice-reconciler");
    assert_eq!(c.get_timing(), Timing::default());

    let t = Timing {
        lease_duration: ms(1500),
        renew_interval: ms(300),
        retry_period: ms(200),
        operation_timeout: ms(300),
        safety_margin: ms(200),
    };
    let c = config().timing(t).retry_period(ms(250));
    assert_eq!(c.get_timing(), Timing { retry_period: ms(250), ..t }, "a setter after timing() overrides one field");
    assert!(c.validate().is_ok());
}

#[test]
fn a_refusal_names_the_field_and_the_problem() {
    let e = config().identity("bad\nidentity").validate().unwrap_err();
    assert_eq!(e.field(), "identity");
    assert_eq!(e.problem(), &Problem::ControlCharacter { at: 3 });

    let e = config().payload(vec![0u8; MAX_PAYLOAD_LEN + 1]).validate().unwrap_err();
    assert_eq!(e.field(), "payload");
    assert_eq!(e.problem(), &Problem::TooLong { len: MAX_PAYLOAD_LEN + 1, max: MAX_PAYLOAD_LEN });

    let e = Config::new(MemStore::new(), "").validate().unwrap_err();
    assert_eq!((e.field(), e.problem()), ("name", &Problem::Empty));
}

#[test]
fn a_timing_refusal_carries_both_sides_of_the_invariant() {
    // 5 s + 2*3 s + 1.25 s = 12.25 s needed; 10 s - 1 s = 9 s available.
    let e = config().lease_duration(Duration::from_secs(10)).validate().unwrap_err();
    match e.problem() {
        Problem::TimingInvariant { timing, needed, available } => {
            assert_eq!(*needed, ms(12_250));
            assert_eq!(*available, Duration::from_secs(9));
            assert_eq!(timing.lease_duration, Duration::from_secs(10));
        }
        other => panic!("expected the timing invariant, got {other:?} ({e})"),
    }
    assert!(!e.field().is_empty(), "the refusal names a field");
}
