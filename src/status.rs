//! What an elector reports about itself: [`Status`] and its one-line
//! `Display`, the figures behind it, and the [`Counters`] that change them
//! (and, with the `metrics` feature, the exported metrics with them).

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{ElectionError, Human, OpKind};
use crate::machine::EndReason;

/// The figures [`Status`] reports beyond the election itself; only
/// [`Counters`] changes them.
#[derive(Clone, Copy, Default)]
pub(crate) struct Figures {
    pub(crate) term_started: Option<Instant>,
    pub(crate) terms_started: u64,
    pub(crate) terms_ended: TermsEnded,
    pub(crate) renewals_ok: u64,
    pub(crate) renewals_failed: u64,
    pub(crate) calls_abandoned: u64,
    pub(crate) last_call_rtt: Option<Duration>,
}

/// A snapshot of what an elector believes and what it has done. Only
/// `is_leader` has a safety guarantee behind it, evaluated when
/// [`Elector::status`](crate::Elector::status) was called. The counters run
/// over the elector's whole life and never go down.
///
/// `Display` gives one line for a person (never the payload):
///
/// ```text
/// "invoices": node-1 leads (fence 1796116713421019, term 3m12s, 8.1s left); terms 4 (ended: 1 resigned, 2 lost, 0 expired, 0 fatal, 0 shutdown), renewals 1234 ok 2 failed, 0 abandoned, last call 1.2ms
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Status {
    /// The election's name.
    pub name: String,
    /// This participant's identity.
    pub identity: String,
    /// Whether this participant led when the status was taken.
    pub is_leader: bool,
    /// The fence of the current term, when leading.
    pub fence: Option<u64>,
    /// When the current term ends unless renewed, when leading.
    pub valid_until: Option<Instant>,
    /// When the current term started (when this elector learnt that its
    /// acquire had succeeded), when leading.
    pub term_started: Option<Instant>,
    /// Terms this participant has led.
    pub terms_started: u64,
    /// Terms that have ended, by why. Their sum is `terms_started`, or one
    /// less while a term is live.
    pub terms_ended: TermsEnded,
    /// Renewals the store confirmed, each moving the term's deadline on.
    pub renewals_ok: u64,
    /// Renewals that failed: an error, the lease found lost, or no answer
    /// within the operation timeout.
    pub renewals_failed: u64,
    /// Store calls of any kind given up at the operation timeout (their
    /// outcome unknown; each keeps a worker thread until the store returns).
    pub calls_abandoned: u64,
    /// How long the store call answered last took, from the worker handing
    /// it to the store to the store returning; `None` before any answer.
    pub last_call_rtt: Option<Duration>,
    /// The lease last seen in the store (this participant's own included).
    pub leader: Option<LeaderInfo>,
    /// The most recent failure, cleared by the next successful call.
    pub last_error: Option<ElectionError>,
    /// Guards of a term that has ended are still alive, so this participant
    /// does not campaign until they are dropped (two terms of one process
    /// never overlap in user code). A program that waits for leadership
    /// while holding its old guard waits here forever.
    pub held_back: bool,
    /// Whether the elector has shut down.
    pub stopped: bool,
}

/// How many terms ended, by why; see [`Status::terms_ended`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TermsEnded {
    /// The program resigned: [`LeaderGuard::resign`](crate::LeaderGuard::resign), or its last guard of
    /// the live term dropped.
    pub resigned: u64,
    /// A renewal found the lease gone or held by someone else.
    pub lost: u64,
    /// The deadline passed locally before a renewal confirmed the lease
    /// (renewals failing, hanging, or a store unreachable).
    pub expired: u64,
    /// A renewal failed with an error that will not fix itself.
    pub fatal: u64,
    /// The elector shut down.
    pub shutdown: u64,
}

impl TermsEnded {
    /// All terms that ended, for any reason.
    pub fn total(&self) -> u64 {
        self.resigned + self.lost + self.expired + self.fatal + self.shutdown
    }

