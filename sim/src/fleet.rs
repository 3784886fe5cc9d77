//! What both worlds (one election per host in `world.rs`, groups in
//! `group.rs`) run on: the shared database (a [`MemStore`] on a manual
//! clock) and the hosts' links to it, the faults that hold up, lose or slow
//! their messages or fail the database's statements, the event loop, the
//! hosts' clocks and timers, and the trace.

use std::fmt;
use std::time::Duration;

use leaderelection::group::core::GroupCall;
use leaderelection::machine::{Call, LocalTime, Output, Term, TermId};
use leaderelection::{DbTime, MemStore};

use crate::events::{self, dur, nanos, Events, HostClock};
use crate::rng::SimRng;
use crate::schedule::{Host, Target, WakeFeed, PPM};
use crate::world::DB_BASE_MICROS;

/// What a fault does while its window lasts, to the database (no target)
/// or to one host's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Window {
    /// The database answers nothing: requests wait, then apply in order.
    PauseDb,
    /// Every message to or from the host is lost.
    Partition,
    /// Percentages of the host's requests and replies lost.
    Lossy { req_loss: u8, rep_loss: u8 },
    /// Added to every delay of the host's messages.
    SlowNet { extra: Duration },
    /// Every statement fails, fatally or not.
    DbFailing { fatal: bool },
}

/// A fault of a schedule, seen as a window: whom it hits (`None`: the
/// database), for how long and how; `None` for a fault of another kind.
pub(crate) trait Windowed {
    fn window(&self) -> Option<(Option<Target>, Duration, Window)>;
}

/// How long after a window opens its effects are over: its length, and
/// for a slow link the slowed messages still travelling (`rtt`: the
/// longest round trip with no fault).
pub(crate) fn window_end(length: Duration, window: Window, rtt: Duration) -> Duration {
    match window {
        Window::SlowNet { extra } => length + extra * 2 + rtt,
        _ => length,
    }
}

/// A call on its way to the database, by its number.
pub(crate) trait Sent {
    fn number(&self) -> u64;
}

impl Sent for Call {
    fn number(&self) -> u64 {
        self.id.0
    }
}

impl Sent for GroupCall {
    fn number(&self) -> u64 {
        self.id().0
    }
}

/// A guard, as the driver's outputs have it: its term, fence and deadline
/// (on its host's clock), the real instant it started, and what a world
/// adds (`X`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Guard<X = ()> {
    pub(crate) term: TermId,
    pub(crate) fence: u64,
    pub(crate) deadline: LocalTime,
    pub(crate) start: u64,
    pub(crate) more: X,
}

/// Whether a machine's term and the driver's guard (from the outputs)
/// disagree: the detail, if they do.
pub(crate) fn outputs_disagree<X>(identity: &str, guard: Option<&Guard<X>>, term: Option<Term>) -> Option<String> {
    let from_machine = term.map(|x| (x.id, x.fence, x.deadline));
    let from_outputs = guard.map(|g| (g.term, g.fence, g.deadline));
    (from_machine != from_outputs)
        .then(|| format!("{identity}: outputs say {from_outputs:?}, machine says {from_machine:?}"))
}

/// The stretches of uninterrupted leadership the terms `(start, end)`
/// (real instants) make, in order: overlapping or touching terms joined,
/// empty ones left out.
pub(crate) fn stretches(mut terms: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    terms.retain(|(s, end)| end > s);
    terms.sort_unstable();
    let mut stretches: Vec<(u64, u64)> = Vec::new();
    for (s, x) in terms {
        match stretches.last_mut() {
            Some((_, le)) if s <= *le => *le = (*le).max(x),
            _ => stretches.push((s, x)),
        }
    }
    stretches
}

