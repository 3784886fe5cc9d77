//! The election as a pure state machine: no threads, no clock reads, no I/O.
//!
//! [`Machine`] is what the threaded [`Elector`](crate::Elector) runs and what
//! the simulation drives on virtual time, so both exercise the same code.
//!
//! # The driver loop
//!
//! A driver owns a `Machine`, a local monotonic clock and a way to run store
//! calls. It repeats:
//!
//! 1. read the clock into `now` and hand the machine whatever happened:
//!    [`Machine::handle_reply`] for a store answer,
//!    [`Machine::handle_timeout`] when the wake-up time passed (calling it
//!    early is harmless), [`Machine::shutdown`], [`Machine::resign`],
//!    [`Machine::set_hold_back`];
//! 2. drain [`Machine::poll_output`]: start each [`Output::Call`] on the store
//!    at once (its `sent_at` is the `now` of step 1, taken before sending),
//!    publish [`Output::TermStarted`] / [`Output::DeadlineExtended`] to the
//!    watchdog, invalidate the term on [`Output::TermEnded`], stop waiting on a
//!    call after [`Output::CallAbandoned`], exit on [`Output::Stopped`];
//! 3. sleep until [`Machine::poll_timeout`] or until a reply or command
//!    arrives.
//!
//! ```
//! use leaderelection::machine::{LocalTime, Machine, MachineConfig, Output};
//! use leaderelection::{MemStore, Timing};
//! use std::time::Duration;
//!
//! let store = MemStore::new();
//! let timing = Timing::default();
//! let mut m = Machine::new(MachineConfig::new("me", timing, 42));
//! let mut now = LocalTime::ZERO;
//! m.handle_timeout(now);
//! let mut fence = None;
//! while fence.is_none() {
//!     match m.poll_output() {
//!         Some(Output::Call(call)) => {
//!             let outcome = call.op.run(&store, "jobs", "me", b"", timing.operation_timeout);
//!             now = now + Duration::from_millis(1);
//!             m.handle_reply(now, call.id, outcome);
//!         }
//!         Some(Output::TermStarted { fence: f, .. }) => fence = Some(f),
//!         Some(_) => {}
//!         None => {
//!             now = m.poll_timeout().unwrap();
//!             m.handle_timeout(now);
//!         }
//!     }
//! }
//! assert_eq!(fence, store.peek("jobs").map(|l| l.fence)); // the fence the database gave
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::ops::Add;
use std::time::Duration;

use crate::error::{ElectionError, OpKind};
use crate::lease::{DbTime, Lease};
use crate::store::{Store, StoreError};
use crate::timing::Timing;

/// A reading of the local monotonic clock, as a distance from an origin the
/// driver chooses (the elector's start, or zero in a simulation).
///
/// It never meets a [`DbTime`]: the two cannot be compared.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct LocalTime(Duration);

impl LocalTime {
    /// The driver's origin.
    pub const ZERO: LocalTime = LocalTime(Duration::ZERO);

    /// The instant `d` after the origin.
    pub const fn from_duration(d: Duration) -> LocalTime {
        LocalTime(d)
    }

    /// The distance from the origin.
    pub const fn as_duration(self) -> Duration {
        self.0
    }

    /// The time from `earlier` to `self`, or zero.
    pub fn saturating_since(self, earlier: LocalTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// `self - d`, stopping at the origin.
    pub fn saturating_sub(self, d: Duration) -> LocalTime {
        LocalTime(self.0.saturating_sub(d))
    }
}

impl Add<Duration> for LocalTime {
    type Output = LocalTime;
    fn add(self, d: Duration) -> LocalTime {
        LocalTime(self.0.saturating_add(d))
    }
}

/// Names one store call, so a late answer to an abandoned call is ignored.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct CallId(pub u64);

/// Names one term of this participant (not the fence: a counter local to
/// the machine).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TermId(pub u64);

/// A store operation the machine asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    /// [`Store::inspect`].
    Inspect,
    /// [`Store::acquire`] with this TTL.
    Acquire {
        /// The lease duration asked for.
        ttl: Duration,
    },
    /// [`Store::renew`] of this fence with this TTL.
    Renew {
        /// The term's fence.
        fence: u64,
        /// The lease duration asked for.
        ttl: Duration,
    },
    /// [`Store::release`] of this fence.
    Release {
        /// The fence to release.
        fence: u64,
    },
}

impl Op {
    /// Runs this operation on `store` for participant `identity` in election
    /// `name`, publishing `payload`, and wraps the answer for
    /// [`Machine::handle_reply`]. Blocks for the store call.
    pub fn run<S: Store + ?Sized>(
        self, store: &S, name: &str, identity: &str, payload: &[u8], timeout: Duration,
    ) -> Outcome {
        match self {
            Op::Inspect => Outcome::Lease(store.inspect(name, timeout)),
            Op::Acquire { ttl } => Outcome::Lease(store.acquire(name, identity, ttl, payload, timeout)),
            Op::Renew { fence, ttl } => Outcome::Lease(store.renew(name, identity, fence, ttl, payload, timeout)),
            Op::Release { fence } => Outcome::Released(store.release(name, identity, fence, timeout)),
        }
    }

    /// The operation's name.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Inspect => OpKind::Inspect,
            Op::Acquire { .. } => OpKind::Acquire,
            Op::Renew { .. } => OpKind::Renew,
            Op::Release { .. } => OpKind::Release,
        }
    }
}

/// A store call to start now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Call {
    /// Hand this back with the answer.
    pub id: CallId,
    /// What to do.
    pub op: Op,
}

/// The answer to a [`Call`].
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The answer to inspect, acquire or renew.
    Lease(Result<Lease, StoreError>),
    /// The answer to release.
    Released(Result<(), StoreError>),
}

