//! The elector's figures through the [`metrics`](::metrics) facade (feature
//! `metrics`): whatever recorder the program installs (a Prometheus or
//! StatsD exporter) receives them. Names follow Prometheus conventions, and
//! every series carries the election's name as the label `election`.
//!
//! Handles are registered once, when the elector starts, with the recorder
//! in force on the thread that starts it: install the recorder first.

use std::time::Duration;

use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use ::metrics::{Counter, Gauge, Histogram, Unit};

use crate::error::OpKind;
use crate::machine::reason_name;
use crate::machine::EndReason;
use crate::store::ErrorKind;

/// 1 while this participant leads, else 0.
pub(crate) const LEADER: &str = "leaderelection_leader";
/// Terms started.
pub(crate) const TERMS_STARTED: &str = "leaderelection_terms_started_total";
/// Terms ended, label `reason`.
pub(crate) const TERMS_ENDED: &str = "leaderelection_terms_ended_total";
/// Renewals, label `outcome` = `ok` | `failed`.
pub(crate) const RENEWALS: &str = "leaderelection_renewals_total";
/// Store errors, label `kind` = `retryable` | `fatal` | `lease_lost`.
pub(crate) const STORE_ERRORS: &str = "leaderelection_store_errors_total";
/// Store calls given up at the operation timeout.
pub(crate) const ABANDONED: &str = "leaderelection_store_calls_abandoned_total";
/// Store-call latency in seconds, label `op`.
pub(crate) const CALL_DURATION: &str = "leaderelection_store_call_duration_seconds";

const REASONS: [EndReason; 5] =
    [EndReason::Resigned, EndReason::LeaseLost, EndReason::ExpiredLocally, EndReason::Fatal, EndReason::Shutdown];
const OPS: [OpKind; 4] = [OpKind::Inspect, OpKind::Acquire, OpKind::Renew, OpKind::Release];

/// One elector's registered handles; bumping one is a call into the recorder,
/// no lookup.
pub(crate) struct Metrics {
    leader: Gauge,
    terms_started: Counter,
    terms_ended: [Counter; 5],
    renewals_ok: Counter,
    renewals_failed: Counter,
    retryable: Counter,
    fatal: Counter,
    lease_lost: Counter,
    abandoned: Counter,
    call_duration: [Histogram; 4],
}

impl Metrics {
    pub(crate) fn new(election: &str) -> Metrics {
        describe_gauge!(LEADER, "1 while this participant leads the election, else 0");
        describe_counter!(TERMS_STARTED, "terms this participant has led");
        describe_counter!(TERMS_ENDED, "terms that ended, by reason");
        describe_counter!(RENEWALS, "lease renewals, by outcome");
        describe_counter!(STORE_ERRORS, "failed store calls, by kind of error");
        describe_counter!(ABANDONED, "store calls given up at the operation timeout");
        describe_histogram!(CALL_DURATION, Unit::Seconds, "store-call latency, by operation");
        let e = || ("election", election.to_owned());
        let errors = |kind: &'static str| counter!(STORE_ERRORS, &[e(), ("kind", kind.to_owned())]);
        let renewals = |outcome: &'static str| counter!(RENEWALS, &[e(), ("outcome", outcome.to_owned())]);
        let metrics = Metrics {
            leader: gauge!(LEADER, &[e()]),
            terms_started: counter!(TERMS_STARTED, &[e()]),
            terms_ended: REASONS.map(|r| counter!(TERMS_ENDED, &[e(), ("reason", reason_name(r).to_owned())])),
            renewals_ok: renewals("ok"),
            renewals_failed: renewals("failed"),
            retryable: errors("retryable"),
            fatal: errors("fatal"),
            lease_lost: errors("lease_lost"),
            abandoned: counter!(ABANDONED, &[e()]),
            call_duration: OPS.map(|op| histogram!(CALL_DURATION, &[e(), ("op", op.to_string())])),
        };
        metrics.leader.set(0.0);
        metrics
    }

    pub(crate) fn term_started(&self) {
        self.terms_started.increment(1);
        self.leader.set(1.0);
    }

    pub(crate) fn term_ended(&self, reason: EndReason) {
        self.leader.set(0.0);
        let i = REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.terms_ended[i].increment(1);
    }

    pub(crate) fn renewal(&self, ok: bool) {
        if ok { &self.renewals_ok } else { &self.renewals_failed }.increment(1);
    }

    /// A store error by kind. The machine treats every error that is
    /// neither fatal nor a lost lease as one that may fix itself; so does
    /// this label.
    pub(crate) fn store_error(&self, kind: ErrorKind) {
        match kind {
            ErrorKind::Fatal => &self.fatal,
            ErrorKind::LeaseLost => &self.lease_lost,
            _ => &self.retryable,
        }
        .increment(1);
    }