/// What the store's release feed did in one run, and how long the
/// hand-overs after releases took. The simulation watches the feed in
/// every run, so hand-overs are measured with the participants' feed off
/// too; only with it on do they get wakes ([`WakeFeed`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReleaseStats {
    /// Whether the participants had the feed.
    pub feed: bool,
    /// Releases that ended a live term (in a group, one per election).
    pub releases: u64,
    /// Wakes sent (one per other running participant and release; in a
    /// group one per other member and release batch), lost on the way,
    /// delivered to a running process, and sent twice.
    pub wakes_sent: u64,
    /// See [`ReleaseStats::wakes_sent`].
    pub wakes_lost: u64,
    /// See [`ReleaseStats::wakes_sent`].
    pub wakes_delivered: u64,
    /// See [`ReleaseStats::wakes_sent`].
    pub wakes_doubled: u64,
    /// Hand-overs after a release: the first term of the election to start
    /// after each release, whoever started it.
    pub handovers: u64,
    /// Their durations, from the database applying the release to the
    /// next term starting (real time), summed.
    pub handover_total: Duration,
    /// The longest of them.
    pub longest_handover: Duration,
}

impl ReleaseStats {
    /// A term started at real instant `t`, the first since a release the
    /// database applied at `released`.
    pub(crate) fn handed_over(&mut self, released: u64, t: u64) {
        let took = dur(t.saturating_sub(released));
        self.handovers += 1;
        self.handover_total += took;
        self.longest_handover = self.longest_handover.max(took);
    }
}

/// [`ReleaseStats`] summed over the runs of an exploration with the feed on,
/// or over those with it off.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReleaseTotals {
    /// Runs added.
    pub schedules: u64,
    /// The sums of their counts and durations; the longest hand-over.
    pub stats: ReleaseStats,
}

impl ReleaseTotals {
    /// The totals of one run, as (with the feed, without it): the run in
    /// one, nothing in the other.
    pub(crate) fn by_feed(r: &ReleaseStats) -> (ReleaseTotals, ReleaseTotals) {
        let run = ReleaseTotals { schedules: 1, stats: *r };
        if r.feed {
            (run, ReleaseTotals::default())
        } else {
            (ReleaseTotals::default(), run)
        }
    }

    /// The mean hand-over after a release.
    pub fn mean_handover(&self) -> Duration {
        let n = u32::try_from(self.stats.handovers).unwrap_or(u32::MAX).max(1);
        self.stats.handover_total / n
    }

    /// One part of an exploration's summary: `what` names the runs.
    pub fn summary(&self, what: &str) -> String {
        let s = &self.stats;
        format!(
            "{} schedules {what}: {} releases, hand-over after a release {:?} on average (longest {:?}, {} measured); \
             {} wakes sent, {} delivered, {} lost, {} doubled",
            self.schedules,
            s.releases,
            self.mean_handover(),
            s.longest_handover,
            s.handovers,
            s.wakes_sent,
            s.wakes_delivered,
            s.wakes_lost,
            s.wakes_doubled
        )
    }
}

/// Adds one run's or one part's totals (the longest hand-over is the
/// larger), so that an exploration's `merge` sums them as counts.
impl std::ops::AddAssign for ReleaseTotals {
    fn add_assign(&mut self, o: ReleaseTotals) {
        // Taken apart whole: a field added and not summed here fails to
        // compile.
        let ReleaseStats {
            feed: _,
            releases,
            wakes_sent,
            wakes_lost,
            wakes_delivered,
            wakes_doubled,
            handovers,
            handover_total,
            longest_handover,
        } = o.stats;
        let a = &mut self.stats;
        self.schedules += o.schedules;
        a.releases += releases;
        a.wakes_sent += wakes_sent;
        a.wakes_lost += wakes_lost;
        a.wakes_delivered += wakes_delivered;
        a.wakes_doubled += wakes_doubled;
        a.handovers += handovers;
        a.handover_total += handover_total;
        a.longest_handover = a.longest_handover.max(longest_handover);
    }
}