/// Why a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The deadline passed before a renewal confirmed the lease.
    ExpiredLocally,
    /// The store said the lease is no longer ours.
    LeaseLost,
    /// A renewal failed with an error that will not fix itself.
    Fatal,
    /// The program resigned (explicitly, or by dropping its last guard).
    Resigned,
    /// The elector is shutting down.
    Shutdown,
}

/// What the machine tells its driver.
#[derive(Clone, Debug)]
pub enum Output {
    /// Start this store call now.
    Call(Call),
    /// The store call `id` ran past the operation timeout and counts as
    /// failed with an unknown outcome; its answer will be ignored.
    CallAbandoned(CallId),
    /// A term began: arm the watchdog for `deadline`.
    TermStarted {
        /// The term.
        term: TermId,
        /// Its fencing token.
        fence: u64,
        /// When it must end unless extended.
        deadline: LocalTime,
    },
    /// A renewal moved the live term's deadline.
    DeadlineExtended {
        /// The term.
        term: TermId,
        /// The new deadline.
        deadline: LocalTime,
    },
    /// The term ended; invalidate it before anything else.
    TermEnded {
        /// The term.
        term: TermId,
        /// Its fence.
        fence: u64,
        /// Why.
        reason: EndReason,
    },
    /// A new (holder, fence) pair was seen holding a valid lease.
    NewLeader {
        /// The holder's identity.
        identity: String,
        /// The holder's fence.
        fence: u64,
    },
    /// A release finished (or failed, or timed out).
    Released {
        /// The fence released.
        fence: u64,
        /// Its result.
        result: Result<(), ElectionError>,
    },
    /// A call failed; for logs. The error is also in [`Machine::last_error`].
    Failed(ElectionError),
    /// Shutdown finished; nothing more will come.
    Stopped,
}

/// What a [`Machine`] needs to know about its participant.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// This participant's identity.
    pub identity: String,
    /// The durations.
    pub timing: Timing,
    /// Release the lease on shutdown.
    pub release_on_shutdown: bool,
    /// Seed of the jitter generator.
    pub seed: u64,
    /// Jitter follower polls (±20 % of the retry period, the first after a
    /// new leader anywhere in 0.2 to 1.2 periods), so that followers in
    /// different processes do not poll in step. On by default. A
    /// [`Group`](crate::Group) turns it off: its followers' polls go out
    /// together in one batched statement per retry period, and the
    /// processes of a group poll on grids of their own.
    pub poll_jitter: bool,
    /// This machine's terms are numbered from `term_ids_from + 1`. A group
    /// gives each election's machine a range of its own, so a [`TermId`]
    /// names one election's term across the whole group.
    pub term_ids_from: u64,
    /// **Broken on purpose; for negative controls only.** Anchors the
    /// deadline at the reply instead of the request, which is unsafe.
    #[doc(hidden)]
    pub unsafe_anchor_at_reply: bool,
    /// **Broken on purpose; for negative controls only.** A wake
    /// ([`Machine::handle_wake`]) starts a term at once under the next
    /// fence, as if the claim had been granted, instead of sending the
    /// conditional claim: every woken follower then leads.
    #[doc(hidden)]
    pub unsafe_lead_on_wake: bool,
}

impl MachineConfig {
    /// A participant with these timings, releasing on shutdown.
    pub fn new(identity: impl Into<String>, timing: Timing, seed: u64) -> MachineConfig {
        MachineConfig {
            identity: identity.into(),
            timing,
            release_on_shutdown: true,
            seed,
            poll_jitter: true,
            term_ids_from: 0,
            unsafe_anchor_at_reply: false,
            unsafe_lead_on_wake: false,
        }
    }
}

/// The leader this participant last saw in the store.
#[derive(PartialEq, Eq)]
pub struct Observed {
    /// Holder identity.
    pub identity: String,
    /// Its fence.
    pub fence: u64,
    /// What it published.
    pub payload: Vec<u8>,
    /// Whether the lease was still valid when read.
    pub valid: bool,
    /// When it was read (local time of the reply).
    pub at: LocalTime,
}

impl Clone for Observed {
    fn clone(&self) -> Observed {
        Observed {
            identity: self.identity.clone(),
            fence: self.fence,
            payload: self.payload.clone(),
            valid: self.valid,
            at: self.at,
        }
    }

    /// Field by field, into the strings `self` already has: a group copies
    /// every election's sighting each time it reads the lease
    /// (`tests/group_allocations.rs`).
    fn clone_from(&mut self, source: &Observed) {
        self.identity.clone_from(&source.identity);
        self.payload.clone_from(&source.payload);
        self.fence = source.fence;
        self.valid = source.valid;
        self.at = source.at;
    }
}

impl fmt::Debug for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observed")
            .field("identity", &self.identity)
            .field("fence", &self.fence)
            .field("payload_len", &self.payload.len())
            .field("valid", &self.valid)
            .field("at", &self.at)
            .finish()
    }
}

/// A live term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The machine's name for it.
    pub id: TermId,
    /// Its fencing token.
    pub fence: u64,
    /// When it ends unless renewed.
    pub deadline: LocalTime,
}

/// A lease row just read, as the next follower poll is timed from it.
#[derive(Clone, Copy, Debug)]
struct Sighting {
    /// How long the lease stays valid, by the statement that read it.
    ttl: Duration,
    /// Its holder has stopped renewing: this reading and the one before it
    /// show the same holder, fence and `expires_at`, and this one finds the
    /// row unwritten (`now - renewed_at`, both read by the statement) for
    /// longer than a holder with these timings leaves it while its renewals
    /// succeed. Either alone is not enough: two looks inside one renew
    /// interval see a live holder's row unchanged (the first poll after a
    /// new leader comes as soon as 0.2 retry periods), and `renewed_at` is
    /// only as good as the store that writes it.
    stalled: bool,
    /// Another participant holds the lease, valid.
    held_by_other: bool,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    id: CallId,
    op: Op,
    sent_at: LocalTime,
}

