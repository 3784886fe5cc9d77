//! The worker: one process of a fleet (the test binary run again, with
//! `LE_GROUP_WORKER` set, on its `group_worker` test). It runs one
//! [`Group`] with a fair share, joins the fleet's elections (`e0000`,
//! `e0001`, …), holds a guard on every term its group leads, as a program
//! would, and reports each term's validity interval to the test, on the
//! machine's one monotonic clock (see the suite's docs for why each bound
//! is sound).
//!
//! Three parts:
//! - [`Watched`], the store it gives its group: the built-in store of its
//!   path (through its own fault proxy), with a note of what goes through
//!   it: when each election's last claim or renewal was sent, each claim
//!   the database granted (reported on standard output before the group
//!   hears of it), and, at each release, whether the guard this worker
//!   holds on that term is already invalid;
//! - the sampler (this process's main thread), which every [`SWEEP`] asks
//!   each held guard whether it is valid and reads its deadline, takes a
//!   guard on each new term, and reports terms as they start and end;
//! - a thread reading orders on standard input: `quit` (shut the group
//!   down, report the last ends, check every election's count of terms,
//!   say `done`); at the end of its input (the test is gone) it exits.
//!
//! Out, one line per fact, `@g <what> …`, instants in nanoseconds of
//! CLOCK_MONOTONIC: `ready T IDENTITY`, `grant E FENCE T`, `start E FENCE
//! T HOW`, `end E FENCE T HOW SEEN`, `unseen E FENCE START END`, `abandoned
//! E FENCE` (a grant that will never start a term), `ext T N` (a sweep saw
//! N deadlines move: a renewal batch has been applied), `status T
//! leading=… live=… share=… claiming=… shed=… failed=… pending=… held=…`,
//! `violation TEXT`, `pending_at_end N`, `cpu …`, `done`.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use leaderelection::mysql::MySqlStore;
use leaderelection::postgres::PostgresStore;
use leaderelection::{BatchItem, Config, Election, Group, GroupConfig, LeaderGuard, Lease, Store, StoreError};

use super::{clock_ns, mono_ns, Clock, Path, CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID, TICK, TIMING};
use crate::support::forward_calls;

/// Set in a worker's environment; the rest of its orders are in the other
/// `LE_GROUP_*` variables.
pub const ENV: &str = "LE_GROUP_WORKER";

/// How often the sampler looks at every election.
pub const SWEEP: Duration = Duration::from_millis(10);

/// How often a worker says how its group stands.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// The negative control's worker looks at a term's `lost()` channel only
/// once in this many sweeps.
pub const LOST_EVERY: u64 = 20;

/// How a worker decides that its term is still valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `guard.is_valid()`, as the library asks.
    Valid,
    /// **Broken on purpose** (the negative control): a term counts as
    /// valid until the worker notices, looking at `guard.lost()` only
    /// every [`LOST_EVERY`] sweeps, that it has ended. It never looks at
    /// the deadline.
    LostLate,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Valid => "valid",
            Mode::LostLate => "lost_late",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "valid" => Mode::Valid,
            "lost_late" => Mode::LostLate,
            _ => panic!("unknown mode {s:?}"),
        }
    }
}

/// What one worker is to do.
#[derive(Clone, Debug)]
pub struct Spec {
    pub path: Path,
    /// The database through the worker's own fault proxy.
    pub url: String,
    pub table: String,
    /// The group's name (what the members count themselves under).
    pub group: String,
    pub id: String,
    pub elections: usize,
    pub mode: Mode,
}

impl Spec {
    /// The variables that pass this spec to a worker process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (ENV, "1".to_owned()),
            ("LE_GROUP_PATH", self.path.as_str().to_owned()),
            ("LE_GROUP_URL", self.url.clone()),
            ("LE_GROUP_TABLE", self.table.clone()),
            ("LE_GROUP_NAME", self.group.clone()),
            ("LE_GROUP_ID", self.id.clone()),
            ("LE_GROUP_ELECTIONS", self.elections.to_string()),
            ("LE_GROUP_MODE", self.mode.as_str().to_owned()),
        ]
    }

    fn from_env() -> Option<Spec> {
        std::env::var_os(ENV)?;
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("worker: {k} is not set"));
        Some(Spec {
            path: Path::parse(&var("LE_GROUP_PATH")),
            url: var("LE_GROUP_URL"),
            table: var("LE_GROUP_TABLE"),
            group: var("LE_GROUP_NAME"),
            id: var("LE_GROUP_ID"),
            elections: var("LE_GROUP_ELECTIONS").parse().expect("LE_GROUP_ELECTIONS"),
            mode: Mode::parse(&var("LE_GROUP_MODE")),
        })
    }
}