/// How one run went, in either world's report: what its event loop
/// counted and traced, and the times its liveness is judged by (when the
/// faults ended, the bound after them, how soon leadership recovered).
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Events processed.
    pub events: u64,
    /// Requests lost on the way.
    pub lost_requests: u64,
    /// Replies lost on the way (the write landed).
    pub lost_replies: u64,
    /// Virtual time the run covered.
    pub virtual_time: Duration,
    /// When the last fault's effects ended.
    pub faults_end: Duration,
    /// The liveness bound for this schedule.
    pub liveness_bound: Duration,
    /// How long after the faults ended the final, lasting leadership
    /// began (in a group, the latest over the elections; zero if it began
    /// before); `None` when the run failed or liveness was not judged.
    pub recovery: Option<Duration>,
    /// A hash of every event, its time and its effect.
    pub trace_hash: u64,
    /// The events as text, when asked for.
    pub trace: Vec<String>,
}

impl Timeline {
    /// Requests and replies lost.
    pub fn lost(&self) -> u64 {
        self.lost_requests + self.lost_replies
    }

    /// The recovery and the bound it was held to (zeros without one), as
    /// an exploration keeps its worst.
    pub fn recovery_of_bound(&self) -> (Duration, Duration) {
        self.recovery.map_or_else(Default::default, |rec| (rec, self.liveness_bound))
    }

    /// How a liveness violation at the end of the run (`end`) begins: the
    /// times it was judged by.
    pub(crate) fn missed(&self, end: u64) -> String {
        format!("faults ended at {:?}, bound {:?}, run ended at {:?}", self.faults_end, self.liveness_bound, dur(end))
    }
}

/// One process of a world, as the event loop sees it.
pub(crate) struct Process<'n> {
    pub(crate) host: usize,
    pub(crate) identity: &'n str,
    /// Its timer, while it runs.
    pub(crate) timer: Option<&'n mut Timer>,
}

/// A host: its current process and how many it has run.
#[derive(Default)]
pub(crate) struct HostState {
    pub(crate) current: Option<usize>,
    pub(crate) restart_pending: bool,
    /// Killed or stopped for good (groups only).
    pub(crate) gone: bool,
    pub(crate) processes: u32,
}

/// A process's timer: when it is armed, and how often it fired at one
/// instant (a timer that never moves is a busy loop).
#[derive(Default)]
pub(crate) struct Timer {
    pub(crate) at: Option<u64>,
    fired: (u64, u32),
}

/// What a wake-up event finds.
pub(crate) enum Fired {
    /// The timer was re-armed since: nothing to do.
    Stale,
    /// The timer fires.
    Now,
    /// It fired more than a thousand times at one instant.
    Stuck,
}

impl Timer {
    /// The wake-up for real instant `t`.
    pub(crate) fn fire(&mut self, t: u64) -> Fired {
        if self.at != Some(t) {
            return Fired::Stale;
        }
        self.at = None;
        let (at, count) = self.fired;
        let count = if at == t { count + 1 } else { 1 };
        self.fired = (t, count);
        if count > 1000 {
            Fired::Stuck
        } else {
            Fired::Now
        }
    }

    /// Arms it for `wake`: the instant to schedule a wake-up at, when it
    /// changed.
    pub(crate) fn arm(&mut self, wake: Option<u64>) -> Option<u64> {
        if wake == self.at {
            return None;
        }
        self.at = wake;
        wake
    }
}

/// An event of a run: those of every world, and the world's own (`X`).
/// `C` is a call on its way to the database.
pub(crate) enum Ev<C, X> {
    /// A host's first process starts.
    Start {
        host: usize,
    },
    /// A fresh process starts on a host after a crash, kill or shutdown.
    Restart {
        host: usize,
    },
    /// A process's timer fires, if it is still armed for this instant.
    Wake {
        node: usize,
    },
    /// A request reaches the database.
    Request {
        node: usize,
        call: C,
    },
    /// Fault `i` of the schedule starts.
    FaultStart(usize),
    /// Fault `i`'s window closes.
    FaultEnd(usize),
    /// The run ends.
    End,
    Own(X),
}

