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
use crate::machine::EndReason;
use crate::status::reason_name;
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