/// Whether a machine (one election's, or a group's) runs, is stopping
/// (its elections leaving; then a group's member leaves) or has stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Running,
    Stopping,
    Stopped,
}

/// The election for one participant. See the [module docs](self) for the
/// loop that drives it.
#[derive(Debug)]
pub struct Machine {
    cfg: MachineConfig,
    rng: SplitMix64,
    mode: Mode,
    term: Option<Term>,
    /// The term that ended most recently.
    last_term: Option<Term>,
    inflight: Option<InFlight>,
    /// When to start the next call, if none is in flight.
    next_call_at: Option<LocalTime>,
    /// The next call, if it starts at or after this instant, claims instead
    /// of inspecting. Set to now when an inspect showed a claimable lease.
    /// Set to the observed lease's expiry when the next poll was timed for
    /// it and the lease's holder has stalled ([`Sighting::stalled`]):
    /// inspecting first would only find the lease expired and cost a round
    /// trip. A holder that is still renewing will have extended the lease by
    /// then, and a claim would be a write that changes nothing (on
    /// PostgreSQL it still locks the row, at the instant the holder renews
    /// when the lease is a multiple of the renew interval), so without that
    /// evidence the poll at the expiry inspects, and claims at once if it
    /// finds the lease expired. The direct claim is set only after seeing
    /// another holder's live lease. Once another holder has had the row,
    /// fences only grow, so the claim cannot find this participant's own
    /// older lease and extend it, unless an operator restores an old row in
    /// between; then the claim extends it once and [`Machine::on_acquire`]
    /// releases it at once (as after an inspect and a claim with the restore
    /// between them).
    claim_at: Option<LocalTime>,
    /// The expiry of the lease row last seen (beside `observed`, which has
    /// its holder and fence), to tell a row that stayed the same from one
    /// that was renewed. Cleared when the row was found absent.
    observed_expiry: Option<DbTime>,
    /// A new leader was just observed: spread the next poll over the whole
    /// retry period, so followers that all saw the takeover at the same
    /// instant (they polled together at the old lease's expiry) do not stay
    /// in step and hand-overs keep their full chance of a quick poll.
    spread_next_poll: bool,
    /// A fence this participant may still hold on the server but must not
    /// lead under again: release it before campaigning.
    pending_release: Option<u64>,
    /// Every term must have a fence above this one.
    highest_fence: u64,
    /// This machine has sent a claim. Until it has, every lease of its
    /// identity it sees is an earlier machine's (see
    /// [`Machine::on_inspect`]).
    claimed: bool,
    /// Guards of an ended term are alive: observe, do not campaign.
    hold_back: bool,
    /// The driver allows claims ([`Machine::set_claims_allowed`]); a
    /// group with a fair share withholds them from elections beyond its
    /// share.
    claims_allowed: bool,
    /// The driver lets looks at a lease another participant holds wait
    /// until shortly before it expires ([`Machine::set_lazy_looks`]).
    lazy_looks: bool,
    /// When the look scheduled lazily would have gone without
    /// `lazy_looks`.
    eager_look_at: Option<LocalTime>,
    /// The last look was scheduled lazily.
    looking_lazily: bool,
    /// No acquire before this instant (after a resignation).
    campaign_not_before: LocalTime,
    /// A wake ([`Machine::handle_wake`]) came while a look was in flight,
    /// with the released fence if known: that look may have read the row
    /// before the release, so its answer claims at once even if it shows
    /// the lease held, unless it shows a term later than the one released.
    woken: Option<Option<u64>>,
    next_call_id: u64,
    next_term_id: u64,
    observed: Option<Observed>,
    last_error: Option<ElectionError>,
    outputs: VecDeque<Output>,
}

impl Machine {
    /// A follower that will poll at its first [`Machine::handle_timeout`].
    pub fn new(cfg: MachineConfig) -> Machine {
        let rng = SplitMix64(cfg.seed);
        let first_term = cfg.term_ids_from;
        Machine {
            cfg,
            rng,
            mode: Mode::Running,
            term: None,
            last_term: None,
            inflight: None,
            next_call_at: Some(LocalTime::ZERO),
            claim_at: None,
            observed_expiry: None,
            spread_next_poll: false,
            pending_release: None,
            highest_fence: 0,
            claimed: false,
            hold_back: false,
            claims_allowed: true,
            lazy_looks: false,
            eager_look_at: None,
            looking_lazily: false,
            campaign_not_before: LocalTime::ZERO,
            woken: None,
            next_call_id: 0,
            next_term_id: first_term,
            observed: None,
            last_error: None,
            outputs: VecDeque::new(),
        }
    }

    /// This participant's identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// The timings in force.
    pub fn timing(&self) -> &Timing {
        &self.cfg.timing
    }

    /// The live term, if this participant leads. Its deadline may already
    /// have passed if [`Machine::handle_timeout`] has not been called since;
    /// callers that decide on it compare the deadline with their clock.
    pub fn term(&self) -> Option<Term> {
        self.term
    }

    /// Whether this participant leads at `now`.
    pub fn is_leader(&self, now: LocalTime) -> bool {
        self.term.is_some_and(|t| now < t.deadline)
    }

    /// The highest fence this machine has led under, or found held under
    /// its identity before its first claim (an earlier machine's): it
    /// never leads under it again.
    pub fn highest_fence(&self) -> u64 {
        self.highest_fence
    }

    /// The last lease seen in the store.
    pub fn observed(&self) -> Option<&Observed> {
        self.observed.as_ref()
    }

    /// The most recent failure, cleared by the next successful call.
    pub fn last_error(&self) -> Option<&ElectionError> {
        self.last_error.as_ref()
    }

    /// Whether shutdown has finished.
    pub fn is_stopped(&self) -> bool {
        self.mode == Mode::Stopped
    }