/// A world: what it does with the events every world has.
pub(crate) trait Fleet<'a>: Sized {
    type Call: Sent;
    type Own;
    fn net(&mut self) -> &mut Net<'a, Self::Call, Self::Own>;
    fn process(&mut self, node: usize) -> Process<'_>;
    /// A process starts on `host`.
    fn spawn(&mut self, t: u64, host: usize);
    /// `node`'s timer fired.
    fn woken(&mut self, t: u64, node: usize);
    /// The database applies `node`'s call.
    fn apply(&mut self, t: u64, node: usize, call: Self::Call);
    fn fault_start(&mut self, t: u64, i: usize);
    fn own(&mut self, t: u64, ev: Self::Own);
    /// After each event: whether the run goes on (no violation yet).
    fn go_on(&mut self, t: u64) -> bool;
    /// After the last event (`now`), with the run meant to end at `end`.
    fn finish(&mut self, now: u64, end: u64);
    /// The machines make no progress (a busy loop): a violation.
    fn no_progress(&mut self, t: u64, detail: String);

    fn step(&mut self, t: u64, ev: Ev<Self::Call, Self::Own>) {
        match ev {
            Ev::Start { host } => self.spawn(t, host),
            Ev::Restart { host } => {
                self.net().states[host].restart_pending = false;
                self.spawn(t, host);
            }
            Ev::Wake { node } => {
                let p = self.process(node);
                let Some(timer) = p.timer else { return };
                match timer.fire(t) {
                    Fired::Stale => {}
                    Fired::Now => self.woken(t, node),
                    Fired::Stuck => {
                        let detail = format!("{} woke 1000 times at one instant", p.identity);
                        self.no_progress(t, detail);
                    }
                }
            }
            Ev::Request { node, call } => {
                let host = self.process(node).host;
                if let Some(call) = self.net().arrive(t, node, host, call.number(), call) {
                    self.apply(t, node, call);
                }
            }
            Ev::FaultStart(i) => self.fault_start(t, i),
            Ev::FaultEnd(i) => {
                for (node, call) in self.net().close(t, i) {
                    self.apply(t, node, call);
                }
            }
            Ev::End => {}
            Ev::Own(ev) => self.own(t, ev),
        }
    }

    /// `host`'s process is gone: a fresh one starts `down` later.
    fn restart_later(&mut self, t: u64, host: usize, down: Duration) {
        self.net().states[host].restart_pending = true;
        self.net().push(t + nanos(down), Ev::Restart { host });
    }

    /// Runs the events to `end`, the first violation, or `max_events`
    /// (a violation too), then [`Fleet::finish`]; the run's timeline.
    fn run_to(&mut self, end: u64, max_events: u64) -> Timeline {
        self.net().push(end, Ev::End);
        let mut now = 0;
        while let Some((t, ev)) = self.net().queue.pop() {
            now = t;
            self.net().timeline.events += 1;
            if self.net().timeline.events > max_events {
                self.no_progress(t, format!("more than {max_events} events"));
                break;
            }
            if matches!(ev, Ev::End) {
                break;
            }
            self.step(t, ev);
            if !self.go_on(t) {
                break;
            }
        }
        self.net().timeline.virtual_time = dur(now);
        self.finish(now, end);
        std::mem::take(&mut self.net().timeline)
    }
}

/// The database, the links and the event queue of one run. `C` is a call
/// on its way to the database, `X` the world's own events.
pub(crate) struct Net<'a, C, X> {
    pub(crate) hosts: &'a [Host],
    /// What runs on each host.
    pub(crate) states: Vec<HostState>,
    pub(crate) rng: SimRng,
    pub(crate) store: MemStore,
    /// The database clock, in microseconds since the run began.
    pub(crate) db_micros: u64,
    queue: Events<Ev<C, X>>,
    /// Windows open: (fault index, the host it hits or `usize::MAX` for the
    /// database, what it does).
    active: Vec<(usize, usize, Window)>,
    paused: u32,
    /// Requests that reached a paused database, in order.
    held: Vec<(usize, C)>,
    tracing: bool,
    /// The run's timeline: the world sets its faults' end and liveness
    /// bound before the run and its recovery at the end.
    pub(crate) timeline: Timeline,
}

