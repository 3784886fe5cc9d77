//! The judge of every chaos scenario, and the participants it judges.
//!
//! All participants of a scenario are electors in the test process, so one
//! monotonic clock ([`Instant`]) orders everything they do. Each
//! [`Participant`] runs a watcher thread that holds its guard the way a real
//! worker does, sampling [`LeaderGuard::is_valid`] every fraction of a
//! millisecond, and reports one [`Interval`] per term: from the first to the
//! last instant it saw the guard valid. Its store is wrapped in [`Recorded`],
//! which reports every store call with its send and return instants and
//! whether it confirmed the lease for this participant.
//!
//! [`Oracle::check`] then judges the run:
//! 1. no two intervals overlap (different participants, or one participant's
//!    consecutive terms);
//! 2. fences strictly increase from term to term, in start order;
//! 3. every interval ends within `lease` of its participant's latest
//!    confirmed send before that end, so a participant cut off from the
//!    database stops leading within the lease of its last confirmed send.
//!
//! Liveness (someone leads again in time) is the scenario's job, through
//! [`Oracle::wait_leader`].
//!
//! Also here: [`Skewed`], a store wrapper that moves every database instant
//! by a fixed offset (the library must not care), and [`Switch`], one that
//! cuts a single participant off from the database.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::forward_calls;
use leaderelection::{Config, DbTime, Elector, LeaderGuard, Lease, OpKind, Store, StoreError, Timing, WaitLeaderError};

/// How long the watcher sleeps between two samples of a held guard. Linux
/// rounds it up to roughly 0.25 ms, inside the ~0.5 ms the oracle promises.
const SAMPLE_EVERY: Duration = Duration::from_micros(200);
/// How long the watcher blocks for a guard before looking at its stop flag.
const WAIT_SLICE: Duration = Duration::from_millis(20);
/// An open interval whose latest sample is younger than this is leading now.
const FRESH: Duration = Duration::from_millis(5);

/// One term as a participant's watcher saw it: `start` and `end` are the
/// first and the latest instants at which it observed its guard valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub participant: String,
    pub fence: u64,
    pub start: Instant,
    pub end: Instant,
    /// The watcher still holds the term; `end` is its latest sample so far.
    pub open: bool,
}

/// One store call of a participant, as [`Recorded`] saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub participant: String,
    pub op: OpKind,
    /// Read just before the call went to the inner store.
    pub sent: Instant,
    /// Read just after it returned, before the elector saw the answer.
    pub returned: Instant,
    /// `acquire` or `renew` answered with a lease this participant holds.
    pub confirmed: bool,
}

/// A broken rule, with instants in milliseconds after the oracle started.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// Two terms were valid at once (both of one participant, possibly).
    Overlap { first: (String, u64), second: (String, u64), from_ms: f64, to_ms: f64 },
    /// A term started later than another without a higher fence.
    FenceNotIncreasing { earlier: (String, u64), later: (String, u64), later_start_ms: f64 },
    /// A term was still valid more than the lease after its participant's
    /// latest confirmed send before that (`None`: it had no confirmed send).
    LateValidity { term: (String, u64), end_ms: f64, last_confirmed_send_ms: Option<f64>, lease: Duration },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second, from_ms, to_ms } => write!(
                f,
                "overlap: {}#{} and {}#{} both valid from {from_ms:.1} ms to {to_ms:.1} ms",
                first.0, first.1, second.0, second.1
            ),
            Violation::FenceNotIncreasing { earlier, later, later_start_ms } => write!(
                f,
                "fence not increasing: {}#{} started at {later_start_ms:.1} ms after {}#{}",
                later.0, later.1, earlier.0, earlier.1
            ),
            Violation::LateValidity { term, end_ms, last_confirmed_send_ms: Some(sent), lease } => write!(
                f,
                "late validity: {}#{} valid at {end_ms:.1} ms, {:.1} ms after its last confirmed send at \
                 {sent:.1} ms (lease {lease:?})",
                term.0,
                term.1,
                end_ms - sent
            ),
            Violation::LateValidity { term, end_ms, last_confirmed_send_ms: None, .. } => {
                write!(f, "late validity: {}#{} valid at {end_ms:.1} ms with no confirmed send before", term.0, term.1)
            }
        }
    }
}

