//! A group's decisions as a pure state machine: many elections' [`Machine`]s
//! on one grid of instants, their store calls gathered into batches, the
//! members' heartbeat and the fair share. No threads, no clock reads, no
//! I/O. The threaded [`Group`](crate::Group) drives it; so does the
//! repository's simulation, which thereby tests this same code.
//!
//! # The driver loop
//!
//! As for one [`Machine`] (see [`crate::machine`]), with batches:
//!
//! 1. read the clock into `now` and hand the group what happened:
//!    [`GroupMachine::handle_timeout`] when [`GroupMachine::poll_timeout`]
//!    came, [`GroupMachine::handle_batch_reply`] /
//!    [`GroupMachine::handle_members_reply`] for a store answer,
//!    [`GroupMachine::join`], [`GroupMachine::leave`],
//!    [`GroupMachine::shutdown`], or a command for one election through
//!    [`GroupMachine::with_machine`];
//! 2. carry out each election's outputs from [`GroupMachine::poll_event`]
//!    exactly as for one machine (terms started, extended, ended; leaders
//!    seen). The machines' [`Output::Call`]s never show up there: the group
//!    takes them;
//! 3. start every [`GroupCall`] from [`GroupMachine::poll_call`] at once
//!    (one store call each: [`Batch::run`], [`Store::heartbeat`],
//!    [`Store::leave_group`]);
//! 4. sleep until [`GroupMachine::poll_timeout`] or until an answer or a
//!    command arrives.
//!
//! # The grid
//!
//! Timers fire only on a grid of instants `phase + k * tick`. At each, every
//! machine whose next call is due before the next grid instant is stepped
//! with [`Machine::handle_timeout_early`]: renewals and plain looks leave up
//! to one tick early (a renewal's deadline is anchored at its real send),
//! claims wait for their instant. Follower polls are not jittered
//! ([`MachineConfig::poll_jitter`]). So the renewals of every term go out
//! together once per renew interval and the looks due once per retry
//! period (every follower's, or with lazy looks a few periods' share of
//! them; see the fair share below): each a single batched call, never at
//! the instant a renewal batch goes (the looks wait a tick), so one
//! process has one big batch in flight at a time. When a renewal batch
//! goes out, the renewals due within half an interval (and a tick) join it
//! (likewise looks within half a retry period), so terms that started at different
//! instants fall into one phase after one early renewal. Calls that an answer
//! brings about (a claim after a look found the lease free, a release after
//! a term ended) go out at once, as batches of their own. A tick divides
//! the renew interval and the retry period when it can ([`default_tick`]).
//!
//! # The fair share
//!
//! With [`GroupMachineConfig::fair_share`], each participant sends
//! [`Store::heartbeat`] every renew interval, which counts the group's live
//! members on the database, and claims only while it leads fewer than its
//! share, `ceil(elections / live members)`, counting claims in flight. When
//! it leads more (a member joined), it resigns the surplus: the terms it
//! prefers least, releasing each lease so a member under its share takes it
//! at its next look. Preferences are a hash of the participant's identity
//! and the election's name, so participants racing for free elections
//! mostly go for different ones, and each keeps the elections it prefers
//! most. Shedding waits for the same count in two heartbeats in a row; a
//! participant whose last heartbeat answer is older than a lease (minus the
//! safety margin) claims nothing, since the others may have counted it out.
//! A participant that leads its share (give or take rounding, see
//! `lazy_looks`) looks at the leases others hold about once per lease
//! instead of every retry period ([`Machine::set_lazy_looks`]): while some
//! election is free or about to be shed, another member under its share
//! still looks every period, and a holder that fails is still seen at its
//! lease's expiry. Each heartbeat also reports how many elections the
//! member leads; while the members' reports say every election is led and
//! none is beyond its share, every member looks lazily, the one that
//! rounding left short too.
//!
//! The share assumes every member runs the same elections. One that runs
//! fewer (or none yet) is counted all the same, and the others would leave
//! elections unled; so an election this participant has seen unled for a
//! whole lease may be claimed beyond the share (the starvation valve), and
//! such a term is not shed for [`BEYOND_SHARE_KEPT`] leases. (After faults
//! the valve may fire while some member is under its share; the term is
//! then shed once that time is up, and the shares even out.)
//!
//! Shares never weaken safety: every claim is still one row's claim,
//! decided by the database; the share only decides which claims are tried.
//!
//! # Renewal slots
//!
//! Members whose renewal batches reach the database together slow each
//! other down (measured on MariaDB with 10,000 elections over 3 processes:
//! 57 ms at the median for a batch that met another against 45 ms alone).
//! So with a fair share (and [`GroupMachineConfig::spread_renewals`]),
//! each member renews at its own slot of the renew interval: the instants
//! at which the database clock stands `rank / live` of an interval past a
//! whole number of intervals, where `rank` is how many live members' names
//! come before its own ([`Members::rank`]). Three members renew a third of
//! an interval apart, whatever their clocks and grids. The heartbeat
//! answer places the slot on the local clock (taking the database's `now`
//! to fall halfway through the round trip) and moves the grid so the slot
//! lies on it. At each slot instant every term whose renewal falls due
//! before the next one renews, early; a term claimed between two slots
//! renews at the next one, before it falls due. Renewing early only
//! confirms a lease sooner (its deadline is anchored at the send), so
//! slots cost no safety; a member whose store tells no rank renews when
//! its terms fall due, as without a share.
//!
//! A member that leads [`GroupMachineConfig::split_renewals_from`] terms
//! or more renews them in two batches per interval, at two slots: its own
//! and one half an interval later (and, with an even number of members,
//! another `1 / (2 live)` of an interval later, off the others' slots), so
//! the members' `2 live` slots lie evenly over the interval. At each of its
//! slots the terms due before its next slot renew, and, while they are
//! fewer than half of its terms, the next ones due after that, early:
//! after one such early renewal the terms stay split in two halves, each
//! renewed once per interval. A batch half the size takes about half the
//! time on the database. The member's heartbeat then goes with one of its
//! renewal batches, in one call ([`Store::renew_many_with_heartbeat`]), so
//! the member still makes three calls per interval (heartbeat and first
//! half, second half, looks); on PostgreSQL three transactions too, the
//! heartbeat going in the renewal's query (on MariaDB a large renewal is
//! several transactions: see `src/mysql/batch.rs`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::batch::{Heartbeat, Members};
use crate::machine::{Call, CallId, LocalTime, Machine, MachineConfig, Mode, Op, Outcome, Output, TermId};
use crate::store::{Store, StoreError};
use crate::timing::Timing;

/// Names one election of a group. Never reused within a group, so a late
/// answer or command for an election that left finds nothing.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ElectionKey(pub u32);

/// Why [`GroupMachine::join`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinRefused {
    /// The group is shutting down.
    Stopping,
    /// Every key has been used: 2³² − 1 elections joined this group's run.
    OutOfKeys,
}

impl ElectionKey {
    /// The election whose machine numbers its terms from this key (see
    /// [`MachineConfig::term_ids_from`]).
    pub fn of_term(term: TermId) -> ElectionKey {
        ElectionKey((term.0 >> 32) as u32)
    }

    fn first_term_id(self) -> u64 {
        u64::from(self.0) << 32
    }
}

/// Names one group call, so its answer finds the calls it carried.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct BatchId(pub u64);