impl<'a, C, X> Net<'a, C, X> {
    pub(crate) fn new(seed: u64, hosts: &'a [Host], tracing: bool) -> Self {
        Net {
            hosts,
            states: hosts.iter().map(|_| HostState::default()).collect(),
            rng: SimRng::new(seed),
            store: MemStore::with_manual_clock(DbTime::from_unix_micros(DB_BASE_MICROS)),
            db_micros: 0,
            queue: Events::new(),
            active: Vec::new(),
            paused: 0,
            held: Vec::new(),
            tracing,
            timeline: Timeline { trace_hash: 0xcbf2_9ce4_8422_2325, ..Timeline::default() },
        }
    }

    pub(crate) fn push(&mut self, t: u64, ev: Ev<C, X>) {
        self.queue.push(t, ev);
    }

    /// Schedules one of the world's own events.
    pub(crate) fn push_own(&mut self, t: u64, ev: X) {
        self.queue.push(t, Ev::Own(ev));
    }

    /// Schedules every host's first process.
    pub(crate) fn start_hosts(&mut self) {
        for (host, h) in self.hosts.iter().enumerate() {
            self.queue.push(nanos(h.start_at), Ev::Start { host });
        }
    }

    /// See [`events::note`].
    pub(crate) fn note(&mut self, t: u64, code: u64, a: u64, b: u64, text: impl FnOnce() -> String) {
        let trace = self.tracing.then_some(&mut self.timeline.trace);
        events::note(&mut self.timeline.trace_hash, trace, (t, code, a, b), text);
    }

    // ---- clocks ----

    fn clock(&self, host: usize) -> HostClock {
        let h = &self.hosts[host];
        HostClock { offset: h.clock_offset, rate_ppm: h.rate_ppm }
    }

    /// What `host`'s clock reads at real instant `t`.
    pub(crate) fn local(&self, host: usize, t: u64) -> LocalTime {
        self.clock(host).local(t)
    }

    /// The first real instant at which `host`'s clock reads `l` or later.
    pub(crate) fn real_at(&self, host: usize, l: LocalTime) -> u64 {
        self.clock(host).real_at(l)
    }

    /// `d` of `host`'s clock in real time (rounded up).
    pub(crate) fn real_span(&self, host: usize, d: Duration) -> u64 {
        let rate = u128::from(self.hosts[host].rate_ppm);
        u64::try_from((d.as_nanos() * u128::from(PPM)).div_ceil(rate)).unwrap_or(u64::MAX)
    }

    /// Arms `node`'s `timer` (on `host`) for its machine's next timeout
    /// `at`, no earlier than `t`.
    pub(crate) fn arm(&mut self, t: u64, node: usize, host: usize, timer: &mut Timer, at: Option<LocalTime>) {
        let wake = at.map(|l| self.real_at(host, l).max(t));
        if let Some(w) = timer.arm(wake) {
            self.push(w, Ev::Wake { node });
        }
    }

    /// Moves the database clock to real instant `t` (it runs at the real
    /// rate, in whole microseconds).
    pub(crate) fn advance_db(&mut self, t: u64) {
        let target = t / 1000;
        if target > self.db_micros {
            self.store.advance(Duration::from_micros(target - self.db_micros));
            self.db_micros = target;
        }
    }