/// Election `i`'s name.
pub fn election_name(i: usize) -> String {
    format!("e{i:04}")
}

fn election_index(name: &str) -> Option<usize> {
    name.strip_prefix('e')?.parse().ok()
}

/// Writes `text` (whole lines) to standard output at once and flushes.
fn emit(text: &str) {
    if text.is_empty() {
        return;
    }
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The term this worker holds a guard on, for one election.
struct Held {
    guard: LeaderGuard,
    lost: Receiver<()>,
    fence: u64,
    /// The latest deadline seen while the guard was valid, and how many
    /// times it was seen to move since `renewals0` was read.
    deadline: Instant,
    moves: u64,
    /// The election's `renewals_ok` read together with the first
    /// `deadline` (one lock of its status); `None` when the term had ended
    /// by the time its status was read.
    renewals0: Option<u64>,
    /// A release of this term was checked at this instant, the guard
    /// already invalid.
    released_at: Option<u64>,
}

/// One election's part of what the sampler and the store share.
#[derive(Default)]
struct Slot {
    held: Option<Held>,
    /// A release checked while no guard was held on its term (one that
    /// started and ended between two sweeps): fence and instant.
    released_unheld: Option<(u64, u64)>,
}

/// What the store wrapper and the sampler share.
struct Shared {
    clock: Clock,
    slots: Vec<Mutex<Slot>>,
    /// Per election: when its latest claim or renewal was handed to the
    /// store (every deadline the library sets is reckoned from a send no
    /// later than this).
    sends: Vec<AtomicU64>,
    /// Claims the database granted this worker, not yet taken by the
    /// sampler: election, fence, the instant the store returned.
    grants: Mutex<Vec<(usize, u64, u64)>>,
}

/// The store a worker's group uses: the path's store, watched.
struct Watched {
    inner: Box<dyn Store>,
    shared: Arc<Shared>,
}

impl Watched {
    fn sent(&self, names: impl Iterator<Item = usize>) {
        let t = mono_ns();
        for i in names {
            if let Some(s) = self.shared.sends.get(i) {
                s.fetch_max(t, Ordering::SeqCst);
            }
        }
    }

    /// Reports the claims granted to `identity`, before the group hears of
    /// them.
    fn granted<'a>(&self, identity: &str, results: impl Iterator<Item = (&'a str, &'a Result<Lease, StoreError>)>) {
        let t = mono_ns();
        let mut lines = String::new();
        let mut got = Vec::new();
        for (name, r) in results {
            if let (Some(i), Ok(lease)) = (election_index(name), r) {
                if lease.held_by(identity) {
                    let _ = writeln!(lines, "@g grant {i} {} {t}", lease.fence);
                    got.push((i, lease.fence, t));
                }
            }
        }
        emit(&lines);
        self.shared.grants.lock().unwrap().extend(got);
    }

    /// At a release: the guard this worker holds on that term must already
    /// be invalid (the library ends a term before releasing its lease).
    fn releasing(&self, items: &[(&str, u64)]) {
        let mut lines = String::new();
        for &(name, fence) in items {
            let Some(i) = election_index(name) else { continue };
            let Some(slot) = self.shared.slots.get(i) else { continue };
            let mut slot = slot.lock().unwrap();
            match slot.held.as_mut() {
                Some(h) if h.fence == fence => {
                    let valid = h.guard.is_valid();
                    let t = mono_ns();
                    if valid {
                        let _ = writeln!(lines, "@g violation {name} fence {fence}: released while its guard is valid");
                    } else {
                        h.released_at.get_or_insert(t);
                    }
                }
                _ => slot.released_unheld = Some((fence, mono_ns())),
            }
        }
        emit(&lines);
    }
}