    /// Whether shutdown has begun (and may not have finished).
    pub fn is_stopping(&self) -> bool {
        self.mode != Mode::Running
    }

    /// Whether a store call is waiting for its answer.
    pub fn call_in_flight(&self) -> Option<Call> {
        self.inflight.map(|c| Call { id: c.id, op: c.op })
    }

    /// The next thing the driver must do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When to call [`Machine::handle_timeout`] next, if ever.
    pub fn poll_timeout(&self) -> Option<LocalTime> {
        if self.mode == Mode::Stopped {
            return None;
        }
        let call = match self.inflight {
            Some(c) => Some(c.sent_at + self.cfg.timing.operation_timeout),
            None => self.next_call_at,
        };
        [call, self.term.map(|t| t.deadline)].into_iter().flatten().min()
    }

    /// Fires whatever timers are due at `now`: the term deadline, the
    /// operation timeout of the call in flight, the next scheduled call.
    pub fn handle_timeout(&mut self, now: LocalTime) {
        self.step_by(now, now);
    }

    /// Like [`Machine::handle_timeout`], and also starts the next call now
    /// if it is scheduled before `horizon` and may safely go early:
    /// a renewal (it only confirms the lease sooner; its deadline is
    /// anchored at this earlier send) or a follower's look at the row (it
    /// changes nothing). A claim waits for its instant, and so does a look
    /// timed for a stalled holder's expiry, which claims. Only calls go
    /// early: deadlines and operation timeouts fire at their own instants.
    ///
    /// A driver that runs many machines calls this on a grid of instants,
    /// with `horizon` the next grid instant, so the calls of every machine
    /// due before then leave together (see [`crate::group`]); a call due
    /// at that instant waits for it.
    pub fn handle_timeout_early(&mut self, now: LocalTime, horizon: LocalTime) {
        self.step_by(now, horizon.max(now));
    }

    /// Whether the call scheduled next may start before its instant (see
    /// [`Machine::handle_timeout_early`]): a renewal, or a look that does
    /// not stand for a claim. Releases go at once anyway.
    fn may_go_early(&self) -> bool {
        self.mode == Mode::Running
            && (self.term.is_some() || (self.pending_release.is_none() && self.claim_at.is_none()))
    }

    /// Allows or withholds claims. While withheld, the machine observes the
    /// lease and renews a term it holds but claims nothing, as while it is
    /// held back ([`Machine::set_hold_back`]). Takes effect at its next
    /// decision; schedules nothing by itself. A group with a fair share
    /// withholds claims from the elections beyond its share.
    pub fn set_claims_allowed(&mut self, allowed: bool) {
        self.claims_allowed = allowed;
    }

    /// Lets looks at a lease another participant holds wait until shortly
    /// before it expires, instead of going every retry period: after such
    /// a sighting, the next look goes the most whole retry periods later
    /// that still fall within the lease as seen (at least one; the first
    /// time, and after a new holder was seen, a random number of them up to
    /// that, so elections seen together spread over the periods). A holder
    /// that stops renewing is still seen at its expiry; a lease released
    /// early is seen up to that much later. A look at a free, expired or own lease,
    /// and the look that claims from a stalled holder, keep their timing.
    /// Looks change nothing, so this costs no safety. Turned off at `now`,
    /// a look put off so comes back to when it would have gone, or if that
    /// has passed to the first whole retry period after it that has not
    /// (so a group's looks stay on one phase and go in its next look
    /// batch, not in one of their own); takes effect otherwise at the next
    /// decision. A group with a fair share turns it on while this
    /// participant has all the elections its share allows.
    pub fn set_lazy_looks(&mut self, now: LocalTime, lazy: bool) {
        self.lazy_looks = lazy;
        if !lazy {
            if let (Some(eager), Some(next)) = (self.eager_look_at.take(), self.next_call_at) {
                if self.inflight.is_none() && self.term.is_none() && self.claim_at.is_none() {
                    let period = self.cfg.timing.retry_period.as_nanos().max(1);
                    let late = now.saturating_since(eager).as_nanos();
                    let periods = u32::try_from(late.div_ceil(period)).unwrap_or(u32::MAX);
                    let due = eager + self.cfg.timing.retry_period.saturating_mul(periods);
                    self.next_call_at = Some(next.min(due));
                }
            }
        }
    }

    /// Takes the answer to call `id`. Answers to abandoned or unknown calls
    /// are ignored.
    pub fn handle_reply(&mut self, now: LocalTime, id: CallId, outcome: Outcome) {
        // A term whose deadline passed while the answer travelled ends first:
        // an answer never revives a deadline that has already gone by.
        self.expire_term(now);
        let Some(call) = self.inflight.filter(|c| c.id == id) else {
            self.step(now);
            return;
        };
        self.inflight = None;
        match (call.op, outcome) {
            (Op::Inspect, Outcome::Lease(r)) => self.on_inspect(now, r),
            (Op::Acquire { ttl }, Outcome::Lease(r)) => self.on_acquire(now, call.sent_at, ttl, r),
            (Op::Renew { fence, ttl }, Outcome::Lease(r)) => self.on_renew(now, call.sent_at, fence, ttl, r),
            (Op::Release { fence }, Outcome::Released(r)) => {
                self.on_release(now, fence, r.map_err(|e| ElectionError::store(OpKind::Release, e)))
            }
            (op, _) => {
                let e = StoreError::fatal(format!("driver answered {:?} with the wrong kind of outcome", op.kind()));
                self.fail(now, op, ElectionError::store(op.kind(), e));
            }
        }
        self.step(now);
    }

    /// Starts shutting down: ends the term at once, releases the lease
    /// (unless disabled), then emits [`Output::Stopped`]. A renewal or
    /// release in flight is waited for first, up to its operation timeout: a
    /// renewal that landed after the release would extend the lease again.
    pub fn shutdown(&mut self, now: LocalTime) {
        self.shutdown_inner(now, self.cfg.release_on_shutdown);
    }