/// What a batch asks of every election in it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BatchOp {
    /// [`Store::acquire_many`].
    Acquire,
    /// [`Store::renew_many`].
    Renew,
    /// [`Store::release_many`].
    Release,
    /// [`Store::inspect_many`].
    Inspect,
}

impl BatchOp {
    const ALL: [BatchOp; 4] = [BatchOp::Renew, BatchOp::Release, BatchOp::Acquire, BatchOp::Inspect];

    fn of(op: Op) -> BatchOp {
        match op {
            Op::Inspect => BatchOp::Inspect,
            Op::Acquire { .. } => BatchOp::Acquire,
            Op::Renew { .. } => BatchOp::Renew,
            Op::Release { .. } => BatchOp::Release,
        }
    }

    fn index(self) -> usize {
        match self {
            BatchOp::Renew => 0,
            BatchOp::Release => 1,
            BatchOp::Acquire => 2,
            BatchOp::Inspect => 3,
        }
    }
}

/// One election's call in a batch.
#[derive(Clone)]
pub struct BatchEntry {
    /// The election.
    pub key: ElectionKey,
    /// Its machine's call, answered through [`GroupMachine::handle_batch_reply`].
    pub call: CallId,
    /// The election's name.
    pub name: Arc<str>,
    /// The fence a renewal or release is guarded by (0 for others).
    pub fence: u64,
    /// What the election publishes.
    pub payload: Arc<[u8]>,
}

impl fmt::Debug for BatchEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchEntry")
            .field("key", &self.key)
            .field("call", &self.call)
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// Many elections' calls of one kind, to send as one store call.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Hand this back with the answers.
    pub id: BatchId,
    /// What every entry asks.
    pub op: BatchOp,
    /// The lease duration claims and renewals ask for.
    pub ttl: Duration,
    /// The calls, most preferred election first.
    pub entries: Vec<BatchEntry>,
    /// The member's heartbeat, sent with this renewal batch
    /// ([`Store::renew_many_with_heartbeat`]); its answer goes to
    /// [`GroupMachine::handle_members_reply`] under its own id.
    pub heartbeat: Option<BatchHeartbeat>,
}

/// A heartbeat that goes with a renewal batch (see [`Batch::heartbeat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeartbeat {
    /// Hand this back with the heartbeat's answer.
    pub id: BatchId,
    /// How long the heartbeat keeps this member counted.
    pub ttl: Duration,
    /// The elections this participant leads, reported to the others.
    pub leading: u32,
}

impl Batch {
    /// Runs the batch on `store` as participant `identity` of `group` and
    /// wraps the answers for [`GroupMachine::handle_batch_reply`], one per
    /// entry in order, with the answer of the heartbeat that went with it,
    /// if one did (for [`GroupMachine::handle_members_reply`]). Blocks for
    /// the store call. A store that answers a different number of items
    /// than it was given fails the whole batch (fatal).
    pub fn run<S: Store + ?Sized>(
        &self, store: &S, group: &str, identity: &str, timeout: Duration,
    ) -> (Vec<Outcome>, Option<Result<Members, StoreError>>) {
        let items: Vec<crate::BatchItem<'_>> = self
            .entries
            .iter()
            .map(|e| crate::BatchItem { name: &e.name, fence: e.fence, payload: &e.payload })
            .collect();
        let len = items.len();
        let checked = |got: usize| -> Option<StoreError> {
            (got != len).then(|| {
                StoreError::fatal(format!("the store answered {got} items of a batch of {len} (a broken store)"))
            })
        };
        match self.op {
            BatchOp::Release => {
                let out = store.release_many(identity, &items, timeout);
                let out = match checked(out.len()) {
                    Some(e) => (0..len).map(|_| Outcome::Released(Err(e.clone()))).collect(),
                    None => out.into_iter().map(Outcome::Released).collect(),
                };
                (out, self.heartbeat.map(|_| Err(not_renewing())))
            }
            op => {
                let mut members = None;
                let out = match (op, self.heartbeat) {
                    (BatchOp::Renew, Some(h)) => {
                        let beat = Heartbeat { group, leading: h.leading, ttl: h.ttl };
                        let (out, m) = store.renew_many_with_heartbeat(identity, self.ttl, &items, beat, timeout);
                        members = Some(m);
                        out
                    }
                    (BatchOp::Acquire, _) => store.acquire_many(identity, self.ttl, &items, timeout),
                    (BatchOp::Renew, None) => store.renew_many(identity, self.ttl, &items, timeout),
                    _ => {
                        let names: Vec<&str> = items.iter().map(|i| i.name).collect();
                        store.inspect_many(&names, timeout)
                    }
                };
                let out = match checked(out.len()) {
                    Some(e) => (0..len).map(|_| Outcome::Lease(Err(e.clone()))).collect(),
                    None => out.into_iter().map(Outcome::Lease).collect(),
                };
                let members = members.or_else(|| self.heartbeat.map(|_| Err(not_renewing())));
                (out, members)
            }
        }
    }

    /// The answer every entry gets when the batch could not be sent at all
    /// (no worker for it): `e`, as the kind of outcome the calls expect;
    /// and `e` for the heartbeat that went with it, if one did.
    pub fn failed(&self, e: &StoreError) -> (Vec<Outcome>, Option<Result<Members, StoreError>>) {
        let one = || match self.op {
            BatchOp::Release => Outcome::Released(Err(e.clone())),
            _ => Outcome::Lease(Err(e.clone())),
        };
        (self.entries.iter().map(|_| one()).collect(), self.heartbeat.map(|_| Err(e.clone())))
    }
}

/// The answer of a heartbeat put on a batch that renews nothing (a group
/// never does that).
fn not_renewing() -> StoreError {
    StoreError::fatal("a heartbeat went with a batch that renews nothing (a bug in the group)")
}

/// A store call the group asks its driver to start now.
#[derive(Clone, Debug)]
pub enum GroupCall {
    /// Many elections' calls of one kind.
    Batch(Batch),
    /// [`Store::heartbeat`] of this participant, alive for `ttl`; answer
    /// with [`GroupMachine::handle_members_reply`].
    Heartbeat {
        /// Hand this back with the answer.
        id: BatchId,
        /// How long the heartbeat keeps this member counted.
        ttl: Duration,
        /// The elections this participant leads, reported to the others.
        leading: u32,
    },
    /// [`Store::leave_group`] of this participant, at shutdown; answer with
    /// [`GroupMachine::handle_members_reply`] (any `Members`, or the error).
    Leave {
        /// Hand this back with the answer.
        id: BatchId,
    },
}

impl GroupCall {
    /// The call's id.
    pub fn id(&self) -> BatchId {
        match self {
            GroupCall::Batch(b) => b.id,
            GroupCall::Heartbeat { id, .. } | GroupCall::Leave { id } => *id,
        }
    }
}