    fn count(&mut self, reason: EndReason) -> &mut u64 {
        match reason {
            EndReason::Resigned => &mut self.resigned,
            EndReason::LeaseLost => &mut self.lost,
            EndReason::ExpiredLocally => &mut self.expired,
            EndReason::Fatal => &mut self.fatal,
            EndReason::Shutdown => &mut self.shutdown,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = Instant::now();
        write!(f, "{:?}: {}", self.name, self.identity)?;
        match (&self.leader, self.fence) {
            _ if self.stopped => f.write_str(": stopped")?,
            (_, Some(fence)) if self.is_leader => {
                write!(f, " leads (fence {fence}")?;
                if let Some(t) = self.term_started {
                    write!(f, ", term {}", short(now.saturating_duration_since(t)))?;
                }
                if let Some(t) = self.valid_until {
                    write!(f, ", {} left", short(t.saturating_duration_since(now)))?;
                }
                f.write_str(")")?;
            }
            // The last lease it read was its own: that term is over.
            (Some(l), _) if l.identity == self.identity => {
                write!(f, ": nobody leads (its own term with fence {} has ended)", l.fence)?
            }
            (Some(l), _) if l.identity.is_empty() => write!(
                f,
                ": nobody leads (the lease with fence {} is held for nobody after a database failover)",
                l.fence
            )?,
            (Some(l), _) if l.valid => write!(f, " follows {} (fence {})", l.identity, l.fence)?,
            (Some(l), _) => write!(f, ": nobody leads ({}'s lease with fence {} has expired)", l.identity, l.fence)?,
            (None, _) => f.write_str(": nobody leads")?,
        }
        if self.held_back && !self.is_leader {
            f.write_str(", held back by guards of an ended term")?;
        }
        let e = &self.terms_ended;
        write!(
            f,
            "; terms {} (ended: {} resigned, {} lost, {} expired, {} fatal, {} shutdown), renewals {} ok {} failed, {} \
             abandoned, last call ",
            self.terms_started,
            e.resigned,
            e.lost,
            e.expired,
            e.fatal,
            e.shutdown,
            self.renewals_ok,
            self.renewals_failed,
            self.calls_abandoned,
        )?;
        match self.last_call_rtt {
            Some(rtt) => write!(f, "{}", short(rtt))?,
            None => f.write_str("none yet")?,
        }
        if let Some(err) = &self.last_error {
            write!(f, "; last error: {err}")?;
        }
        Ok(())
    }
}

/// `d` to two or three significant figures, as a person reads a status
/// line: `3m12s`, `8.1s`, `1.2ms`.
fn short(d: Duration) -> Human {
    let unit = match d {
        d if d >= Duration::from_secs(60) => Duration::from_secs(1),
        d if d >= Duration::from_secs(1) => Duration::from_millis(100),
        d if d >= Duration::from_millis(1) => Duration::from_micros(100),
        _ => Duration::from_micros(1),
    };
    let units = (d.as_nanos() + unit.as_nanos() / 2) / unit.as_nanos();
    Human(Duration::from_nanos(u64::try_from(units * unit.as_nanos()).unwrap_or(u64::MAX)))
}

/// A lease as last seen in the store.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The holder's identity.
    pub identity: String,
    /// Its fence.
    pub fence: u64,
    /// What it published.
    pub payload: Vec<u8>,
    /// Whether the lease was still valid when read.
    pub valid: bool,
    /// When it was read.
    pub seen_at: Instant,
}

impl fmt::Debug for LeaderInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderInfo")
            .field("identity", &self.identity)
            .field("fence", &self.fence)
            .field("payload_len", &self.payload.len())
            .field("valid", &self.valid)
            .finish()
    }
}

/// Whether `e` is a failed renewal.
pub(crate) fn is_renewal(e: &ElectionError) -> bool {
    matches!(e, ElectionError::Store { op: OpKind::Renew, .. } | ElectionError::Timeout { op: OpKind::Renew, .. })
}

/// Where the figures change, one method per event: each bumps the figure
/// [`Status`] shows and, with the `metrics` feature, the exported metric.
/// Called by the renewal thread only, with the state locked.
pub(crate) struct Counters {
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::Metrics>,
}

impl Counters {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(election: &str) -> Counters {
        Counters {
            #[cfg(feature = "metrics")]
            metrics: Some(crate::metrics::Metrics::new(election)),
        }
    }

    /// Figures for [`Status`] only, no metric series: a group's elections,
    /// thousands of them, would each register a dozen series (the group
    /// exports figures of its own).
    pub(crate) fn unexported() -> Counters {
        Counters {
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    pub(crate) fn term_started(&self, fig: &mut Figures) {
        fig.terms_started += 1;
        fig.term_started = Some(Instant::now());
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.term_started();
        }
    }

    pub(crate) fn term_ended(&self, fig: &mut Figures, reason: EndReason) {
        *fig.terms_ended.count(reason) += 1;
        fig.term_started = None;
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.term_ended(reason);
        }
    }