impl Store for Watched {
    forward_calls!(inner => inspect, inspect_many, heartbeat, leave_group);

    fn acquire(
        &self, name: &str, identity: &str, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.sent(election_index(name).into_iter());
        let r = self.inner.acquire(name, identity, ttl, payload, timeout);
        self.granted(identity, std::iter::once((name, &r)));
        r
    }

    fn renew(
        &self, name: &str, identity: &str, fence: u64, ttl: Duration, payload: &[u8], timeout: Duration,
    ) -> Result<Lease, StoreError> {
        self.sent(election_index(name).into_iter());
        self.inner.renew(name, identity, fence, ttl, payload, timeout)
    }

    fn release(&self, name: &str, identity: &str, fence: u64, timeout: Duration) -> Result<(), StoreError> {
        self.releasing(&[(name, fence)]);
        self.inner.release(name, identity, fence, timeout)
    }

    fn acquire_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.sent(items.iter().filter_map(|it| election_index(it.name)));
        let r = self.inner.acquire_many(identity, ttl, items, timeout);
        self.granted(identity, items.iter().map(|it| it.name).zip(r.iter()));
        r
    }

    fn renew_many(
        &self, identity: &str, ttl: Duration, items: &[BatchItem<'_>], timeout: Duration,
    ) -> Vec<Result<Lease, StoreError>> {
        self.sent(items.iter().filter_map(|it| election_index(it.name)));
        self.inner.renew_many(identity, ttl, items, timeout)
    }

    fn release_many(&self, identity: &str, items: &[BatchItem<'_>], timeout: Duration) -> Vec<Result<(), StoreError>> {
        let pairs: Vec<(&str, u64)> = items.iter().map(|it| (it.name, it.fence)).collect();
        self.releasing(&pairs);
        self.inner.release_many(identity, items, timeout)
    }
}

/// Runs the worker if this process is one; otherwise returns at once.
pub fn run_if_asked() {
    if let Some(spec) = Spec::from_env() {
        run(spec)
    }
}

fn run(spec: Spec) -> ! {
    let n = spec.elections;
    let shared = Arc::new(Shared {
        clock: Clock::new(),
        slots: (0..n).map(|_| Mutex::new(Slot::default())).collect(),
        sends: (0..n).map(|_| AtomicU64::new(0)).collect(),
        grants: Mutex::new(Vec::new()),
    });
    let inner: Box<dyn Store> = match spec.path {
        Path::Maria => Box::new(
            MySqlStore::builder(&spec.url)
                .table(spec.table.clone())
                .build()
                .unwrap_or_else(|e| panic!("worker store: {e}")),
        ),
        _ => Box::new(
            PostgresStore::builder(&spec.url)
                .table("public", spec.table.clone())
                .build()
                .unwrap_or_else(|e| panic!("worker store: {e}")),
        ),
    };
    let store = Watched { inner, shared: Arc::clone(&shared) };
    let config = GroupConfig::new(Config::new(store, spec.group.clone()).identity(spec.id.clone()).timing(TIMING))
        .fair_share(true);
    assert_eq!(config.get_tick(), TICK, "the suite's TICK is the group's");
    let group = Group::start(config).unwrap_or_else(|e| panic!("worker group: {e}"));
    let elections: Vec<Election> =
        (0..n).map(|i| group.join(&election_name(i)).unwrap_or_else(|e| panic!("join: {e}"))).collect();
    emit(&format!("@g ready {} {}\n", mono_ns(), group.identity()));

    let quit = Arc::new(AtomicBool::new(false));
    {
        let quit = Arc::clone(&quit);
        thread::spawn(move || {
            for line in io::stdin().lock().lines() {
                match line.as_deref().map(str::trim) {
                    Ok("quit") => quit.store(true, Ordering::SeqCst),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // The test is gone (or closed our input): so are we.
            std::process::exit(0);
        });
    }

    let mut s = Sampler::new(Arc::clone(&shared), group.identity().to_owned(), spec.mode, n);
    let (cpu0, wall0) = (clock_ns(CLOCK_THREAD_CPUTIME_ID), mono_ns());
    let mut next = Instant::now();
    let mut next_status = Instant::now();
    while !quit.load(Ordering::SeqCst) {
        s.sweep(&elections, false);
        if Instant::now() >= next_status {
            next_status += STATUS_EVERY;
            let st = group.status();
            let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            emit(&format!(
                "@g status {} leading={} live={} share={} claiming={} shed={} failed={} pending={} held={}\n",
                mono_ns(),
                st.leading,
                opt(st.live_members.map(|v| v.to_string())),
                opt(st.share.map(|v| v.to_string())),
                st.claiming,
                st.shed,
                st.calls_failed,
                s.pending_count(),
                s.held,
            ));
        }
        next += SWEEP;
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    let (cpu, wall) = (clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0, mono_ns() - wall0);
    // Every term ends (each guard invalid first), every lease is released
    // (each release checked against the guard held on it), the member
    // leaves; then the last sweep reports the ends.
    let shut = group.shutdown();
    s.sweep(&elections, true);
    s.reconcile(&elections);
    emit(&format!(
        "@g cpu sampler={cpu} process={} wall={wall} sweeps={} shutdown={}\n",
        clock_ns(CLOCK_PROCESS_CPUTIME_ID),
        s.sweeps,
        match shut {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string().replace('\n', " "),
        }
    ));
    emit("@g done\n");
    std::process::exit(0)
}

/// The sampler's own state per election.
#[derive(Default)]
struct Track {
    /// Terms accounted for: seen valid, or placed from a grant.
    counted: u64,
    /// Grants not yet matched to a term: fence, instant.
    pending: VecDeque<(u64, u64)>,
    /// Before the latest look that found no valid term.
    none_at: u64,
}

struct Sampler {
    shared: Arc<Shared>,
    /// The group's identity (the holder its leases show).
    identity: String,
    mode: Mode,
    tracks: Vec<Track>,
    sweeps: u64,
    held: usize,
    lease_less_margin: u64,
}

impl Sampler {
    fn new(shared: Arc<Shared>, identity: String, mode: Mode, n: usize) -> Sampler {
        let lmm = (TIMING.lease_duration - TIMING.safety_margin).as_nanos() as u64;
        Sampler {
            shared,
            identity,
            mode,
            tracks: (0..n).map(|_| Track::default()).collect(),
            sweeps: 0,
            held: 0,
            lease_less_margin: lmm,
        }
    }

    /// Moves the grants the store reported into the elections' tracks.
    fn take_grants(&mut self) {
        let grants = std::mem::take(&mut *self.shared.grants.lock().unwrap());
        for (i, fence, t) in grants {
            self.tracks[i].pending.push_back((fence, t));
        }
    }

    fn pending_count(&self) -> usize {
        self.tracks.iter().map(|t| t.pending.len()).sum()
    }

    /// Looks at every election once. `last`: the group has shut down, and
    /// every term must be seen ended now (the negative control's worker
    /// looks at every `lost()` channel this once).
    fn sweep(&mut self, elections: &[Election], last: bool) {
        self.sweeps += 1;
        let began = mono_ns();
        self.take_grants();
        let mut out = String::new();
        let mut moved = 0u64;
        let mut held = 0;
        let shared = Arc::clone(&self.shared);
        for (i, e) in elections.iter().enumerate() {
            let mut slot = shared.slots[i].lock().unwrap();
            if slot.held.is_some() {
                moved += self.look_at_held(i, e, &mut slot, last, &mut out);
            }
            if slot.held.is_none() {
                self.look_for_term(i, e, &mut slot, began, &mut out);
            }
            held += usize::from(slot.held.is_some());
        }
        self.held = held;
        if moved > 0 {
            let _ = writeln!(out, "@g ext {} {moved}", mono_ns());
        }
        emit(&out);
    }

    /// One held term: still valid (its deadline noted), or ended (its end
    /// reported and its guard dropped). How many deadlines moved.
    fn look_at_held(&mut self, i: usize, e: &Election, slot: &mut Slot, last: bool, out: &mut String) -> u64 {
        let h = slot.held.as_mut().unwrap();
        // A claim of a lease this worker holds already (the same term, a
        // later expiry) starts nothing.
        self.tracks[i].pending.retain(|(f, _)| *f != h.fence);
        let mut moved = 0;
        let ended = match self.mode {
            Mode::Valid => {
                if h.guard.is_valid() {
                    // Read after the check: the deadline in force then, or
                    // a later one.
                    let d = h.guard.valid_until();
                    if d > h.deadline {
                        h.deadline = d;
                        h.moves += 1;
                        moved = 1;
                        // Every deadline is reckoned from a send the store
                        // saw (read after the deadline, so that send is in).
                        let w = self.shared.sends[i].load(Ordering::SeqCst);
                        let dn = self.shared.clock.upper(d);
                        if dn > w + self.lease_less_margin + 1_000 {
                            let _ = writeln!(
                                out,
                                "@g violation {} fence {}: deadline {dn} is {:.3} ms past its latest send {w} plus \
                                 the lease less the margin",
                                e.name(),
                                h.fence,
                                (dn - w - self.lease_less_margin) as f64 / 1e6
                            );
                        }
                    }
                    None
                } else {
                    let seen = mono_ns();
                    let (end, how) = self.end_bound(i, e, h, seen);
                    Some((end, how, seen))
                }
            }
            Mode::LostLate => {
                let d = h.guard.valid_until();
                if d > h.deadline {
                    h.deadline = d;
                    moved = 1;
                }
                let look = last || (i as u64 + self.sweeps).is_multiple_of(LOST_EVERY);
                if look && matches!(h.lost.try_recv(), Err(TryRecvError::Disconnected)) {
                    let seen = mono_ns();
                    Some((seen, "noticed", seen))
                } else {
                    None
                }
            }
        };
        if let Some((end, how, seen)) = ended {
            let h = slot.held.take().unwrap();
            let _ = writeln!(out, "@g end {i} {} {end} {how} {seen}", h.fence);
            drop(h); // the ended term's guard: the group may campaign again
        }
        moved
    }

    /// The end of held term `h` of election `i`, first seen invalid at
    /// `seen`: the least of the upper bounds that apply (see the suite's
    /// docs), and which it was.
    fn end_bound(&self, i: usize, e: &Election, h: &Held, seen: u64) -> (u64, &'static str) {
        let st = e.status();
        let mut best = (seen, "seen");
        // Every renewal the group applied since `renewals0` moved the
        // deadline once, under the lock that also counts it: when the
        // count grew by exactly the moves seen, the deadline last seen is
        // the last the term had.
        let all_seen = h.renewals0.is_some_and(|r0| st.renewals_ok.checked_sub(r0) == Some(h.moves));
        let by_deadline = if all_seen {
            (self.shared.clock.upper(h.deadline), "deadline")
        } else {
            (self.shared.sends[i].load(Ordering::SeqCst) + self.lease_less_margin, "rule")
        };
        if by_deadline.0 < best.0 {
            best = by_deadline;
        }
        if let Some(t) = h.released_at.filter(|t| *t < best.0) {
            best = (t, "release");
        }
        best
    }

    /// An election on which this worker holds no guard: a new term (a
    /// guard is taken and held), or terms that started and ended between
    /// two sweeps (placed from their grants).
    /// `before`: read before this sweep began (so before this look).
    fn look_for_term(&mut self, i: usize, e: &Election, slot: &mut Slot, before: u64, out: &mut String) {
        match e.guard() {
            Some(g) => {
                let st = e.status();
                let fence = g.fence();
                if !self.tracks[i].pending.iter().any(|(f, _)| *f == fence) {
                    // Its grant was reported after this sweep took the
                    // grants (the store reports it before the group hears
                    // of it, so it is there now).
                    self.take_grants();
                }
                let track = &mut self.tracks[i];
                let grant = track.pending.iter().position(|(f, _)| *f == fence).and_then(|k| track.pending.remove(k));
                // Terms before this one that were never seen valid: they
                // ended before this one started, so before `before`.
                let unseen = st.terms_started.saturating_sub(track.counted + 1);
                self.place_unseen(i, e.name(), unseen, before, slot, out);
                let track = &mut self.tracks[i];
                track.counted += 1;
                let (start, how, renewals0, deadline) = match (st.fence, st.term_started, st.valid_until) {
                    (Some(f), Some(started), Some(d)) if f == fence => {
                        (self.shared.clock.lower(started), "started", Some(st.renewals_ok), d)
                    }
                    // It ended between the two reads: it started after the
                    // last look that found no term, and after its grant.
                    _ => (grant.map_or(track.none_at, |(_, t)| t.max(track.none_at)), "bound", None, g.valid_until()),
                };
                match grant {
                    None => {
                        let _ = writeln!(
                            out,
                            "@g violation {} fence {fence}: a term without a claim the database granted through \
                             this worker's store",
                            e.name()
                        );
                    }
                    Some((_, t)) if start + 1_000 < t => {
                        let _ = writeln!(
                            out,
                            "@g violation {} fence {fence}: the term started {:.3} ms before the store returned its \
                             grant",
                            e.name(),
                            (t - start) as f64 / 1e6
                        );
                    }
                    Some(_) => {}
                }
                let _ = writeln!(out, "@g start {i} {fence} {start} {how}");
                let lost = g.lost();
                slot.held = Some(Held { guard: g, lost, fence, deadline, moves: 0, renewals0, released_at: None });
            }
            None => {
                self.tracks[i].none_at = before;
                if !self.tracks[i].pending.is_empty() {
                    let st = e.status();
                    let after = mono_ns();
                    let mut unseen = st.terms_started.saturating_sub(self.tracks[i].counted);
                    if st.is_leader {
                        // One is live now: the next sweep takes it.
                        unseen = unseen.saturating_sub(1);
                    }
                    self.place_unseen(i, e.name(), unseen, after, slot, out);
                    // A grant whose answer the group never took (it came
                    // after the call was given up): once the election has
                    // seen a later answer (one call at a time per
                    // election, answers in order) without a new term, no
                    // term will ever come of it. A later answer is one
                    // read after the grant that shows another lease than
                    // the granted one: the grant's own answer is published
                    // a moment before its term starts.
                    let track = &mut self.tracks[i];
                    if !st.is_leader && st.terms_started == track.counted {
                        if let Some(l) = &st.leader {
                            let seen_at = self.shared.clock.lower(l.seen_at);
                            let mine = l.identity == self.identity;
                            track.pending.retain(|&(fence, granted)| {
                                let dead = seen_at > granted && !(mine && l.fence == fence);
                                if dead {
                                    let _ = writeln!(out, "@g abandoned {i} {fence}");
                                }
                                !dead
                            });
                        }
                    }
                }
            }
        }
    }

    /// Reports `n` terms of election `i` that started and ended between
    /// two sweeps, each from its grant to `by` (or its release, if
    /// earlier).
    fn place_unseen(&mut self, i: usize, name: &str, n: u64, by: u64, slot: &Slot, out: &mut String) {
        for _ in 0..n {
            let track = &mut self.tracks[i];
            track.counted += 1;
            match track.pending.pop_front() {
                Some((fence, granted)) => {
                    // Seen over by `by`; released (the library ends a term
                    // before it releases the lease); and never valid past
                    // the election's latest send plus the lease less the
                    // margin (the rule every deadline seen is checked
                    // against).
                    let mut end = by.min(self.shared.sends[i].load(Ordering::SeqCst) + self.lease_less_margin);
                    if let Some((f, t)) = slot.released_unheld {
                        if f == fence {
                            end = end.min(t);
                        }
                    }
                    let _ = writeln!(out, "@g unseen {i} {fence} {granted} {end}");
                }
                None => {
                    let _ = writeln!(
                        out,
                        "@g violation {name}: a term that was never seen valid and has no grant to place it by"
                    );
                }
            }
        }
    }

    /// After the shutdown: every election's count of terms is the count
    /// reported.
    fn reconcile(&mut self, elections: &[Election]) {
        let mut out = String::new();
        let mut pending = 0;
        for (i, e) in elections.iter().enumerate() {
            let st = e.status();
            let t = &self.tracks[i];
            if st.terms_started != t.counted {
                let _ = writeln!(
                    out,
                    "@g violation {}: the group started {} terms, the worker reported {}",
                    e.name(),
                    st.terms_started,
                    t.counted
                );
            }
            pending += t.pending.len();
        }
        let _ = writeln!(out, "@g pending_at_end {pending}");
        emit(&out);
    }
}