    /// Like [`Machine::shutdown`], but never releases: the lease runs out on
    /// its own, as after a crash.
    pub fn shutdown_without_release(&mut self, now: LocalTime) {
        self.shutdown_inner(now, false);
    }

    fn shutdown_inner(&mut self, now: LocalTime, release: bool) {
        self.cfg.release_on_shutdown &= release;
        if self.mode != Mode::Running {
            self.step(now);
            return;
        }
        self.mode = Mode::Stopping;
        self.end_term(EndReason::Shutdown);
        if !self.cfg.release_on_shutdown {
            self.pending_release = None;
        }
        // Which call in flight to wait for (its operation timeout bounds the
        // wait). An acquire may grant the lease, so its answer decides whether
        // there is something to release. A renewal may still land: sent
        // before the release but committed after it (on another connection,
        // or behind the release's row lock with an older `now`), it would
        // extend a released lease by a whole TTL and keep the successor out.
        // So a release waits for it. The release of a resignation in flight
        // gives the shutdown its result. An inspect changes nothing; nor does
        // anything when no release follows.
        let release = self.cfg.release_on_shutdown;
        let wait = |op: Op| match op {
            Op::Acquire { .. } => true,
            Op::Renew { .. } | Op::Release { .. } => release,
            Op::Inspect => false,
        };
        if let Some(c) = self.inflight.filter(|c| !wait(c.op)) {
            self.inflight = None;
            self.outputs.push_back(Output::CallAbandoned(c.id));
        }
        self.next_call_at = Some(now);
        self.step(now);
    }

    /// Ends term `term` if it is live, releases its lease, and waits two
    /// retry periods before campaigning again: a follower polls within 1.2
    /// retry periods, so it gets the first chance at the free lease.
    ///
    /// If `term` is the term that ended last (its end raced the program's
    /// resignation, and the driver's record says the resignation came
    /// first), the back-off still applies; the release that term needed is
    /// already under way.
    pub fn resign(&mut self, now: LocalTime, term: TermId) {
        if self.mode == Mode::Running {
            if self.term.is_some_and(|t| t.id == term) {
                self.end_term(EndReason::Resigned);
                self.next_call_at = Some(now);
            }
            if self.last_term.is_some_and(|t| t.id == term) {
                let not_before = now + self.cfg.timing.retry_period.saturating_mul(2);
                self.campaign_not_before = self.campaign_not_before.max(not_before);
                self.claim_at = None;
            }
        }
        self.step(now);
    }

    /// The fence of a release that is waiting to be sent or waiting for its
    /// answer, if any.
    pub fn releasing(&self) -> Option<u64> {
        match self.inflight {
            Some(InFlight { op: Op::Release { fence }, .. }) => Some(fence),
            _ => self.pending_release,
        }
    }

    /// Ends term `term` as expired: the driver's watchdog found its deadline
    /// passed. The machine normally sees that itself; this keeps the two in
    /// step when a renewal answer was taken just before the deadline while
    /// the watchdog ended the term just after it. The fence is released and
    /// not led under again, as for any term that ran out locally.
    pub fn expire(&mut self, now: LocalTime, term: TermId) {
        if self.term.is_some_and(|t| t.id == term) && self.mode == Mode::Running {
            self.end_term(EndReason::ExpiredLocally);
            self.next_call_at = Some(now);
        }
        self.step(now);
    }

    /// Takes a hint that the lease may just have been released: the store
    /// saw a release of this election ([`Store::releases`]). A follower
    /// that may campaign claims now instead of at its next poll, with the
    /// same conditional claim as ever, so the hint costs no safety: a hint
    /// that is late, repeated or wrong costs at most one claim that finds
    /// the lease held, and a lost one costs what the poll costs.
    ///
    /// Only a follower that has looked at the row since it started acts on
    /// it (a machine looks before its first claim, which is what keeps a
    /// group's election that left and joined again off its old fences); a
    /// leader, a machine held back, withheld
    /// from claiming or waiting out a resignation, and one stopping ignore
    /// it. If a look is in flight, its answer claims at once. A claim in
    /// flight takes no second one, and `fence`, the released term's fence
    /// when the store knows it, keeps a late hint from sending another: a
    /// follower that has seen a later term than the one released (its poll
    /// found the release first and its claim lost) ignores it. So one
    /// release costs each follower at most one claim.
    pub fn handle_wake(&mut self, now: LocalTime, fence: Option<u64>) {
        let follower = self.mode == Mode::Running && self.term.is_none();
        let stale = |o: &Observed| fence.is_some_and(|f| o.fence > f);
        let follower = follower && self.observed.as_ref().is_some_and(|o| !stale(o));
        if follower && self.pending_release.is_none() && self.may_campaign(now) {
            match self.inflight.map(|c| c.op) {
                Some(Op::Inspect) => self.woken = Some(fence),
                Some(_) => {}
                None if self.cfg.unsafe_lead_on_wake => self.lead_unasked(now),
                None => {
                    self.claim_at = Some(now);
                    self.next_call_at = Some(now);
                }
            }
        }
        self.step(now);
    }

    /// The negative control of [`Machine::handle_wake`]: a term under the
    /// next fence, as if a claim had been granted at `now`.
    fn lead_unasked(&mut self, now: LocalTime) {
        let fence = self.observed.as_ref().map_or(0, |o| o.fence).max(self.highest_fence) + 1;
        let t = &self.cfg.timing;
        let deadline = now + t.lease_duration.saturating_sub(t.safety_margin);
        self.next_term_id += 1;
        let term = Term { id: TermId(self.next_term_id), fence, deadline };
        self.highest_fence = fence;
        self.claimed = true;
        self.term = Some(term);
        self.next_call_at = Some(now + t.renew_interval);
        self.outputs.push_back(Output::TermStarted { term: term.id, fence, deadline });
    }