/// What a [`GroupMachine`] needs to know about its participant.
#[derive(Clone, Debug)]
pub struct GroupMachineConfig {
    /// This participant's identity, in every election of the group and as
    /// a member.
    pub identity: String,
    /// The group's name among the members table's groups.
    pub group: String,
    /// The durations, the same for every election.
    pub timing: Timing,
    /// Release each lease when its election leaves or the group shuts down.
    pub release_on_shutdown: bool,
    /// Lead at most a fair share of the elections (see the module docs).
    pub fair_share: bool,
    /// The grid's step (see the module docs and [`default_tick`]).
    pub tick: Duration,
    /// Where the grid starts: a random offset below `tick` keeps the
    /// processes of a group off one another's instants. With
    /// `spread_renewals`, the heartbeat moves it to this member's slot.
    pub phase: Duration,
    /// With a fair share, renew at this member's slot of the renew
    /// interval (see the module docs), so the members' renewal batches
    /// reach the database one after another instead of together. On by
    /// default; off, a term renews when it falls due, as without a share.
    pub spread_renewals: bool,
    /// With `spread_renewals`, from how many terms this member renews them
    /// in two batches per interval, at two slots, and sends its heartbeat
    /// with one of them (see the module docs). Default
    /// [`SPLIT_RENEWALS_FROM`].
    pub split_renewals_from: usize,
    /// Seed of the machines' jitter generators.
    pub seed: u64,
    /// **Broken on purpose; for negative controls only.** Passed to every
    /// machine ([`MachineConfig::unsafe_anchor_at_reply`]).
    #[doc(hidden)]
    pub unsafe_anchor_at_reply: bool,
    /// **Broken on purpose; for negative controls only.** Passed to every
    /// machine ([`MachineConfig::unsafe_lead_on_wake`]).
    #[doc(hidden)]
    pub unsafe_lead_on_wake: bool,
}

impl GroupMachineConfig {
    /// A group of `identity` named `group` with these timings, releasing
    /// on shutdown, without a fair share, on the default grid from zero.
    pub fn new(identity: impl Into<String>, group: impl Into<String>, timing: Timing, seed: u64) -> GroupMachineConfig {
        GroupMachineConfig {
            identity: identity.into(),
            group: group.into(),
            timing,
            release_on_shutdown: true,
            fair_share: false,
            tick: default_tick(&timing),
            phase: Duration::ZERO,
            spread_renewals: true,
            split_renewals_from: SPLIT_RENEWALS_FROM,
            seed,
            unsafe_anchor_at_reply: false,
            unsafe_lead_on_wake: false,
        }
    }
}

/// For how many leases a term the starvation valve claimed beyond the share
/// is kept before it may be shed like any other. Long enough that a member
/// running fewer elections (the valve's reason) costs its elections little
/// leaderless time; short enough that, after a fault let the valve claim
/// while a member under its share existed, shares even out again.
pub const BEYOND_SHARE_KEPT: u32 = 4;

/// From how many terms a member renews them in two batches per interval
/// (see the module docs). 10,000 elections over 3 members (3,334 terms
/// each) renew as two batches of 1,667: measured on a 2-core machine
/// (BENCHMARKS.md, row 8), 24-31 ms at the median on PostgreSQL and
/// MariaDB against 37-45 ms for one batch of 3,333.
pub const SPLIT_RENEWALS_FROM: usize = 2_000;

/// Shortest grid step a group uses by default.
pub const MIN_TICK: Duration = Duration::from_millis(10);

/// The grid step for `timing`: the largest step that divides both the renew
/// interval and the retry period (so renewals and looks stay on the grid)
/// and is at most a quarter of the shorter of the two (so a renewal goes at
/// most a quarter interval early); a quarter of the shorter if no such step
/// of at least [`MIN_TICK`] exists. 1 s and 1 s give 250 ms; 5 s and 3 s
/// give 500 ms.
pub fn default_tick(timing: &Timing) -> Duration {
    let (a, b) = (timing.renew_interval.as_micros(), timing.retry_period.as_micros());
    let quarter = a.min(b) / 4;
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    let gcd = x;
    let step = (1..=64u128).map(|k| gcd / k).find(|s| *s <= quarter && gcd % s == 0 && *s > 0);
    let micros = match step {
        Some(s) if s >= MIN_TICK.as_micros() => s,
        _ => quarter,
    };
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX)).max(MIN_TICK)
}

/// One election in the group.
#[derive(Debug)]
struct Entry {
    name: Arc<str>,
    payload: Arc<[u8]>,
    machine: Machine,
    /// Where it stands in `wakes`.
    wake: Option<LocalTime>,
    /// This participant's preference for leading it.
    pref: u64,
    leading: bool,
    claiming: bool,
    /// Listed in `touched`.
    touched: bool,
    leaving: bool,
    /// Since when no valid lease has been seen on the election (not led by
    /// anyone, as far as this participant knows): the share's starvation
    /// valve (see [`GroupMachine::touch`]).
    unled_since: Option<LocalTime>,
    /// The claim in flight was allowed by the valve, beyond the share.
    valve_claim: bool,
    /// The live term was claimed beyond the share, at this instant: it is
    /// not shed for [`BEYOND_SHARE_KEPT`] leases.
    beyond_share: Option<LocalTime>,
}

#[derive(Debug)]
struct InFlightBatch {
    op: BatchOp,
    calls: Vec<(ElectionKey, CallId)>,
    sent_at: LocalTime,
}

/// The members heartbeat and what it said.
#[derive(Debug, Default)]
struct MemberView {
    next_at: LocalTime,
    inflight: Option<(BatchId, LocalTime)>,
    /// Live members by the last answer.
    live: Option<u32>,
    /// How many answers in a row gave `live`.
    same: u32,
    /// Until when the last answer counts (sent + lease - safety margin).
    fresh_until: LocalTime,
    last_error: Option<StoreError>,
    /// One instant of this member's renewal slot, on the local clock (the
    /// others are whole renew intervals before and after it), by the last
    /// answer that told a rank; `None` without one.
    slot: Option<LocalTime>,
    /// The live members the slot was placed among.
    slot_live: u32,
    /// The round trip of the heartbeat that placed the slot: its estimate
    /// is off by half of it at most.
    slot_rtt: Duration,
    /// What the live members lead between them and the most one leads, by
    /// their reports, as the last answer said; `None` if it did not.
    led: Option<(u64, u32)>,
}

/// Many elections of one participant, on one grid. See the [module
/// docs](self).
#[derive(Debug)]
pub struct GroupMachine {
    cfg: GroupMachineConfig,
    now: LocalTime,
    mode: Mode,
    entries: HashMap<ElectionKey, Entry>,
    wakes: BTreeSet<(LocalTime, ElectionKey)>,
    next_key: u32,
    next_batch: u64,
    inflight: HashMap<BatchId, InFlightBatch>,
    /// Calls taken from the machines, not yet batched, by [`BatchOp::index`].
    pending: [Vec<(ElectionKey, Call)>; 4],
    events: VecDeque<(ElectionKey, Output)>,
    calls: VecDeque<GroupCall>,
    touched: Vec<ElectionKey>,
    leading: usize,
    claiming: usize,
    /// Elections not leaving: the share's numerator.
    staying: usize,
    members: MemberView,
    leave_call: Option<(BatchId, LocalTime)>,
    /// Terms resigned to bring this participant down to its share.
    shed: u64,
    /// The grid step (named by its end) in which a renewal batch went: no
    /// look batch goes early in it.
    renewed_in: Option<LocalTime>,
    /// Where the grid starts now: `cfg.phase`, until a heartbeat places
    /// this member's renewal slot on the grid.
    phase: Duration,
    /// The last slot instant whose renewals went.
    slot_served: Option<LocalTime>,
    /// A heartbeat due, to go with the renewal batch of this step.
    beat: Option<BatchHeartbeat>,
    /// Followers looked lazily at the last step ([`GroupMachine::lazy_looks`]).
    lazy: bool,
    /// The last heartbeat counted fewer members than the one before.
    member_left: bool,
}