/// The figures of a run that passed, for the scenario to print.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub terms: usize,
    /// The terms' fences, in start order.
    pub fences: Vec<u64>,
    /// Who led, in the order they first did.
    pub leaders: Vec<String>,
    /// Largest gap from one term's end to the next one's start.
    pub max_failover: Duration,
    /// Largest (interval end - latest confirmed send before it).
    pub max_valid_after_send: Duration,
    /// Time from the oracle's start to the last term's end with nobody valid.
    pub leaderless: Duration,
    /// From the oracle's start to the last term's end.
    pub span: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} terms by [{}], fences {:?}; max failover {:.1} ms; max valid after confirmed send {:.1} ms; \
             leaderless {:.1} ms of {:.1} ms",
            self.terms,
            self.leaders.join(", "),
            self.fences,
            ms(self.max_failover),
            ms(self.max_valid_after_send),
            ms(self.leaderless),
            ms(self.span)
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// The one judge of a scenario. Participants report to it; the scenario
/// asks it who leads, waits on it, and finally calls [`Oracle::check`].
pub struct Oracle {
    origin: Instant,
    lease: Duration,
    log: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    intervals: Vec<Interval>,
    calls: Vec<Call>,
}

impl Oracle {
    /// An oracle for an election whose lease lasts `lease`; its clock starts now.
    pub fn new(lease: Duration) -> Arc<Oracle> {
        Arc::new(Oracle { origin: Instant::now(), lease, log: Mutex::default() })
    }

    /// The instant violations and figures are measured from.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        // A panicking participant thread must not hide the record from the check.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every term so far, closed and open (open ones end at their latest sample).
    pub fn intervals(&self) -> Vec<Interval> {
        self.log().intervals.clone()
    }

    /// Every store call the participants' [`Recorded`] stores reported.
    pub fn calls(&self) -> Vec<Call> {
        self.log().calls.clone()
    }

    /// Adds a closed term: for synthetic checks of the oracle itself.
    pub fn record_interval(&self, participant: &str, fence: u64, start: Instant, end: Instant) {
        let term = Interval { participant: participant.into(), fence, start, end, open: false };
        self.log().intervals.push(term);
    }

    /// Adds a store call; [`Recorded`] reports through this.
    pub fn record_call(&self, call: Call) {
        self.log().calls.push(call);
    }

    /// Opens a term at its first valid sample; returns its index.
    fn open(&self, participant: &str, fence: u64, at: Instant) -> usize {
        let mut log = self.log();
        log.intervals.push(Interval { participant: participant.into(), fence, start: at, end: at, open: true });
        log.intervals.len() - 1
    }

    fn sample(&self, term: usize, at: Instant) {
        self.log().intervals[term].end = at;
    }

    fn end_of(&self, term: usize) -> Instant {
        self.log().intervals[term].end
    }

    fn close(&self, term: usize) {
        self.log().intervals[term].open = false;
    }

    /// Who holds an open term whose latest sample is under 5 ms old (when
    /// several do, which is a violation, the one that started last).
    pub fn leader_now(&self) -> Option<String> {
        let now = Instant::now();
        let log = self.log();
        let live = log.intervals.iter().filter(|i| i.open && now.saturating_duration_since(i.end) < FRESH);
        live.max_by_key(|i| i.start).map(|i| i.participant.clone())
    }