    /// Tells the machine whether guards of an ended term are still alive. While
    /// they are, it observes the lease but does not campaign, so two terms of
    /// this process never overlap in user code.
    pub fn set_hold_back(&mut self, now: LocalTime, hold: bool) {
        let was = self.hold_back;
        self.hold_back = hold;
        if was && !hold && self.term.is_none() && self.mode == Mode::Running {
            self.next_call_at = Some(self.next_call_at.map_or(now, |t| t.min(now)));
        }
        self.step(now);
    }

    // ---- replies ----

    fn on_inspect(&mut self, now: LocalTime, r: Result<Lease, StoreError>) {
        match r {
            Ok(lease) => {
                self.succeeded();
                let seen = self.observe(now, &lease);
                let mine = lease.holder == self.cfg.identity;
                if mine && !self.claimed {
                    // Before this machine's first claim, a lease of its
                    // identity is an earlier machine's: a group's election
                    // that left and joined again, whose renewals may still
                    // be landing. Lead under none of its fences. Fences only
                    // grow and a machine looks before it claims, so this
                    // first look sees every fence the earlier one can still
                    // extend: a renewal needs its fence live on the row.
                    self.highest_fence = self.highest_fence.max(lease.fence);
                }
                if self.mode != Mode::Running {
                    return;
                }
                if mine && !lease.expired() && lease.fence <= self.highest_fence {
                    // Our own lease, under a fence this participant no longer
                    // leads under (a release failed or was lost): give it back
                    // directly. Acquiring first would extend it.
                    self.pending_release = Some(lease.fence);
                    self.next_call_at = Some(now);
                    return;
                }
                // A wake that came while this look travelled: the look may
                // have read the row before the release (but not if it shows
                // a later term than the one released).
                let woken = self.woken.take().is_some_and(|f| f.is_none_or(|f| lease.fence <= f));
                let woken = woken && !lease.holder.is_empty();
                let claimable = lease.expired() || mine || woken;
                if claimable && self.may_campaign(now) {
                    self.next_call_at = Some(now);
                    self.claim_at = Some(now);
                } else {
                    self.schedule_poll(now, Some(seen));
                }
            }
            Err(e) if e.is_no_lease() => {
                self.succeeded();
                self.woken = None;
                self.observed_expiry = None;
                if self.mode != Mode::Running {
                    return;
                }
                if self.may_campaign(now) {
                    self.next_call_at = Some(now);
                    self.claim_at = Some(now);
                } else {
                    self.schedule_poll(now, None);
                }
            }
            Err(e) => self.fail(now, Op::Inspect, ElectionError::store(OpKind::Inspect, e)),
        }
    }

    fn on_acquire(&mut self, now: LocalTime, sent_at: LocalTime, ttl: Duration, r: Result<Lease, StoreError>) {
        let lease = match r {
            Ok(lease) => lease,
            Err(e) => return self.fail(now, Op::Acquire { ttl }, ElectionError::store(OpKind::Acquire, e)),
        };
        self.succeeded();
        let seen = self.observe(now, &lease);
        if !lease.held_by(&self.cfg.identity) {
            if self.mode == Mode::Running {
                self.schedule_poll(now, Some(seen));
            }
            return;
        }
        if self.mode != Mode::Running || lease.fence <= self.highest_fence {
            // Shutting down, or the server still holds a term this process
            // already led under (and stepped down from locally): give it back
            // and take a fresh fence rather than resume the old one.
            if self.mode == Mode::Running || self.cfg.release_on_shutdown {
                self.pending_release = Some(lease.fence);
            }
            self.next_call_at = Some(now);
            return;
        }
        let deadline = self.deadline(sent_at, now, ttl, &lease);
        if deadline <= now {
            // The lease is ours on the server, but too little of it is left to
            // lead under safely. Confirm again shortly.
            self.next_call_at = Some(now + self.cfg.timing.retry_delay());
            return;
        }
        self.next_term_id += 1;
        let term = Term { id: TermId(self.next_term_id), fence: lease.fence, deadline };
        self.highest_fence = lease.fence;
        self.term = Some(term);
        self.next_call_at = Some(sent_at + self.cfg.timing.renew_interval);
        self.outputs.push_back(Output::TermStarted { term: term.id, fence: term.fence, deadline });
    }

    fn on_renew(
        &mut self, now: LocalTime, sent_at: LocalTime, fence: u64, ttl: Duration, r: Result<Lease, StoreError>,
    ) {
        let live = self.term.filter(|t| t.fence == fence);
        match r {
            Ok(lease) if lease.held_by(&self.cfg.identity) && lease.fence == fence => {
                self.succeeded();
                self.observe(now, &lease);
                let Some(mut term) = live else {
                    // The term ended while the renewal travelled; the server
                    // still holds it for us, so give it back.
                    self.pending_release = Some(fence);
                    self.next_call_at = Some(now);
                    return;
                };
                let deadline = self.deadline(sent_at, now, ttl, &lease);
                if deadline <= now {
                    self.end_term(EndReason::ExpiredLocally);
                    self.next_call_at = Some(now);
                    return;
                }
                term.deadline = deadline;
                self.term = Some(term);
                self.next_call_at = Some(sent_at + self.cfg.timing.renew_interval);
                self.outputs.push_back(Output::DeadlineExtended { term: term.id, deadline });
            }
            Ok(_) => self.lost(now, ElectionError::store(OpKind::Renew, StoreError::lease_lost())),
            Err(e) if e.is_lease_lost() => self.lost(now, ElectionError::store(OpKind::Renew, e)),
            Err(e) => self.fail(now, Op::Renew { fence, ttl }, ElectionError::store(OpKind::Renew, e)),
        }
    }