impl GroupMachine {
    /// A group with no elections yet; its first heartbeat (with a fair
    /// share) goes at the first grid instant.
    pub fn new(cfg: GroupMachineConfig) -> GroupMachine {
        let cfg_phase = cfg.phase;
        GroupMachine {
            cfg,
            now: LocalTime::ZERO,
            mode: Mode::Running,
            entries: HashMap::new(),
            wakes: BTreeSet::new(),
            next_key: 0,
            next_batch: 0,
            inflight: HashMap::new(),
            pending: Default::default(),
            events: VecDeque::new(),
            calls: VecDeque::new(),
            touched: Vec::new(),
            leading: 0,
            claiming: 0,
            staying: 0,
            members: MemberView::default(),
            leave_call: None,
            shed: 0,
            renewed_in: None,
            phase: cfg_phase,
            slot_served: None,
            beat: None,
            lazy: false,
            member_left: false,
        }
    }

    /// This participant's identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// The configuration in force.
    pub fn config(&self) -> &GroupMachineConfig {
        &self.cfg
    }

    /// How many elections the group runs (those leaving included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the group runs no election.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Elections whose machine holds a term (its deadline may have passed
    /// since it was last stepped).
    pub fn leading(&self) -> usize {
        self.leading
    }

    /// Elections with a claim in flight.
    pub fn claiming(&self) -> usize {
        self.claiming
    }

    /// Live members by the last heartbeat, with a fair share.
    pub fn live_members(&self) -> Option<u32> {
        self.members.live
    }

    /// The most elections this participant may lead now: `ceil(elections /
    /// live members)` while the last heartbeat answer is fresh; `None`
    /// without a fair share, and `Some(0)` before a first answer or once it
    /// is stale.
    pub fn share(&self) -> Option<usize> {
        if !self.cfg.fair_share {
            return None;
        }
        match self.members.live {
            Some(live) if self.now < self.members.fresh_until => Some(self.staying.div_ceil(live.max(1) as usize)),
            _ => Some(0),
        }
    }

    /// Terms resigned so far to come down to the share.
    pub fn shed_count(&self) -> u64 {
        self.shed
    }

    /// Live terms claimed beyond the share by the starvation valve (an
    /// election nobody under its share took for a whole lease).
    pub fn beyond_share(&self) -> usize {
        self.entries.values().filter(|e| self.kept_beyond_share(e)).count()
    }

    /// The last heartbeat's failure, cleared by the next success.
    pub fn members_error(&self) -> Option<&StoreError> {
        self.members.last_error.as_ref()
    }