    /// Waits until someone leads (see [`Oracle::leader_now`]); returns how
    /// long that took, or `None` once `within` has passed.
    pub fn wait_leader(&self, within: Duration) -> Option<Duration> {
        let began = Instant::now();
        loop {
            if self.leader_now().is_some() {
                return Some(began.elapsed());
            }
            if began.elapsed() >= within {
                return None;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Runs every check on the record so far.
    ///
    /// # Errors
    ///
    /// Every violation found, in the order of the checks.
    pub fn check(&self) -> Result<Report, Vec<Violation>> {
        let (mut terms, calls) = {
            let log = self.log();
            (log.intervals.clone(), log.calls.clone())
        };
        terms.sort_by_key(|t| t.start);
        let at = |i: Instant| ms(i.saturating_duration_since(self.origin));
        let name = |t: &Interval| (t.participant.clone(), t.fence);
        let mut violations = Vec::new();

        // 1. No overlaps: every pair, since a long term may overlap several.
        for (k, a) in terms.iter().enumerate() {
            for b in terms[k + 1..].iter().take_while(|b| b.start <= a.end) {
                let (from_ms, to_ms) = (at(b.start), at(a.end.min(b.end)));
                violations.push(Violation::Overlap { first: name(a), second: name(b), from_ms, to_ms });
            }
        }
        // 2. Fences strictly increase in start order.
        for w in terms.windows(2) {
            if w[1].fence <= w[0].fence {
                let later_start_ms = at(w[1].start);
                violations.push(Violation::FenceNotIncreasing {
                    earlier: name(&w[0]),
                    later: name(&w[1]),
                    later_start_ms,
                });
            }
        }
        // 3. Valid no longer than the lease after the latest confirmed send.
        let mut max_valid_after_send = Duration::ZERO;
        for t in &terms {
            let sent = calls
                .iter()
                .filter(|c| c.confirmed && c.participant == t.participant && c.sent <= t.end)
                .map(|c| c.sent)
                .max();
            let late = sent.map(|s| t.end - s);
            max_valid_after_send = max_valid_after_send.max(late.unwrap_or_default());
            if late.is_none_or(|l| l > self.lease) {
                let (end_ms, last_confirmed_send_ms) = (at(t.end), sent.map(at));
                violations.push(Violation::LateValidity {
                    term: name(t),
                    end_ms,
                    last_confirmed_send_ms,
                    lease: self.lease,
                });
            }
        }
        if !violations.is_empty() {
            return Err(violations);
        }

        let mut leaders: Vec<String> = Vec::new();
        for t in &terms {
            if !leaders.contains(&t.participant) {
                leaders.push(t.participant.clone());
            }
        }
        let gaps = terms.windows(2).map(|w| w[1].start.saturating_duration_since(w[0].end));
        let last = terms.last().map_or(self.origin, |t| t.end);
        let span = last.saturating_duration_since(self.origin);
        // The terms do not overlap (checked), so their lengths simply add up.
        let led: Duration = terms.iter().map(|t| t.end - t.start).sum();
        Ok(Report {
            terms: terms.len(),
            fences: terms.iter().map(|t| t.fence).collect(),
            leaders,
            max_failover: gaps.max().unwrap_or_default(),
            max_valid_after_send,
            leaderless: span.saturating_sub(led),
            span,
        })
    }
}

/// How a participant's worker treats its guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Stops acting as leader the moment `is_valid()` turns false.
    Honest,
    /// The negative control: keeps acting as leader (and reporting samples)
    /// for this long after its guard stopped being valid.
    IgnoresDeadline(Duration),
}

/// One elector of a scenario and the watcher thread that holds its guard.
///
/// Its identity is `id`. [`Config`] cannot be taken apart (its store is
/// private), so [`Participant::start`] takes the store, the election's name
/// and the timing instead, and builds the config itself around
/// `Recorded<store>`.
pub struct Participant {
    id: String,
    elector: Arc<Elector>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

impl Participant {
    /// An honest participant; see [`Participant::start_with`].
    pub fn start(
        oracle: &Arc<Oracle>, id: &str, store: impl Store + 'static, name: &str, timing: Timing,
    ) -> Participant {
        Participant::start_with(oracle, id, store, name, timing, Behaviour::Honest)
    }

    /// Starts an elector with identity `id` in election `name` on
    /// `Recorded<store>`, and its watcher: it blocks for a guard, then samples
    /// `is_valid()` every ~0.25 ms while it holds one, reporting one
    /// [`Interval`] per term to `oracle`.
    ///
    /// # Panics
    ///
    /// When the elector refuses to start (an invalid timing, say).
    pub fn start_with(
        oracle: &Arc<Oracle>, id: &str, store: impl Store + 'static, name: &str, timing: Timing, behaviour: Behaviour,
    ) -> Participant {
        let recorded = Recorded::new(store, Arc::clone(oracle), id);
        let config = Config::new(recorded, name).identity(id).timing(timing);
        let elector = Arc::new(Elector::start(config).unwrap_or_else(|e| panic!("participant {id}: {e}")));
        let stop = Arc::new(AtomicBool::new(false));
        let (o, e, s, who) = (Arc::clone(oracle), Arc::clone(&elector), Arc::clone(&stop), id.to_string());
        let watcher = thread::Builder::new()
            .name(format!("watcher-{id}"))
            .spawn(move || watch(&o, &e, &s, &who, behaviour))
            .expect("spawn watcher");
        Participant { id: id.into(), elector, stop, watcher: Some(watcher) }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether its elector leads right now.
    pub fn is_leader(&self) -> bool {
        self.elector.is_leader()
    }

    pub fn elector(&self) -> &Elector {
        &self.elector
    }

    /// Like a SIGKILL: stops without releasing the lease, so a successor
    /// waits for it to run out. The open term closes at its last valid sample.
    pub fn crash(mut self) {
        self.finish(false);
    }

    /// Graceful: shuts down, releasing the lease; returns when done.
    pub fn stop(mut self) {
        self.finish(true);
    }

    /// Raises the stop flag first, so a dishonest watcher stops pretending,
    /// then ends the term through the elector (the watcher never drops a live
    /// guard, which would resign it), then joins the watcher.
    fn finish(&mut self, release: bool) {
        let Some(watcher) = self.watcher.take() else { return };
        self.stop.store(true, Ordering::SeqCst);
        if release {
            let _ = self.elector.shutdown();
        } else {
            self.elector.shutdown_without_release();
        }
        if watcher.join().is_err() {
            panic!("watcher of {} panicked", self.id);
        }
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        if !thread::panicking() {
            self.finish(true);
        } else if self.watcher.is_some() {
            // Still stop the threads, but do not panic again over the watcher.
            self.stop.store(true, Ordering::SeqCst);
            let _ = self.elector.shutdown();
        }
    }
}

/// The watcher: one interval per term, then back to waiting.
fn watch(oracle: &Oracle, elector: &Elector, stop: &AtomicBool, id: &str, behaviour: Behaviour) {
    while !stop.load(Ordering::SeqCst) {
        let guard = match elector.wait_leader_timeout(WAIT_SLICE) {
            Ok(guard) => guard,
            Err(WaitLeaderError::Timeout) => continue,
            Err(_) => return,
        };
        let Some(term) = hold(oracle, &guard, id) else { continue };
        if let Behaviour::IgnoresDeadline(extra) = behaviour {
            let until = oracle.end_of(term) + extra;
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                oracle.sample(term, Instant::now());
                thread::sleep(SAMPLE_EVERY);
            }
        }
        oracle.close(term);
        // Only now, with the term over, is the guard dropped.
        drop(guard);
    }
}

/// Samples `guard` until it turns invalid; the index of its interval, or
/// `None` when it was never seen valid.
fn hold(oracle: &Oracle, guard: &LeaderGuard, id: &str) -> Option<usize> {
    let mut term = None;
    while guard.is_valid() {
        let now = Instant::now();
        match term {
            None => term = Some(oracle.open(id, guard.fence(), now)),
            Some(t) => oracle.sample(t, now),
        }
        thread::sleep(SAMPLE_EVERY);
    }
    term
}

/// A participant's store, reporting every call to the oracle.
pub struct Recorded<S> {
    inner: S,
    oracle: Arc<Oracle>,
    identity: String,
}

impl<S: Store> Recorded<S> {
    /// Reports `inner`'s calls as those of participant `identity`.
    pub fn new(inner: S, oracle: Arc<Oracle>, identity: &str) -> Recorded<S> {
        Recorded { inner, oracle, identity: identity.into() }
    }

    /// Runs `f` on the inner store and reports it before its answer goes back.
    fn call<T>(
        &self, op: OpKind, f: impl FnOnce(&S) -> Result<T, StoreError>, confirms: impl FnOnce(&T) -> bool,
    ) -> Result<T, StoreError> {
        let sent = Instant::now();
        let result = f(&self.inner);
        let returned = Instant::now();
        let confirmed = result.as_ref().is_ok_and(confirms);
        let participant = self.identity.clone();
        self.oracle.record_call(Call { participant, op, sent, returned, confirmed });
        result
    }
}

impl<S: Store> Store for Recorded<S> {
    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        // The elector's identity (its instance tag included) is what it holds under.
        self.call(OpKind::Acquire, |s| s.acquire(name, identity, ttl, payload, timeout), |l| l.held_by(identity))
    }
    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.call(OpKind::Renew, |s| s.renew(name, identity, fence, ttl, payload, timeout), |l| l.held_by(identity))
    }
    fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError> {
        self.call(OpKind::Release, |s| s.release(name, identity, fence, timeout), |_| false)
    }
    fn inspect(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
        // A read confirms nothing: it extends no lease.
        self.call(OpKind::Inspect, |s| s.inspect(name, timeout), |_| false)
    }
}

/// A store whose database clock reads `offset_micros` away from the inner
/// one's: every [`DbTime`] of every returned [`Lease`] is moved by it.
/// Participants that each see the database days away, differently, must
/// elect exactly as if they did not.
pub struct Skewed<S> {
    inner: S,
    offset_micros: i64,
}

impl<S: Store> Skewed<S> {
    /// `offset_micros` may be negative (the clock reads behind).
    pub fn new(inner: S, offset_micros: i64) -> Skewed<S> {
        Skewed { inner, offset_micros }
    }