    fn on_release(&mut self, now: LocalTime, fence: u64, r: Result<(), ElectionError>) {
        if self.pending_release == Some(fence) {
            self.pending_release = None;
        }
        match &r {
            Ok(()) => self.succeeded(),
            Err(e) => {
                self.last_error = Some(e.clone());
                self.outputs.push_back(Output::Failed(e.clone()));
            }
        }
        let failed = r.is_err();
        self.outputs.push_back(Output::Released { fence, result: r });
        if self.mode == Mode::Running {
            // Poll next: the inspect shows whether the lease is free, or still
            // ours under that fence (then it is released again, never
            // acquired). After a failure, not before a retry delay.
            let wait = if failed { self.cfg.timing.retry_delay() } else { Duration::ZERO };
            self.next_call_at = Some(now + wait);
        }
    }

    /// The store says the lease is gone: stop leading now, poll at once.
    fn lost(&mut self, now: LocalTime, e: ElectionError) {
        self.outputs.push_back(Output::Failed(e.clone()));
        self.last_error = Some(e);
        if self.term.is_some() {
            self.end_term(EndReason::LeaseLost);
            // The server no longer holds it for us: nothing to release.
            self.pending_release = None;
        }
        self.next_call_at = Some(now);
    }

    fn fail(&mut self, now: LocalTime, op: Op, e: ElectionError) {
        self.woken = None;
        let fatal = e.is_fatal();
        self.outputs.push_back(Output::Failed(e.clone()));
        self.last_error = Some(e.clone());
        if let Op::Release { fence } = op {
            return self.on_release(now, fence, Err(e));
        }
        if self.mode != Mode::Running {
            self.next_call_at = Some(now);
            return;
        }
        match (op, self.term) {
            (Op::Renew { fence, .. }, Some(term)) if term.fence == fence => {
                if fatal {
                    self.end_term(EndReason::Fatal);
                    self.schedule_poll(now, None);
                } else {
                    // Keep leading until the deadline; try again soon.
                    self.next_call_at = Some(now + self.cfg.timing.retry_delay());
                }
            }
            _ => self.schedule_poll(now, None),
        }
    }

    // ---- helpers ----

    /// `sent_at + min(ttl reported, ttl asked) - safety_margin`.
    fn deadline(&self, sent_at: LocalTime, now: LocalTime, asked: Duration, lease: &Lease) -> LocalTime {
        let anchor = if self.cfg.unsafe_anchor_at_reply { now } else { sent_at };
        let valid_for = lease.ttl().min(asked).saturating_sub(self.cfg.timing.safety_margin);
        if valid_for.is_zero() {
            return anchor.saturating_sub(Duration::from_nanos(1)).min(now);
        }
        anchor + valid_for
    }

    fn may_campaign(&self, now: LocalTime) -> bool {
        self.mode == Mode::Running
            && !self.hold_back
            && self.claims_allowed
            && self.pending_release.is_none()
            && now >= self.campaign_not_before
    }

    fn succeeded(&mut self) {
        self.last_error = None;
    }

    /// Records the lease just read and says how the next poll may be timed
    /// from it.
    fn observe(&mut self, now: LocalTime, lease: &Lease) -> Sighting {
        // A row with no holder is held for nobody after a database failover
        // (see `MemStore::fail_over`): unexpired, so not claimable, but
        // nobody leads under it.
        let valid = !lease.expired() && !lease.holder.is_empty();
        let changed = self.observed.as_ref().is_none_or(|o| o.identity != lease.holder || o.fence != lease.fence);
        // Two readings of the row from the same database, compared with each
        // other: never with a local clock.
        let same_row = !changed && self.observed_expiry == Some(lease.expires_at);
        // While its renewals succeed, a holder with these timings writes the
        // row at least this often: each renewal is sent a renew interval
        // after the one before (or when that one answered, if later) and
        // lands within the operation timeout.
        let t = &self.cfg.timing;
        let writes_within = t.renew_interval.max(t.operation_timeout).saturating_add(t.operation_timeout);
        let unwritten = lease.now.saturating_duration_since(lease.renewed_at);
        let stalled = same_row && unwritten > writes_within;
        if valid && (changed || !self.observed.as_ref().is_some_and(|o| o.valid)) {
            self.outputs.push_back(Output::NewLeader { identity: lease.holder.clone(), fence: lease.fence });
            self.spread_next_poll = lease.holder != self.cfg.identity;
        }
        // In place, reusing the strings already kept: a group reads
        // thousands of leases a second on a few threads, and a new copy of
        // each holder kept until the next reading is a small long-lived
        // allocation among the batches' large short-lived ones, which
        // fragmented glibc's heap without bound (`tests/machine_allocations.rs`,
        // `tests/group_allocations.rs`).
        let o = self.observed.get_or_insert_with(|| Observed {
            identity: String::new(),
            fence: 0,
            payload: Vec::new(),
            valid: false,
            at: now,
        });
        o.identity.clone_from(&lease.holder);
        o.payload.clone_from(&lease.payload);
        o.fence = lease.fence;
        o.valid = valid;
        o.at = now;
        self.observed_expiry = Some(lease.expires_at);
        let held_by_other = valid && lease.holder != self.cfg.identity;
        Sighting { ttl: lease.ttl(), stalled, held_by_other }
    }