    pub(crate) fn renewed(&self, fig: &mut Figures) {
        fig.renewals_ok += 1;
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.renewal(true);
        }
    }

    /// A failed call, as the machine reported it: a renewal failure, a store
    /// error by kind, a call abandoned at the timeout.
    pub(crate) fn failed(&self, fig: &mut Figures, e: &ElectionError) {
        if is_renewal(e) {
            fig.renewals_failed += 1;
            #[cfg(feature = "metrics")]
            if let Some(m) = &self.metrics {
                m.renewal(false);
            }
        }
        match e {
            ElectionError::Timeout { .. } => {
                fig.calls_abandoned += 1;
                #[cfg(feature = "metrics")]
                if let Some(m) = &self.metrics {
                    m.abandoned();
                }
            }
            #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
            ElectionError::Store { error, .. } =>
            {
                #[cfg(feature = "metrics")]
                if let Some(m) = &self.metrics {
                    m.store_error(error.kind());
                }
            }
            _ => {}
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn call_returned(&self, fig: &mut Figures, op: OpKind, took: Duration) {
        fig.last_call_rtt = Some(took);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.call_returned(op, took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    fn status(identity: &str) -> Status {
        Status {
            name: "invoices".into(),
            identity: identity.into(),
            is_leader: false,
            fence: None,
            valid_until: None,
            term_started: None,
            terms_started: 4,
            terms_ended: TermsEnded { resigned: 1, lost: 2, expired: 0, fatal: 0, shutdown: 0 },
            renewals_ok: 1234,
            renewals_failed: 2,
            calls_abandoned: 0,
            last_call_rtt: Some(Duration::from_micros(1_234)),
            leader: None,
            last_error: None,
            held_back: false,
            stopped: false,
        }
    }

    fn seen(identity: &str, valid: bool) -> Option<LeaderInfo> {
        let (identity, payload, seen_at) = (identity.into(), b"secret".to_vec(), Instant::now());
        Some(LeaderInfo { identity, fence: 17, payload, valid, seen_at })
    }

    const COUNTS: &str = "terms 4 (ended: 1 resigned, 2 lost, 0 expired, 0 fatal, 0 shutdown), renewals 1234 ok 2 \
                          failed, 0 abandoned, last call 1.2ms";

    #[test]
    fn the_status_line_of_a_leader_says_its_fence_how_long_it_has_led_and_has_left() {
        let now = Instant::now();
        let Some(started) = now.checked_sub(Duration::from_secs(192)) else { return }; // a clock near its origin
        let st = Status {
            is_leader: true,
            fence: Some(1796),
            term_started: Some(started),
            valid_until: Some(now + Duration::from_millis(8_120)),
            leader: seen("node-1", true),
            ..status("node-1")
        };
        assert_eq!(st.to_string(), format!("\"invoices\": node-1 leads (fence 1796, term 3m12s, 8.1s left); {COUNTS}"));
    }

    #[test]
    fn the_status_line_of_a_follower_names_the_leader_and_never_the_payload() {
        let st = Status { leader: seen("node-1", true), ..status("node-2") };
        assert_eq!(st.to_string(), format!("\"invoices\": node-2 follows node-1 (fence 17); {COUNTS}"));
        let held = Status { held_back: true, ..st.clone() };
        assert_eq!(
            held.to_string(),
            format!("\"invoices\": node-2 follows node-1 (fence 17), held back by guards of an ended term; {COUNTS}")
        );
        assert!(!format!("{st} {st:?}").contains("secret"));
    }

    #[test]
    fn the_status_line_says_why_nobody_leads() {
        let error = ElectionError::store(OpKind::Inspect, StoreError::fatal("relation \"leases\" does not exist"));
        let st = Status { last_error: Some(error), last_call_rtt: None, ..status("node-2") };
        let counts = COUNTS.replace("1.2ms", "none yet");
        assert_eq!(
            st.to_string(),
            format!(
                "\"invoices\": node-2: nobody leads; {counts}; last error: inspect failed: relation \"leases\" does not \
                 exist"
            )
        );
        let expired = Status { leader: seen("node-1", false), ..status("node-2") };
        assert_eq!(
            expired.to_string(),
            format!("\"invoices\": node-2: nobody leads (node-1's lease with fence 17 has expired); {COUNTS}")
        );
        let held = Status { leader: seen("", false), ..status("node-2") };
        assert_eq!(
            held.to_string(),
            format!(
                "\"invoices\": node-2: nobody leads (the lease with fence 17 is held for nobody after a database \
                 failover); {COUNTS}"
            )
        );
        let own = Status { leader: seen("node-2", true), held_back: true, ..status("node-2") };
        assert_eq!(
            own.to_string(),
            format!(
                "\"invoices\": node-2: nobody leads (its own term with fence 17 has ended), held back by guards of an \
                 ended term; {COUNTS}"
            )
        );
        let stopped = Status { stopped: true, ..status("node-2") };
        assert_eq!(stopped.to_string(), format!("\"invoices\": node-2: stopped; {COUNTS}"));
    }

    /// A writer that takes `left` writes and fails every one after.
    struct FailsAfter {
        left: usize,
        out: String,
    }

    impl fmt::Write for FailsAfter {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            if self.left == 0 {
                return Err(fmt::Error);
            }
            self.left -= 1;
            self.out.push_str(s);
            Ok(())
        }
    }

    // A sink that fails (a closed log pipe, a full buffer) stops the line
    // at that write and reports it: never a panic, never a line that goes
    // on past the failure.
    #[test]
    fn a_failing_writer_stops_the_status_line_and_gets_the_error() {
        use std::fmt::Write as _;
        let now = Instant::now();
        let Some(started) = now.checked_sub(Duration::from_secs(192)) else { return }; // a clock near its origin
        let error = ElectionError::store(OpKind::Renew, StoreError::retryable("connection reset"));
        let lines = [
            Status {
                is_leader: true,
                fence: Some(1796),
                term_started: Some(started),
                valid_until: Some(now + Duration::from_secs(8)),
                last_error: Some(error.clone()),
                ..status("node-1")
            },
            Status { is_leader: true, fence: Some(1796), leader: seen("node-1", true), ..status("node-1") },
            Status { leader: seen("", false), last_error: Some(error), ..status("node-2") },
            Status { leader: seen("node-1", true), held_back: true, last_call_rtt: None, ..status("node-2") },
        ];
        // A leader whose term's start and deadline are not known says neither.
        assert_eq!(lines[1].to_string(), format!("\"invoices\": node-1 leads (fence 1796); {COUNTS}"));
        for st in lines {
            let full = st.to_string();
            let mut failures = 0;
            for left in 0.. {
                let mut w = FailsAfter { left, out: String::new() };
                let result = write!(w, "{st}");
                assert!(full.starts_with(&w.out), "{:?} is not the start of {full:?}", w.out);
                if result.is_ok() {
                    break;
                }
                failures += 1;
                assert!(w.out.len() < full.len(), "failed after writing it all: {full:?}");
            }
            assert!(failures >= 5, "{failures} writes for {full:?}");
        }
    }

    // Which failures the counters count: a renewal's (an error or no
    // answer) as a failed renewal, any call given up at the timeout as
    // abandoned, and nothing for a call that was never sent.
    #[test]
    fn failed_calls_count_as_failed_renewals_and_abandoned_calls_by_what_they_were() {
        let counters = Counters::unexported();
        let mut fig = Figures::default();
        let after = Duration::from_millis(300);
        counters.failed(&mut fig, &ElectionError::store(OpKind::Renew, StoreError::retryable("reset")));
        assert_eq!((fig.renewals_failed, fig.calls_abandoned), (1, 0));
        counters.failed(&mut fig, &ElectionError::Timeout { op: OpKind::Renew, after });
        assert_eq!((fig.renewals_failed, fig.calls_abandoned), (2, 1));
        counters.failed(&mut fig, &ElectionError::Timeout { op: OpKind::Inspect, after });
        assert_eq!((fig.renewals_failed, fig.calls_abandoned), (2, 2));
        counters.failed(&mut fig, &ElectionError::store(OpKind::Acquire, StoreError::fatal("denied")));
        counters.failed(&mut fig, &ElectionError::TooManyHungCalls { hung: 4 });
        counters.failed(&mut fig, &ElectionError::NotLeading);
        assert_eq!((fig.renewals_failed, fig.calls_abandoned), (2, 2), "none of them a renewal or abandoned");
    }

    #[test]
    fn status_durations_keep_two_or_three_figures() {
        let cases = [(192_400, "3m12s"), (8_149, "8.1s"), (999, "999ms"), (1, "1ms"), (0, "0s")];
        for (ms, want) in cases {
            assert_eq!(short(Duration::from_millis(ms)).to_string(), want, "{ms} ms");
        }
        assert_eq!(short(Duration::from_micros(1_249)).to_string(), "1.2ms");
        assert_eq!(short(Duration::from_nanos(12_345)).to_string(), "12us");
        assert_eq!(TermsEnded { resigned: 1, lost: 2, expired: 3, fatal: 4, shutdown: 5 }.total(), 15);
    }
}