    /// The calls answering a lease go through here: its times are moved.
    fn shifted(
        &self, _call: &str, _timeout: Duration, f: impl FnOnce() -> Result<Lease, StoreError>,
    ) -> Result<Lease, StoreError> {
        let result = f();
        let by = |t: DbTime| DbTime::from_unix_micros(t.as_unix_micros().saturating_add(self.offset_micros));
        result.map(|l| Lease {
            acquired_at: by(l.acquired_at),
            renewed_at: by(l.renewed_at),
            expires_at: by(l.expires_at),
            now: by(l.now),
            ..l
        })
    }
}

impl<S: Store> Store for Skewed<S> {
    forward_calls!(inner via Self::shifted => acquire, renew, inspect);
    forward_calls!(inner => release);
}

/// How a [`Switch`] that is off fails a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// At once, with a retryable error (a refused connection).
    Fail,
    /// After blocking for the call's whole timeout, with a retryable error
    /// (packets dropped). The inner store is not called.
    Hang,
}

const ON: u8 = 0;
const FAIL: u8 = 1;
const HANG: u8 = 2;

/// A store that can be cut off from its inner one, for one participant:
/// clones share the switch, so the scenario keeps one to flip.
#[derive(Clone)]
pub struct Switch<S> {
    inner: S,
    state: Arc<AtomicU8>,
}

impl<S: Store> Switch<S> {
    /// Switched on: every call goes through.
    pub fn new(inner: S) -> Switch<S> {
        Switch { inner, state: Arc::new(AtomicU8::new(ON)) }
    }

    /// From now on every call fails as `how` says.
    pub fn cut(&self, how: Cut) {
        self.state.store(if how == Cut::Fail { FAIL } else { HANG }, Ordering::SeqCst);
    }

    /// From now on calls go through again.
    pub fn restore(&self) {
        self.state.store(ON, Ordering::SeqCst);
    }

    /// Every call goes through here: to the inner store while on, failing
    /// as the cut says while off.
    fn gate<T>(
        &self, _call: &str, timeout: Duration, f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.state.load(Ordering::SeqCst) {
            ON => f(),
            FAIL => Err(StoreError::retryable("switch: connection refused")),
            _ => {
                thread::sleep(timeout);
                Err(StoreError::retryable("switch: timed out"))
            }
        }
    }
}

impl<S: Store> Store for Switch<S> {
    forward_calls!(inner via Self::gate => acquire, renew, release, inspect);
}