    /// Notes `node`'s output `out` (of election `election`, in a group),
    /// all but a call, which the world notes as it sends it.
    pub(crate) fn note_output(&mut self, t: u64, node: usize, election: Option<&str>, out: &Output) {
        let who = || match election {
            Some(e) => format!("n{node} {e}"),
            None => format!("n{node}"),
        };
        let n = node as u64;
        match out {
            Output::Call(_) => {}
            Output::CallAbandoned(id) => self.note(t, 11, n, id.0, || format!("{} abandons call {}", who(), id.0)),
            Output::TermStarted { fence, deadline, .. } => {
                self.note(t, 12, n, *fence, || format!("{} TERM STARTED fence {fence} deadline {deadline:?}", who()));
            }
            Output::DeadlineExtended { deadline, .. } => {
                self.note(t, 13, n, nanos(deadline.as_duration()), || format!("{} deadline {deadline:?}", who()));
            }
            Output::TermEnded { fence, reason, .. } => {
                self.note(t, 14, n, *fence, || format!("{} TERM ENDED fence {fence}: {reason:?}", who()));
            }
            Output::NewLeader { identity, fence } => {
                self.note(t, 15, n, *fence, || format!("{} sees leader {identity} fence {fence}", who()));
            }
            Output::Released { fence, result } => {
                self.note(t, 16, n, *fence, || format!("{} released fence {fence}: {result:?}", who()));
            }
            Output::Failed(e) => self.note(t, 17, n, 0, || format!("{} failed: {e}", who())),
            Output::Stopped => self.note(t, 18, n, 0, || format!("{} stopped", who())),
        }
    }

    /// One of the holders of valid guards at real instant `t` that a
    /// violation of the one-guard rule names: `identity` on `host`.
    pub(crate) fn holder<G>(&self, identity: &str, host: usize, g: &Guard<G>, t: u64) -> String {
        format!(
            "{identity} (fence {}, valid since {:?}, deadline {:?}, local now {:?}, rate {})",
            g.fence,
            dur(g.start),
            g.deadline,
            self.local(host, t),
            self.hosts[host].rate_ppm
        )
    }

    /// A guard `g` of `identity` on `host` extended to `deadline` at real
    /// instant `t`, after its deadline had passed.
    pub(crate) fn revived<G>(&self, identity: &str, host: usize, g: &Guard<G>, deadline: LocalTime, t: u64) -> String {
        format!(
            "{identity} extended fence {} to {deadline:?} after its deadline {:?} had passed (local now {:?})",
            g.fence,
            g.deadline,
            self.local(host, t)
        )
    }

    // ---- windows ----

    pub(crate) fn partitioned(&self, host: usize) -> bool {
        self.active.iter().any(|&(_, h, w)| h == host && w == Window::Partition)
    }

    fn loss(&self, host: usize) -> (u8, u8) {
        self.active.iter().fold((0, 0), |(q, p), &(_, h, w)| match w {
            Window::Lossy { req_loss, rep_loss } if h == host => (q.max(req_loss), p.max(rep_loss)),
            _ => (q, p),
        })
    }

    fn extra(&self, host: usize) -> Duration {
        self.active.iter().fold(Duration::ZERO, |x, &(_, h, w)| match w {
            Window::SlowNet { extra } if h == host => x.max(extra),
            _ => x,
        })
    }

    /// Opens fault `i`'s window on `host` (`usize::MAX`: the database) for
    /// `length`.
    pub(crate) fn open(
        &mut self, t: u64, (i, fault): (usize, impl fmt::Debug), host: usize, length: Duration, window: Window,
    ) {
        if window == Window::PauseDb {
            self.paused += 1;
        }
        self.note(t, 31, i as u64, host as u64, || format!("fault {i} starts on host {host}: {fault:?}"));
        self.active.push((i, host, window));
        self.set_failing();
        self.push(t + nanos(length), Ev::FaultEnd(i));
    }

    /// Closes fault `i`'s window: the requests held by a pause that ended
    /// the last, to apply now in order.
    pub(crate) fn close(&mut self, t: u64, i: usize) -> Vec<(usize, C)> {
        self.note(t, 32, i as u64, 0, || format!("fault {i} ends"));
        let pause = self.active.iter().any(|&(j, _, w)| j == i && w == Window::PauseDb);
        self.active.retain(|&(j, _, _)| j != i);
        self.set_failing();
        if pause {
            self.paused -= 1;
            if self.paused == 0 {
                return std::mem::take(&mut self.held);
            }
        }
        Vec::new()
    }

    fn set_failing(&mut self) {
        let fatal = self.active.iter().filter_map(|&(_, _, w)| match w {
            Window::DbFailing { fatal } => Some(fatal),
            _ => None,
        });
        self.store.set_failing(events::failing_kind(fatal));
    }