    pub(crate) fn abandoned(&self) {
        self.abandoned.increment(1);
    }

    pub(crate) fn call_returned(&self, op: OpKind, took: Duration) {
        let i = OPS.iter().position(|o| *o == op).unwrap_or(0);
        self.call_duration[i].record(took.as_secs_f64());
    }
}

/// Elections a group runs, label `group`.
pub(crate) const GROUP_ELECTIONS: &str = "leaderelection_group_elections";
/// Elections a group's participant leads.
pub(crate) const GROUP_LEADING: &str = "leaderelection_group_leading";
/// Live members by the last heartbeat (fair share only).
pub(crate) const GROUP_MEMBERS: &str = "leaderelection_group_live_members";
/// The most elections the participant may lead now (fair share only).
pub(crate) const GROUP_SHARE: &str = "leaderelection_group_share";
/// Terms resigned to come down to the share.
pub(crate) const GROUP_SHED: &str = "leaderelection_group_shed_total";
/// A group's store calls, labels `op` and `outcome` = `ok` | `failed`
/// (failed: the call failed as a whole).
pub(crate) const GROUP_CALLS: &str = "leaderelection_group_calls_total";
/// A group's store-call latency in seconds, label `op`.
pub(crate) const GROUP_CALL_DURATION: &str = "leaderelection_group_call_duration_seconds";

/// The `op` labels of a group's calls.
pub(crate) const GROUP_OPS: [&str; 6] = ["renew", "inspect", "acquire", "release", "heartbeat", "leave"];

/// One group's registered handles: a group exports figures of its own
/// rather than a dozen series for each of its thousands of elections.
pub(crate) struct GroupMetrics {
    elections: Gauge,
    leading: Gauge,
    members: Gauge,
    share: Gauge,
    shed: Counter,
    shed_seen: std::sync::atomic::AtomicU64,
    calls_ok: [Counter; 6],
    calls_failed: [Counter; 6],
    call_duration: [Histogram; 6],
}

impl GroupMetrics {
    pub(crate) fn new(group: &str) -> GroupMetrics {
        describe_gauge!(GROUP_ELECTIONS, "elections the group runs");
        describe_gauge!(GROUP_LEADING, "elections this participant of the group leads");
        describe_gauge!(GROUP_MEMBERS, "live members of the group by the last heartbeat");
        describe_gauge!(GROUP_SHARE, "the most elections this participant may lead now");
        describe_counter!(GROUP_SHED, "terms resigned to come down to the fair share");
        describe_counter!(GROUP_CALLS, "the group's store calls, by operation and outcome");
        describe_histogram!(GROUP_CALL_DURATION, Unit::Seconds, "the group's store-call latency, by operation");
        let g = || ("group", group.to_owned());
        let call = |op: &str, outcome: &'static str| {
            counter!(GROUP_CALLS, &[g(), ("op", op.to_owned()), ("outcome", outcome.to_owned())])
        };
        GroupMetrics {
            elections: gauge!(GROUP_ELECTIONS, &[g()]),
            leading: gauge!(GROUP_LEADING, &[g()]),
            members: gauge!(GROUP_MEMBERS, &[g()]),
            share: gauge!(GROUP_SHARE, &[g()]),
            shed: counter!(GROUP_SHED, &[g()]),
            shed_seen: std::sync::atomic::AtomicU64::new(0),
            calls_ok: GROUP_OPS.map(|op| call(op, "ok")),
            calls_failed: GROUP_OPS.map(|op| call(op, "failed")),
            call_duration: GROUP_OPS.map(|op| histogram!(GROUP_CALL_DURATION, &[g(), ("op", op.to_owned())])),
        }
    }

    /// The group's state after a round of the driver.
    pub(crate) fn state(
        &self, elections: usize, leading: usize, members: Option<u32>, share: Option<usize>, shed: u64,
    ) {
        self.elections.set(elections as f64);
        self.leading.set(leading as f64);
        if let Some(m) = members {
            self.members.set(f64::from(m));
        }
        if let Some(s) = share {
            self.share.set(s as f64);
        }
        let seen = self.shed_seen.swap(shed, std::sync::atomic::Ordering::Relaxed);
        if shed > seen {
            self.shed.increment(shed - seen);
        }
    }

    /// A call answered: `op` one of [`GROUP_OPS`].
    pub(crate) fn call(&self, op: &str, ok: bool, took: Duration) {
        let i = GROUP_OPS.iter().position(|o| *o == op).unwrap_or(0);
        if ok { &self.calls_ok[i] } else { &self.calls_failed[i] }.increment(1);
        self.call_duration[i].record(took.as_secs_f64());
    }
}