    /// Every election's key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = ElectionKey> + '_ {
        self.entries.keys().copied()
    }

    /// Election `key`'s machine, while the election is in the group.
    pub fn machine(&self, key: ElectionKey) -> Option<&Machine> {
        self.entries.get(&key).map(|e| &e.machine)
    }

    /// Election `key`'s name.
    pub fn name(&self, key: ElectionKey) -> Option<&Arc<str>> {
        self.entries.get(&key).map(|e| &e.name)
    }

    /// Whether shutdown has finished: every election's machine stopped and
    /// the member left.
    pub fn is_stopped(&self) -> bool {
        self.mode == Mode::Stopped
    }

    /// The next election output to carry out, with its election.
    pub fn poll_event(&mut self) -> Option<(ElectionKey, Output)> {
        self.events.pop_front()
    }

    /// The next store call to start.
    pub fn poll_call(&mut self) -> Option<GroupCall> {
        self.calls.pop_front()
    }

    /// The elections stepped since the last call, so a driver can publish
    /// their state; each at most once. Elections that have left are among
    /// them.
    pub fn take_touched(&mut self) -> Vec<ElectionKey> {
        for k in &self.touched {
            if let Some(e) = self.entries.get_mut(k) {
                e.touched = false;
            }
        }
        std::mem::take(&mut self.touched)
    }

    /// When to call [`GroupMachine::handle_timeout`] next: the next grid
    /// instant, or never once stopped or with nothing to do.
    pub fn poll_timeout(&self) -> Option<LocalTime> {
        let idle = self.entries.is_empty() && !self.cfg.fair_share && self.inflight.is_empty();
        if self.mode == Mode::Stopped || idle {
            return None;
        }
        let grid = self.next_grid_after(self.now);
        // The slot lies on the grid when the tick divides the interval;
        // otherwise the group wakes for it too.
        let slot = self.last_slot_at(self.now).map(|s| self.next_slot_after(s));
        Some(slot.map_or(grid, |s| s.min(grid)))
    }

    /// Adds an election named `name`, publishing `payload`: a follower that
    /// looks at its row at the next grid instant. Refused once the group is
    /// shutting down, or when it has used every key (2³² − 1 joins).
    pub fn join(&mut self, now: LocalTime, name: Arc<str>, payload: Arc<[u8]>) -> Result<ElectionKey, JoinRefused> {
        self.now = self.now.max(now);
        if self.mode != Mode::Running {
            return Err(JoinRefused::Stopping);
        }
        let key = ElectionKey(self.next_key);
        // Keys are never used again: a key numbers its election's terms
        // (see `ElectionKey::first_term_id`).
        self.next_key = self.next_key.checked_add(1).ok_or(JoinRefused::OutOfKeys)?;
        let mut mcfg =
            MachineConfig::new(self.cfg.identity.clone(), self.cfg.timing, mix(self.cfg.seed ^ key_bits(key)));
        mcfg.release_on_shutdown = self.cfg.release_on_shutdown;
        mcfg.poll_jitter = false;
        mcfg.term_ids_from = key.first_term_id();
        mcfg.unsafe_anchor_at_reply = self.cfg.unsafe_anchor_at_reply;
        mcfg.unsafe_lead_on_wake = self.cfg.unsafe_lead_on_wake;
        let machine = Machine::new(mcfg);
        let pref = preference(&self.cfg.identity, &name);
        let wake = machine.poll_timeout();
        if let Some(w) = wake {
            self.wakes.insert((w, key));
        }
        let entry = Entry {
            name,
            payload,
            machine,
            wake,
            pref,
            leading: false,
            claiming: false,
            touched: false,
            leaving: false,
            unled_since: None,
            valve_claim: false,
            beyond_share: None,
        };
        self.entries.insert(key, entry);
        self.staying += 1;
        Ok(key)
    }

    /// Starts removing election `key`: its machine shuts down (releasing
    /// its lease if `release` and the configuration say so) and reports
    /// [`Output::Stopped`] through [`GroupMachine::poll_event`]; the driver
    /// then carries that out and [`forgets`](GroupMachine::forget) the
    /// election.
    pub fn leave(&mut self, now: LocalTime, key: ElectionKey, release: bool) {
        self.now = self.now.max(now);
        self.start_leaving(key, release);
        self.progress_stop();
        self.flush();
    }

    /// Drops election `key` once its machine has stopped (after the driver
    /// has carried out its [`Output::Stopped`]); nothing otherwise. Its
    /// name may then join again.
    pub fn forget(&mut self, key: ElectionKey) {
        if self.entries.get(&key).is_some_and(|e| e.machine.is_stopped()) {
            if let Some(e) = self.entries.remove(&key) {
                if let Some(w) = e.wake {
                    self.wakes.remove(&(w, key));
                }
                self.leading -= usize::from(e.leading);
                self.claiming -= usize::from(e.claiming);
            }
        }
    }

    /// Shuts the whole group down: every election leaves (see
    /// [`GroupMachine::leave`]), then the member leaves the group.
    pub fn shutdown(&mut self, now: LocalTime, release: bool) {
        self.now = self.now.max(now);
        if self.mode == Mode::Running {
            self.mode = Mode::Stopping;
        }
        // In key order, as everything the machines are driven in (an
        // order of the map's own would make the same run send different
        // batches, and the simulation not replayable).
        let mut keys: Vec<ElectionKey> = self.entries.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            self.start_leaving(key, release);
        }
        self.progress_stop();
        self.flush();
    }

    /// Runs `f` on election `key`'s machine (a command from one of its
    /// guards, its watchdog or the program), then takes its outputs. `None`
    /// when the election has left.
    pub fn with_machine<R>(
        &mut self, now: LocalTime, key: ElectionKey, f: impl FnOnce(&mut Machine) -> R,
    ) -> Option<R> {
        self.now = self.now.max(now);
        let r = self.touch(key, f);
        self.progress_stop();
        self.flush();
        r
    }

    /// Wakes the machines of `woken`: elections the store saw released,
    /// each with the released fence if known ([`Machine::handle_wake`]).
    /// Those that may claim send their claims together, in one batch,
    /// within the share as ever.
    pub fn handle_wakes(&mut self, now: LocalTime, woken: &[(ElectionKey, Option<u64>)]) {
        self.now = self.now.max(now);
        let now = self.now;
        for &(key, fence) in woken {
            self.touch(key, |m| m.handle_wake(now, fence));
        }
        self.flush();
    }

    /// Fires what is due: every machine whose next call is due before the
    /// next grid instant (see the module docs), the heartbeat, the fair
    /// share's shedding, and the end of a shutdown.
    pub fn handle_timeout(&mut self, now: LocalTime) {
        self.now = self.now.max(now);
        let now = self.now;
        self.end_lazy_looks(now);
        let horizon = self.next_grid_after(now);
        let (mut leaders, mut others): (Vec<_>, Vec<_>) = self
            .wakes
            .range(..(horizon, ElectionKey(0)))
            .filter_map(|(_, k)| self.entries.get(k).map(|e| (e.leading, e.pref, *k)))
            .partition(|(leading, _, _)| *leading);
        leaders.sort_unstable_by_key(|(_, _, k)| *k);
        for (_, _, key) in leaders {
            self.touch(key, |m| m.handle_timeout_early(now, horizon));
        }
        self.renew_at_slot(now);
        // A renewal batch goes now: the followers' looks wait for the next
        // instant (each a tick late at most) rather than go early beside
        // it, so one process never has both big batches in flight at once.
        let renewing = !self.pending[BatchOp::Renew.index()].is_empty();
        if renewing {
            self.renewed_in = Some(horizon);
        }
        // Also when the batch of this grid step went at an earlier call.
        let look_horizon = if self.renewed_in == Some(horizon) { now } else { horizon };
        // The most preferred first: they get the share's claims.
        others.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
        for (_, _, key) in others {
            self.touch(key, |m| m.handle_timeout_early(now, look_horizon));
        }
        self.merge_phases(now, horizon);
        let op_timeout = self.cfg.timing.operation_timeout;
        // Every call of a batch this old was abandoned by its machine.
        self.inflight.retain(|_, b| now < b.sent_at + op_timeout);
        self.heartbeat(now, horizon);
        self.shed_surplus(now);
        self.progress_stop();
        self.flush();
    }

    /// The elections whose calls batch `id` carries, while it waits for
    /// its answer.
    pub fn batch_keys(&self, id: BatchId) -> Vec<ElectionKey> {
        self.inflight.get(&id).map(|b| b.calls.iter().map(|(k, _)| *k).collect()).unwrap_or_default()
    }

    /// Takes the answers to batch `id`, one per entry in order. Answers to
    /// batches given up (older than the operation timeout) change nothing,
    /// as do answers to calls their machine has abandoned.
    pub fn handle_batch_reply(&mut self, now: LocalTime, id: BatchId, outcomes: Vec<Outcome>) {
        self.now = self.now.max(now);
        let now = self.now;
        let Some(batch) = self.inflight.remove(&id) else { return };
        if outcomes.len() != batch.calls.len() {
            // A driver or store bug: fail every call rather than guess.
            let e = StoreError::fatal(format!("{} answers to a batch of {}", outcomes.len(), batch.calls.len()));
            for (key, call) in batch.calls {
                self.touch(key, |m| {
                    let outcome = match m.call_in_flight() {
                        Some(Call { op: Op::Release { .. }, .. }) => Outcome::Released(Err(e.clone())),
                        _ => Outcome::Lease(Err(e.clone())),
                    };
                    m.handle_reply(now, call, outcome)
                });
            }
        } else {
            for ((key, call), outcome) in batch.calls.into_iter().zip(outcomes) {
                self.touch(key, |m| m.handle_reply(now, call, outcome));
            }
        }
        if matches!(batch.op, BatchOp::Acquire | BatchOp::Inspect) {
            // Claims lost to another member free room in the share for
            // other elections seen free; looks that found some of those
            // taken meanwhile leave room for the next.
            self.relook(now);
        }
        self.progress_stop();
        self.flush();
    }

    /// Takes the answer to heartbeat or leave call `id`.
    pub fn handle_members_reply(&mut self, now: LocalTime, id: BatchId, result: Result<Members, StoreError>) {
        self.now = self.now.max(now);
        if self.leave_call.is_some_and(|(l, _)| l == id) {
            self.leave_call = None;
            self.mode = Mode::Stopped;
            return;
        }
        let Some((sent, sent_at)) = self.members.inflight else { return };
        if sent != id {
            return;
        }
        self.members.inflight = None;
        match result {
            Ok(m) => {
                let same = self.members.live == Some(m.live);
                self.member_left |= self.members.live.is_some_and(|was| m.live < was);
                self.members.same = if same { self.members.same.saturating_add(1) } else { 1 };
                self.members.live = Some(m.live);
                // As a lease: counted from the send, less the margin for
                // clock rates.
                let t = &self.cfg.timing;
                self.members.fresh_until = sent_at + t.lease_duration.saturating_sub(t.safety_margin);
                self.members.last_error = None;
                self.members.led = m.led.zip(m.most);
                self.place_slot(sent_at, m);
            }
            Err(e) => self.members.last_error = Some(e),
        }
        self.shed_surplus(self.now);
        // A member counted out makes room in the share.
        self.relook(self.now);
        self.flush();
    }

    // ---- inside ----

    /// Whether `e`'s term was claimed beyond the share recently enough to
    /// be kept (see [`BEYOND_SHARE_KEPT`]).
    fn kept_beyond_share(&self, e: &Entry) -> bool {
        let kept = self.cfg.timing.lease_duration.saturating_mul(BEYOND_SHARE_KEPT);
        e.beyond_share.is_some_and(|since| self.now < since + kept)
    }

    /// Shuts election `key`'s machine down (see [`GroupMachine::leave`]).
    fn start_leaving(&mut self, key: ElectionKey, release: bool) {
        let now = self.now;
        if let Some(e) = self.entries.get_mut(&key).filter(|e| !e.leaving) {
            e.leaving = true;
            self.staying -= 1;
        }
        self.touch(key, |m| if release { m.shutdown(now) } else { m.shutdown_without_release(now) });
    }

    fn next_grid_after(&self, t: LocalTime) -> LocalTime {
        let tick = self.cfg.tick.as_nanos().max(1);
        let phase = self.phase.as_nanos() % tick;
        let t = t.as_duration().as_nanos();
        let k = if t < phase { 0 } else { (t - phase) / tick + 1 };
        let at = phase + k * tick;
        LocalTime::from_duration(Duration::from_nanos(u64::try_from(at).unwrap_or(u64::MAX)))
    }

    /// Whether followers may look lazily ([`Machine::set_lazy_looks`]): with
    /// a fair share, while this participant lacks at most
    /// `floor(slack / live)` elections of its share, where `slack = share *
    /// live - elections` is what rounding the share up leaves over.
    /// Whenever an election is unled, or a member leads more than its
    /// share and will shed, the members under their share (at most `live`)
    /// lack `slack + 1` or more between them, so one lacks more than that
    /// and looks every retry period: a shed or free election is found as
    /// soon as before (`lazy_threshold`'s test goes through every case of
    /// up to 7 members and 20 elections).
    /// When every member lazy leads its share give or take rounding, a
    /// lease another holds is freed only by its holder's failure (seen at
    /// the lease's expiry, as before), a resignation (seen up to a lease
    /// later), or the holder leaving the group, which the heartbeat
    /// reports: the share grows and the lazy looks end at once.
    fn lazy_looks(&self) -> bool {
        let (Some(share), Some(live)) = (self.share(), self.members.live) else { return false };
        if share == 0 || self.mode != Mode::Running {
            return false;
        }
        self.claim_budget() <= lazy_threshold(share, live as usize, self.staying) || self.all_led_within_shares(share)
    }

    /// Whether, by the members' reports in the last heartbeat answer, they
    /// lead every election between them and none leads more than `share`:
    /// then no election is free and none is about to be shed, and a member
    /// short of its share (rounding leaves some short) has nothing to look
    /// for every period. Reports are a renew interval old at most; an
    /// election resigned since is reported at its holder's next heartbeat
    /// and seen by the others' next ones, and the looks put off come back
    /// within a retry period (`end_lazy_looks`).
    fn all_led_within_shares(&self, share: usize) -> bool {
        self.members
            .led
            .is_some_and(|(led, most)| led >= self.staying as u64 && usize::try_from(most).is_ok_and(|m| m <= share))
    }

    /// How many more claims the share allows now (unbounded without one).
    fn claim_budget(&self) -> usize {
        match self.share() {
            None => usize::MAX,
            Some(share) => share.saturating_sub(self.leading + self.claiming),
        }
    }

    /// Steps election `key`'s machine through `f` under the share's claim
    /// gate, then takes its outputs: calls into `pending`, the rest into
    /// `events`. Keeps the counts and the wake-up index right.
    ///
    /// The share's starvation valve: an election that this participant has
    /// seen unled (no valid lease) for a whole lease may be claimed beyond
    /// the share. Nobody under its share took it in that time, so nobody
    /// will (a member counted live that runs fewer elections, or none
    /// yet); without the valve it would stay leaderless. Such a term is not
    /// shed.
    fn touch<R>(&mut self, key: ElectionKey, f: impl FnOnce(&mut Machine) -> R) -> Option<R> {
        let by_share = self.claim_budget() > 0;
        let lazy = self.lazy_looks();
        let (now, lease) = (self.now, self.cfg.timing.lease_duration);
        let entry = self.entries.get_mut(&key)?;
        let starved = entry.unled_since.is_some_and(|t| now >= t + lease);
        entry.machine.set_claims_allowed(by_share || starved);
        entry.machine.set_lazy_looks(now, lazy);
        let r = f(&mut entry.machine);
        while let Some(out) = entry.machine.poll_output() {
            match out {
                Output::Call(call) => self.pending[BatchOp::of(call.op).index()].push((key, call)),
                out => self.events.push_back((key, out)),
            }
        }
        let leading = entry.machine.term().is_some();
        let claiming = matches!(entry.machine.call_in_flight(), Some(Call { op: Op::Acquire { .. }, .. }));
        if claiming && !entry.claiming {
            entry.valve_claim = !by_share;
        }
        if leading && !entry.leading {
            entry.beyond_share = entry.valve_claim.then_some(now);
        }
        if !leading {
            entry.beyond_share = None;
        }
        // Seen unled by a look that worked (a failing store tells nothing).
        let m = &entry.machine;
        if leading || claiming || m.observed().is_some_and(|o| o.valid) {
            entry.unled_since = None;
        } else if m.last_error().is_none() && m.call_in_flight().is_none() {
            entry.unled_since.get_or_insert(now);
        }
        self.leading = self.leading + usize::from(leading) - usize::from(entry.leading);
        self.claiming = self.claiming + usize::from(claiming) - usize::from(entry.claiming);
        (entry.leading, entry.claiming) = (leading, claiming);
        let wake = entry.machine.poll_timeout();
        if wake != entry.wake {
            if let Some(w) = entry.wake {
                self.wakes.remove(&(w, key));
            }
            if let Some(w) = wake {
                self.wakes.insert((w, key));
            }
            entry.wake = wake;
        }
        if !entry.touched {
            entry.touched = true;
            self.touched.push(key);
        }
        Some(r)
    }

    /// When followers stop looking lazily, brings every look put off so
    /// back to the look phase: the next instant a whole number of retry
    /// periods after its last look, at most a retry period away, with the
    /// other followers' looks. When they stop because a member left (the
    /// count fell), every follower looks at once instead, in one batch:
    /// the member that left released its leases, and they go to the others
    /// as soon as without lazy looks.
    fn end_lazy_looks(&mut self, now: LocalTime) {
        let lazy = self.lazy_looks();
        let was = std::mem::replace(&mut self.lazy, lazy);
        let member_left = std::mem::take(&mut self.member_left);
        if !was || lazy {
            return;
        }
        let mut followers: Vec<ElectionKey> =
            self.entries.iter().filter(|(_, e)| !e.leading).map(|(k, _)| *k).collect();
        followers.sort_unstable(); // as in shutdown
        let soon = now + self.cfg.timing.retry_period + self.cfg.tick;
        for key in followers {
            self.touch(key, |m| {
                if member_left {
                    m.handle_timeout_early(now, soon);
                }
            });
        }
    }

    /// With room in the share, looks again at once at elections its last
    /// look found free while the share withheld claims (the most preferred
    /// first, as many as there is room for), instead of a retry period
    /// later. Room opens when claims are lost to another member (members
    /// racing for a mass of free elections collide, and each collision
    /// would otherwise cost a retry period) or the count of members drops.
    /// Each round costs a round trip; an election such a look finds taken
    /// drops out (it is no longer seen free), so the rounds end once the
    /// share is full or nothing seen free is left.
    fn relook(&mut self, now: LocalTime) {
        let room = self.claim_budget();
        if room == 0 || room == usize::MAX || self.mode != Mode::Running {
            return;
        }
        let mut free: Vec<(u64, ElectionKey)> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                !e.leading && !e.claiming && e.unled_since.is_some() && e.machine.call_in_flight().is_none()
            })
            .map(|(k, e)| (e.pref, *k))
            .collect();
        if free.is_empty() {
            return;
        }
        free.sort_unstable_by(|a, b| b.cmp(a));
        // Past any next look: a plain look goes now (claims never early).
        let far = now + self.cfg.timing.retry_period.saturating_mul(2) + self.cfg.tick;
        for (_, key) in free.into_iter().take(room) {
            self.touch(key, |m| m.handle_timeout_early(now, far));
        }
    }

    /// This member's renewal slot from a heartbeat answer `m` to the call
    /// sent at `sent_at` (see the module docs): the instants at which the
    /// database clock stands `rank / live` of a renew interval past a whole
    /// number of intervals since the epoch. The database's `now` is taken
    /// to fall halfway through the round trip (off by half of it at most,
    /// a few milliseconds). The grid moves so that the slot lies on it. An
    /// estimate within a quarter of the members' spacing of the slot in
    /// force changes nothing, nor does one through a longer round trip
    /// that agrees with it within both estimates' errors.
    fn place_slot(&mut self, sent_at: LocalTime, m: Members) {
        let interval = self.cfg.timing.renew_interval;
        let (Some(rank), true) = (m.rank, self.cfg.spread_renewals) else {
            self.members.slot = None;
            return;
        };
        let period = i128::try_from(interval.as_micros()).unwrap_or(i128::MAX);
        if period == 0 {
            return;
        }
        let live = i128::from(m.live.max(1));
        self.members.slot_live = m.live.max(1);
        let target = i128::from(rank).min(live - 1) * period / live;
        let ahead = (target - i128::from(m.now.as_unix_micros())).rem_euclid(period);
        let mid = sent_at + self.now.saturating_since(sent_at) / 2;
        let slot = mid + Duration::from_micros(u64::try_from(ahead).unwrap_or(0));
        // Within a quarter of the members' spacing of the slot in force, it
        // is the same slot, estimated through another round trip: kept, as
        // a slot moved a little later would take renewals a tick early to
        // the grid instant before it, and again at the slot. Members that
        // split their renewals have two slots each, half as far apart. An
        // estimate through a round trip under a quarter of the one that
        // placed the slot, and further from it than that round trip,
        // replaces it all the same: a slot placed while the database was
        // slow (at the start, behind the first claims) is off by up to half
        // that round trip, and would otherwise stay so. An estimate through
        // a longer round trip than the slot's, as far from it as the two
        // estimates' errors together allow (half of each round trip), is
        // the same slot too: the database answered early in a round trip
        // that something after it stretched (a commit behind a stalled
        // disk), and moving the slot there and back at the next estimate
        // would re-phase the renewals twice, a batch more each time.
        let rtt = self.now.saturating_since(sent_at);
        if let Some(old) = self.members.slot {
            let p = interval.as_nanos().max(1);
            let d = slot.as_duration().as_nanos().abs_diff(old.as_duration().as_nanos()) % p;
            let d = d.min(p - d);
            let slots = if self.split() { 2 } else { 1 };
            let better = rtt.saturating_mul(4) < self.members.slot_rtt && d > rtt.as_nanos();
            let close = d <= interval.as_nanos() / (4 * slots * live.unsigned_abs());
            let worse = rtt > self.members.slot_rtt && d <= (rtt + self.members.slot_rtt).as_nanos() / 2;
            if (close || worse) && !better {
                return;
            }
        }
        self.members.slot = Some(slot);
        self.members.slot_rtt = rtt;
        let tick = self.cfg.tick.as_nanos().max(1);
        self.phase = Duration::from_nanos(u64::try_from(slot.as_duration().as_nanos() % tick).unwrap_or(0));
    }

    /// Whether this member renews in two batches per interval now (see the
    /// module docs).
    fn split(&self) -> bool {
        self.cfg.spread_renewals && self.members.slot.is_some() && self.leading >= self.cfg.split_renewals_from
    }

    /// How far after each instant of its slot a member that splits its
    /// renewals has its second one: half an interval, and with an even
    /// number of members `1 / (2 live)` of it more, so that the `2 live`
    /// slots of the members lie evenly over the interval.
    fn second_slot_offset(&self) -> Duration {
        let interval = self.cfg.timing.renew_interval;
        let live = self.members.slot_live.max(1);
        let extra = if live.is_multiple_of(2) { interval / (2 * live) } else { Duration::ZERO };
        interval / 2 + extra
    }

    /// The series of instants `base` plus whole renew intervals: the latest
    /// at or before `t`.
    fn series_at(&self, base: LocalTime, t: LocalTime) -> LocalTime {
        let period = self.cfg.timing.renew_interval.as_nanos().max(1);
        if t >= base {
            let k = t.saturating_since(base).as_nanos() / period;
            base + Duration::from_nanos(u64::try_from(k * period).unwrap_or(u64::MAX))
        } else {
            let k = base.saturating_since(t).as_nanos().div_ceil(period);
            let back = Duration::from_nanos(u64::try_from(k * period).unwrap_or(u64::MAX));
            base.saturating_sub(back)
        }
    }

    /// The latest instant of this member's slots at or before `t`, if it
    /// has a slot (two series of instants when it splits its renewals).
    fn last_slot_at(&self, t: LocalTime) -> Option<LocalTime> {
        let slot = self.members.slot?;
        let first = self.series_at(slot, t);
        if !self.split() {
            return Some(first);
        }
        Some(first.max(self.series_at(slot + self.second_slot_offset(), t)))
    }

    /// The slot instant after slot instant `s`.
    fn next_slot_after(&self, s: LocalTime) -> LocalTime {
        let interval = self.cfg.timing.renew_interval;
        match self.members.slot {
            Some(slot) if self.split() => {
                let after = |base: LocalTime| self.series_at(base, s) + interval;
                after(slot).min(after(slot + self.second_slot_offset()))
            }
            _ => s + interval,
        }
    }

    /// At each slot instant, every term whose renewal falls due before the
    /// next one renews now, early (anchored at this send, so safe): the
    /// terms renew together once per interval, at the slot. A member that
    /// splits its renewals also renews, while the batch holds fewer than
    /// half its terms, the terms due next after that, early: the two
    /// batches even out after one such renewal. A slot instant goes once;
    /// a later estimate of the same slot (each heartbeat moves it by the
    /// round trip's noise) does not go again within half the gap to the
    /// member's other slot.
    fn renew_at_slot(&mut self, now: LocalTime) {
        if self.mode != Mode::Running {
            return;
        }
        let Some(s) = self.last_slot_at(now) else { return };
        let interval = self.cfg.timing.renew_interval;
        let split = self.split();
        let gap = if split {
            let off = self.second_slot_offset();
            off.min(interval.saturating_sub(off))
        } else {
            interval
        };
        if self.slot_served.is_some_and(|d| s < d + gap / 2) {
            return;
        }
        self.slot_served = Some(s);
        let next = self.next_slot_after(s);
        let due: Vec<ElectionKey> = self
            .wakes
            .range(..(next, ElectionKey(0)))
            .filter(|(_, k)| self.entries.get(k).is_some_and(|e| e.leading))
            .map(|(_, k)| *k)
            .collect();
        for key in due {
            self.touch(key, |m| m.handle_timeout_early(now, next));
        }
        if !split {
            return;
        }
        let half = self.leading / 2;
        let have = self.pending[BatchOp::Renew.index()].len();
        if have >= half {
            return;
        }
        let ahead: Vec<(LocalTime, ElectionKey)> = self
            .wakes
            .range((next, ElectionKey(0))..)
            .filter(|(_, k)| self.entries.get(k).is_some_and(|e| e.leading && e.machine.call_in_flight().is_none()))
            .take(half - have)
            .copied()
            .collect();
        for (at, key) in ahead {
            self.touch(key, |m| m.handle_timeout_early(now, at + Duration::from_nanos(1)));
        }
    }

    /// When renewals go out at this grid instant, the renewals due within
    /// half a renew interval and a tick go with them (early, anchored at
    /// this send); likewise the looks due within half a retry period and a
    /// tick. So terms that
    /// started at different instants (claimed in different batches, joined
    /// at different times) renew in one batch per interval after one early
    /// renewal, instead of one batch per phase for ever.
    fn merge_phases(&mut self, now: LocalTime, horizon: LocalTime) {
        let t = self.cfg.timing;
        // With a slot, renewals come together there instead (and a merge
        // here would only take them off it).
        let renewing = !self.pending[BatchOp::Renew.index()].is_empty() && self.members.slot.is_none();
        let looking = !self.pending[BatchOp::Inspect.index()].is_empty();
        // Half an interval and a tick: two phases exactly half an interval
        // apart merge too.
        let tick = self.cfg.tick;
        let windows = [(renewing, now + t.renew_interval / 2 + tick), (looking, now + t.retry_period / 2 + tick)];
        let Some(far) = windows.iter().filter(|(on, _)| *on).map(|(_, at)| *at).max() else { return };
        let ahead: Vec<ElectionKey> =
            self.wakes.range((horizon, ElectionKey(0))..(far, ElectionKey(0))).map(|(_, k)| *k).collect();
        for key in ahead {
            let Some(e) = self.entries.get(&key) else { continue };
            let (on, until) = if e.leading { windows[0] } else { windows[1] };
            if on && e.wake.is_some_and(|w| w < until) {
                self.touch(key, |m| m.handle_timeout_early(now, until));
            }
        }
    }

    /// Turns the calls taken from the machines into batches, one per kind,
    /// the most preferred election first.
    fn flush(&mut self) {
        for op in BatchOp::ALL {
            let calls = std::mem::take(&mut self.pending[op.index()]);
            if calls.is_empty() {
                continue;
            }
            let mut entries: Vec<(u64, BatchEntry)> = calls
                .into_iter()
                .filter_map(|(key, call)| {
                    let e = self.entries.get(&key)?;
                    let fence = match call.op {
                        Op::Renew { fence, .. } | Op::Release { fence } => fence,
                        _ => 0,
                    };
                    let entry = BatchEntry {
                        key,
                        call: call.id,
                        name: Arc::clone(&e.name),
                        fence,
                        payload: Arc::clone(&e.payload),
                    };
                    Some((e.pref, entry))
                })
                .collect();
            entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
            let entries: Vec<BatchEntry> = entries.into_iter().map(|(_, e)| e).collect();
            self.next_batch += 1;
            let id = BatchId(self.next_batch);
            let calls = entries.iter().map(|e| (e.key, e.call)).collect();
            self.inflight.insert(id, InFlightBatch { op, calls, sent_at: self.now });
            let ttl = self.cfg.timing.lease_duration;
            let heartbeat = if op == BatchOp::Renew { self.beat.take() } else { None };
            self.calls.push_back(GroupCall::Batch(Batch { id, op, ttl, entries, heartbeat }));
        }
        // A heartbeat meant for a renewal batch that did not form goes alone.
        if let Some(b) = self.beat.take() {
            self.calls.push_back(GroupCall::Heartbeat { id: b.id, ttl: b.ttl, leading: b.leading });
        }
    }

    /// Sends the heartbeat when due (early, like a renewal, if due before
    /// `horizon`); gives up on one unanswered past the operation timeout.
    fn heartbeat(&mut self, now: LocalTime, horizon: LocalTime) {
        if !self.cfg.fair_share || self.mode != Mode::Running {
            return;
        }
        let t = self.cfg.timing;
        if let Some((_, sent_at)) = self.members.inflight {
            if now < sent_at + t.operation_timeout {
                return;
            }
            self.members.inflight = None;
            self.members.last_error =
                Some(StoreError::retryable(format!("heartbeat gave no answer within {:?}", t.operation_timeout)));
        }
        if self.members.next_at >= horizon {
            return;
        }
        // A member that splits its renewals sends its heartbeat with one of
        // them: it waits for the next renewal batch, up to an interval past
        // its time (two batches go every interval).
        let with_renewal = self.split() && !self.pending[BatchOp::Renew.index()].is_empty();
        if self.split() && !with_renewal && now < self.members.next_at + t.renew_interval {
            return;
        }
        self.next_batch += 1;
        let id = BatchId(self.next_batch);
        self.members.inflight = Some((id, now));
        self.members.next_at = now + t.renew_interval;
        let leading = u32::try_from(self.leading).unwrap_or(u32::MAX);
        if with_renewal {
            self.beat = Some(BatchHeartbeat { id, ttl: t.lease_duration, leading });
        } else {
            self.calls.push_back(GroupCall::Heartbeat { id, ttl: t.lease_duration, leading });
        }
    }

    /// With a fair share, a count seen twice in a row and more terms than
    /// the share: resigns the surplus, least preferred first.
    fn shed_surplus(&mut self, now: LocalTime) {
        if self.mode != Mode::Running || self.members.same < 2 {
            return;
        }
        let Some(share) = self.share() else { return };
        if share == 0 {
            return;
        }
        if self.leading <= share {
            // Within the share again (it grew): terms claimed beyond it
            // are ordinary ones now, shed like any other if it shrinks.
            self.entries.values_mut().for_each(|e| e.beyond_share = None);
            return;
        }
        let mut leading: Vec<(u64, ElectionKey)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.leading && !self.kept_beyond_share(e))
            .map(|(k, e)| (e.pref, *k))
            .collect();
        // Terms beyond the share are nobody else's to take: they neither
        // count nor go.
        let Some(surplus) = leading.len().checked_sub(share).filter(|s| *s > 0) else { return };
        leading.sort_unstable();
        for (_, key) in leading.into_iter().take(surplus) {
            self.touch(key, |m| {
                if let Some(term) = m.term() {
                    m.resign(now, term.id);
                }
            });
            self.shed += 1;
        }
    }

    /// Once every election has stopped, the member leaves, and then the
    /// group has stopped.
    fn progress_stop(&mut self) {
        if self.mode != Mode::Stopping || !self.entries.values().all(|e| e.machine.is_stopped()) {
            return;
        }
        if !self.cfg.fair_share {
            self.mode = Mode::Stopped;
            return;
        }
        match self.leave_call {
            Some((_, sent_at)) if self.now >= sent_at + self.cfg.timing.operation_timeout => {
                self.leave_call = None;
                self.mode = Mode::Stopped;
            }
            Some(_) => {}
            None => {
                self.next_batch += 1;
                let id = BatchId(self.next_batch);
                self.leave_call = Some((id, self.now));
                self.calls.push_back(GroupCall::Leave { id });
            }
        }
    }
}

/// The most elections a member may lack of its `share` and still look
/// lazily, with `live` members and `elections` elections: what rounding
/// the share up leaves over, divided among the members (see
/// `GroupMachine::lazy_looks`).
fn lazy_threshold(share: usize, live: usize, elections: usize) -> usize {
    let slack = share.saturating_mul(live).saturating_sub(elections);
    slack / live.max(1)
}

fn key_bits(key: ElectionKey) -> u64 {
    u64::from(key.0).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// SplitMix64's finaliser: spreads a seed's bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How much `identity` prefers to lead election `name`: a hash of both
/// (FNV-1a, then mixed), the same in every process.
pub fn preference(identity: &str, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in identity.bytes().chain([0xff]).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