    // ---- messages ----

    /// `node` on `host` sends call `id`, a request (`reply` false) or the
    /// database's reply: lost on the way, or delivered as `ev` after the
    /// link's delay.
    pub(crate) fn transmit(&mut self, t: u64, node: usize, host: usize, id: u64, reply: bool, ev: Ev<C, X>) {
        let (req_loss, rep_loss) = self.loss(host);
        if self.partitioned(host) || self.rng.percent(if reply { rep_loss } else { req_loss }) {
            if reply {
                self.timeline.lost_replies += 1;
                self.note(t, 4, node as u64, id, || format!("n{node} reply {id} lost"));
            } else {
                self.timeline.lost_requests += 1;
                self.note(t, 3, node as u64, id, || format!("n{node} request {id} lost"));
            }
            return;
        }
        let h = &self.hosts[host];
        let (lo, hi) = if reply { h.rep_delay } else { h.req_delay };
        let delay = self.rng.duration(lo, hi) + self.extra(host);
        self.push(t + nanos(delay), ev);
    }

    /// `node`'s request `id` reaches the database: lost to a partition,
    /// held by a pause, or to apply now.
    pub(crate) fn arrive(&mut self, t: u64, node: usize, host: usize, id: u64, call: C) -> Option<C> {
        if self.partitioned(host) {
            self.timeline.lost_requests += 1;
            self.note(t, 3, node as u64, id, || format!("n{node} request {id} lost (partition)"));
            None
        } else if self.paused > 0 {
            self.held.push((node, call));
            None
        } else {
            Some(call)
        }
    }

    /// The release feed (`feed`) tells `node` on `host` at real instant
    /// `t` that an election was released: the instants the wake reaches it
    /// (none: lost; two: doubled, the second up to `again_within` after
    /// the first). It travels as a reply does: a partition or a lossy link
    /// loses it (the feed's own loss besides), a slow link delays it. A
    /// partition that starts while it travels loses it too
    /// ([`Net::wake_cut_off`]).
    pub(crate) fn send_wake(
        &mut self, t: u64, (node, host): (usize, usize), feed: WakeFeed, again_within: Duration,
        stats: &mut ReleaseStats,
    ) -> Vec<u64> {
        stats.wakes_sent += 1;
        let (_, rep_loss) = self.loss(host);
        if self.partitioned(host) || self.rng.percent(feed.loss.max(rep_loss)) {
            stats.wakes_lost += 1;
            self.note(t, 41, node as u64, 0, || format!("n{node} wake lost"));
            return Vec::new();
        }
        let (lo, hi) = self.hosts[host].rep_delay;
        let first = t + nanos(self.rng.duration(lo, hi) + self.extra(host));
        let mut at = vec![first];
        if self.rng.percent(feed.dup) {
            stats.wakes_doubled += 1;
            at.push(first + nanos(self.rng.duration(Duration::ZERO, again_within)));
        }
        at
    }

    /// Whether a wake reaching `node` on `host` at `t` is lost to a
    /// partition; if not, it is counted delivered.
    pub(crate) fn wake_cut_off(&mut self, t: u64, node: usize, host: usize, stats: &mut ReleaseStats) -> bool {
        let cut = self.partitioned(host);
        if cut {
            stats.wakes_lost += 1;
            self.note(t, 41, node as u64, 1, || format!("n{node} wake lost (partition)"));
        } else {
            stats.wakes_delivered += 1;
            self.note(t, 42, node as u64, 0, || format!("n{node} woken: the lease was released"));
        }
        cut
    }

    /// Whether the reply `id` reaching `node` is lost to a partition.
    pub(crate) fn reply_cut_off(&mut self, t: u64, node: usize, host: usize, id: u64) -> bool {
        let cut = self.partitioned(host);
        if cut {
            self.timeline.lost_replies += 1;
            self.note(t, 4, node as u64, id, || format!("n{node} reply {id} lost (partition)"));
        }
        cut
    }
}