    /// Next follower poll: the retry period, jittered ±20 % (the first
    /// after a new leader was observed: anywhere in 0.2 to 1.2 periods), or
    /// when the lease just seen runs out if that is sooner. That poll claims
    /// directly if the lease's holder has stalled ([`Sighting::stalled`]);
    /// otherwise it inspects, and claims at once if the lease has expired.
    fn schedule_poll(&mut self, now: LocalTime, seen: Option<Sighting>) {
        let period = self.cfg.timing.retry_period;
        let r = self.rng.next_u64();
        let spread_this = std::mem::take(&mut self.spread_next_poll);
        let jittered = match (self.cfg.poll_jitter, spread_this) {
            (false, _) => period,
            (true, true) => spread(period, r),
            (true, false) => jitter(period, r),
        };
        self.claim_at = None;
        self.eager_look_at = None;
        let was_lazy = std::mem::take(&mut self.looking_lazily);
        let wait = match seen {
            // The expiry is reckoned from the reply's arrival, after the
            // server read its clock, so it falls at or after the server's.
            Some(seen) if self.may_campaign(now) && seen.ttl < jittered => {
                if seen.stalled {
                    self.claim_at = Some(now + seen.ttl);
                }
                seen.ttl
            }
            // Whole periods, so a group's looks stay on one phase.
            Some(seen) if self.lazy_looks && seen.held_by_other && !seen.stalled && !period.is_zero() => {
                let most = u32::try_from(seen.ttl.as_nanos() / period.as_nanos()).unwrap_or(u32::MAX).max(1);
                let spread = spread_this || !was_lazy;
                let periods = if spread { 1 + (r % u64::from(most)) as u32 } else { most };
                self.looking_lazily = true;
                if periods > 1 {
                    self.eager_look_at = Some(now + jittered);
                }
                period.saturating_mul(periods)
            }
            _ => jittered,
        };
        let at = (now + wait).max(if self.hold_back { now } else { self.campaign_not_before });
        self.next_call_at = Some(at);
    }

    fn end_term(&mut self, reason: EndReason) {
        if let Some(term) = self.term.take() {
            self.last_term = Some(term);
            if reason != EndReason::LeaseLost {
                self.pending_release = Some(term.fence);
            }
            if reason == EndReason::ExpiredLocally {
                let cause = self.last_error.take().map(Box::new);
                self.last_error = Some(ElectionError::LeaseExpiredLocally { cause });
            }
            self.outputs.push_back(Output::TermEnded { term: term.id, fence: term.fence, reason });
        }
    }

    fn expire_term(&mut self, now: LocalTime) {
        if self.term.is_some_and(|t| now >= t.deadline) {
            self.end_term(EndReason::ExpiredLocally);
        }
    }

    /// Fires due timers and starts the next call when one is due.
    fn step(&mut self, now: LocalTime) {
        self.step_by(now, now);
    }

    /// [`Machine::step`], starting the next call early if it is due before
    /// `horizon` and may go early.
    fn step_by(&mut self, now: LocalTime, horizon: LocalTime) {
        if self.mode == Mode::Stopped {
            return;
        }
        self.expire_term(now);
        if let Some(c) = self.inflight {
            let timeout = self.cfg.timing.operation_timeout;
            if now < c.sent_at + timeout {
                return;
            }
            self.inflight = None;
            self.outputs.push_back(Output::CallAbandoned(c.id));
            let e = ElectionError::Timeout { op: c.op.kind(), after: timeout };
            match c.op {
                Op::Release { fence } => self.on_release(now, fence, Err(e.clone())),
                op => self.fail(now, op, e),
            }
            self.expire_term(now);
        }
        if self.mode == Mode::Stopping {
            // Shutting down waits for nothing but the call in flight.
            self.next_call_at = Some(now);
        }
        let due = self.next_call_at.is_some_and(|t| now >= t || (t < horizon && self.may_go_early()));
        if !due {
            return;
        }
        self.eager_look_at = None;
        let op = match self.mode {
            Mode::Stopping => match self.pending_release.take() {
                Some(fence) => Op::Release { fence },
                None => {
                    self.mode = Mode::Stopped;
                    self.next_call_at = None;
                    self.outputs.push_back(Output::Stopped);
                    return;
                }
            },
            Mode::Running => match (self.term, self.pending_release) {
                (Some(term), _) => Op::Renew { fence: term.fence, ttl: self.cfg.timing.lease_duration },
                (None, Some(fence)) => Op::Release { fence },
                (None, None) if self.claim_at.is_some_and(|t| now >= t) && self.may_campaign(now) => {
                    self.claimed = true;
                    Op::Acquire { ttl: self.cfg.timing.lease_duration }
                }
                (None, None) => Op::Inspect,
            },
            Mode::Stopped => return,
        };
        self.claim_at = None;
        self.next_call_id += 1;
        let id = CallId(self.next_call_id);
        self.inflight = Some(InFlight { id, op, sent_at: now });
        self.next_call_at = None;
        self.outputs.push_back(Output::Call(Call { id, op }));
    }
}

/// A small, seeded generator for jitter: the machine never reads a global
/// random source.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `d` scaled by a factor in [0.2, 1.2) chosen by `r`: the first follower
/// poll after a new leader is seen. Public for the fuzz targets.
pub fn spread(d: Duration, r: u64) -> Duration {
    let frac = (r >> 32) as u128; // [0, 2^32)
    let nanos = d.as_nanos();
    let scaled = nanos / 5 + nanos * frac / (1u128 << 32);
    Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
}

/// `d` scaled by a factor in [0.8, 1.2) chosen by `r`: the follower poll
/// jitter. Public for the fuzz targets.
pub fn jitter(d: Duration, r: u64) -> Duration {
    // factor = 0.8 + 0.4 * (r / 2^64), in parts per 2^32 to stay in integers.
    let frac = (r >> 32) as u128; // [0, 2^32)
    let nanos = d.as_nanos();
    let scaled = nanos * 4 / 5 + nanos * 2 / 5 * frac / (1u128 << 32);
    Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
/// The word for `reason` in logs, [`Status`]'s `Display` and metric labels.
pub(crate) fn reason_name(reason: EndReason) -> &'static str {
    match reason {
        EndReason::Resigned => "resigned",
        EndReason::LeaseLost => "lost",
        EndReason::ExpiredLocally => "expired",
        EndReason::Fatal => "fatal",
        EndReason::Shutdown => "shutdown",
    }
}
