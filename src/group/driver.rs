//! A group's threads: the driver that runs the [`GroupMachine`] and each
//! election's hand-off, the one watchdog for every term, the store-call
//! workers, and the callback thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

use super::core::{Batch, BatchId, BatchOp, ElectionKey, GroupCall, GroupMachine, GroupMachineConfig, JoinRefused};
use super::{
    GroupConfig, GroupNewLeaderFn, GroupStartedFn, GroupStatus, GroupStoppedFn, JoinError, Joined, LeaveReply,
};
use crate::batch::Members;
use crate::elector::{not_started, StartError};
use crate::error::{ElectionError, OpKind};
use crate::guard::{Command as TermCommand, TermShared, TermStore};
use crate::handoff::{watchdog_fired, Event, Handoff, Outside, Shared, State};
use crate::identity::{default_identity, with_instance, IdentityError};
use crate::machine::{Call, LocalTime, Outcome, Output};
use crate::status::Counters;
use crate::store::{ErrorKind, Released, Store, StoreError};
use crate::sync::{Condvar, Mutex};
use crate::workers::{catching, Workers};

/// What the group's handles ask of its driver.
pub(crate) enum Command {
    Join { name: String, payload: Option<Vec<u8>>, reply: Sender<Joined> },
    Leave { key: ElectionKey, release: bool, reply: LeaveReply },
    Shutdown { release: bool },
}

/// What the group's handles share with its driver.
pub(crate) struct GroupShared {
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) cmd_tx: Sender<Command>,
    figures: Mutex<Figures>,
}

#[derive(Default)]
struct Figures {
    elections: usize,
    leading: usize,
    claiming: usize,
    live_members: Option<u32>,
    share: Option<usize>,
    shed: u64,
    calls: u64,
    calls_failed: u64,
    last_call_rtt: Option<Duration>,
    slowest_call: Option<Duration>,
    last_error: Option<StoreError>,
    call_threads: usize,
    stopped: bool,
}

impl GroupShared {
    pub(crate) fn status(&self) -> GroupStatus {
        let f = self.figures.lock();
        GroupStatus {
            name: self.name.clone(),
            identity: self.identity.clone(),
            elections: f.elections,
            leading: f.leading,
            claiming: f.claiming,
            live_members: f.live_members,
            share: f.share,
            shed: f.shed,
            calls: f.calls,
            calls_failed: f.calls_failed,
            last_call_rtt: f.last_call_rtt,
            slowest_call: f.slowest_call,
            last_error: f.last_error.clone(),
            call_threads: f.call_threads,
            stopped: f.stopped,
        }
    }
}

/// The group's threads, joined at shutdown (from any thread, see
/// [`crate::threads`]).
pub(crate) type Threads = crate::threads::Threads;

pub(crate) fn stop(threads: &mut Threads, shared: &GroupShared, release: bool) -> Result<(), ElectionError> {
    threads.join(|| {
        let _ = shared.cmd_tx.send(Command::Shutdown { release });
    })
}

fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>, StartError> {
    thread::Builder::new().name(name.to_owned()).spawn(f).map_err(StartError::Spawn)
}

/// Spawns the group's threads for `config` (already validated).
pub(crate) fn start(config: GroupConfig) -> Result<(Arc<GroupShared>, Threads), StartError> {
    let template = &config.template;
    let mut random = [0u8; 24];
    getrandom::fill(&mut random).map_err(|e| StartError::Identity(IdentityError::from_getrandom(e)))?;
    let word = |i: usize| u64::from_le_bytes(random[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let identity = with_instance(template.identity.as_deref().unwrap_or(&default_identity()), word(0));
    let tick = config.get_tick();
    let mut mcfg = GroupMachineConfig::new(identity.clone(), template.name.clone(), template.timing, word(1));
    mcfg.release_on_shutdown = template.release_on_shutdown;
    mcfg.fair_share = config.fair_share;
    mcfg.tick = tick;
    // A grid of its own, so the processes of a group do not all send on
    // the same instants.
    mcfg.phase = Duration::from_nanos(word(2) % u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX).max(1));

    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let shared = Arc::new(GroupShared {
        name: template.name.clone(),
        identity: identity.clone(),
        cmd_tx,
        figures: Mutex::new(Figures::default()),
    });
    let mut threads = Threads::default();
    let (dog_tx, dog_rx) = crossbeam_channel::unbounded();
    threads.others.push(spawn("leaderelection-group-watchdog", move || watchdog(dog_rx))?);
    let has_callbacks =
        config.on_started_leading.is_some() || config.on_stopped_leading.is_some() || config.on_new_leader.is_some();
    let events = if has_callbacks {
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
        let (started, stopped, new_leader) =
            (config.on_started_leading.clone(), config.on_stopped_leading.clone(), config.on_new_leader.clone());
        threads
            .others
            .push(spawn("leaderelection-group-callbacks", move || callbacks(ev_rx, started, stopped, new_leader))?);
        Some(ev_tx)
    } else {
        None
    };
    let origin = Instant::now();
    let (term_tx, term_rx) = crossbeam_channel::unbounded();
    let common = Arc::new(Common {
        origin,
        store: Arc::clone(&template.store),
        identity: identity.into(),
        group: template.name.as_str().into(),
        timeout: template.timing.operation_timeout,
        dog_tx,
        events,
        started_callback: config.on_started_leading.is_some(),
        lease_duration: template.timing.lease_duration,
        term_tx,
    });
    let driver = Driver {
        core: GroupMachine::new(mcfg),
        elections: HashMap::new(),
        names: HashMap::new(),
        leavers: HashMap::new(),
        held: HashSet::new(),
        payload: template.payload.as_slice().into(),
        workers: Workers::new(
            "leaderelection-group-call",
            super::MAX_GROUP_CALL_THREADS,
            template.timing.operation_timeout,
            run_job,
            expired_job,
        ),
        common,
        shared: Arc::clone(&shared),
        release_result: Ok(()),
        not_started: std::collections::VecDeque::new(),
        releases: template.store.releases().unwrap_or_else(crossbeam_channel::never),
        #[cfg(feature = "metrics")]
        metrics: crate::metrics::GroupMetrics::new(&template.name),
    };
    threads.driver = Some(spawn("leaderelection-group", move || driver.run(cmd_rx, term_rx))?);
    Ok((shared, threads))
}

/// What every election's hand-off reaches: the group's clock, store,
/// watchdog and callback thread.
struct Common {
    origin: Instant,
    store: Arc<dyn Store>,
    identity: Arc<str>,
    group: Arc<str>,
    timeout: Duration,
    dog_tx: Sender<(Arc<Shared>, Arc<TermShared>)>,
    events: Option<Sender<(Arc<str>, Event)>>,
    started_callback: bool,
    lease_duration: Duration,
    term_tx: Sender<TermCommand>,
}

/// One election's side of the threads, for its [`Handoff`].
struct Reach {
    common: Arc<Common>,
    name: Arc<str>,
    shared: Arc<Shared>,
}

impl Outside for Reach {
    fn now(&self) -> LocalTime {
        LocalTime::from_duration(self.common.origin.elapsed())
    }

    fn start_call(&mut self, _call: Call) -> Result<(), Outcome> {
        // The group takes every call out of the machine before the
        // hand-off sees its outputs.
        Err(Outcome::Lease(Err(StoreError::fatal("a group election's call reached its hand-off"))))
    }

    fn term_store(&self) -> Option<Arc<TermStore>> {
        Some(Arc::new(TermStore {
            store: Arc::clone(&self.common.store),
            name: Arc::clone(&self.name),
            identity: Arc::clone(&self.common.identity),
            timeout: self.common.timeout,
        }))
    }

    fn watch(&mut self, term: &Arc<TermShared>) {
        let _ = self.common.dog_tx.send((Arc::clone(&self.shared), Arc::clone(term)));
    }

    fn event(&mut self, ev: Event) {
        if let Some(tx) = &self.common.events {
            let _ = tx.send((Arc::clone(&self.name), ev));
        }
    }
}

struct Job {
    call: GroupCall,
    store: Arc<dyn Store>,
    identity: Arc<str>,
    group: Arc<str>,
    timeout: Duration,
}

enum Answer {
    /// A batch's outcomes, and the answer of the heartbeat that went with
    /// it (its id and result), if one did.
    Batch(Vec<Outcome>, Option<(BatchId, Result<Members, StoreError>)>),
    Members(Result<Members, StoreError>),
}

/// A batch's answers as [`Answer::Batch`] carries them.
fn batch_answer(b: &Batch, (out, members): (Vec<Outcome>, Option<Result<Members, StoreError>>)) -> Answer {
    Answer::Batch(out, b.heartbeat.map(|h| h.id).zip(members))
}

struct Reply {
    id: BatchId,
    op: Option<BatchOp>,
    /// What the call was, in a word (logs, metric labels).
    label: &'static str,
    items: usize,
    took: Duration,
    answer: Answer,
}

fn run_job(job: Job) -> Reply {
    let sent = Instant::now();
    let (id, op, items, label) = describe(&job.call);
    let answer = match &job.call {
        GroupCall::Batch(b) => batch_answer(
            b,
            catching(
                || b.run(&*job.store, &job.group, &job.identity, job.timeout),
                || b.failed(&StoreError::fatal("store call panicked")),
            ),
        ),
        GroupCall::Heartbeat { ttl, leading, .. } => Answer::Members(catching(
            || job.store.heartbeat(&job.group, &job.identity, *leading, *ttl, job.timeout),
            || Err(StoreError::fatal("store call panicked")),
        )),
        GroupCall::Leave { .. } => Answer::Members(catching(
            || job.store.leave_group(&job.group, &job.identity, job.timeout).map(|()| Members::new(0, job_now())),
            || Err(StoreError::fatal("store call panicked")),
        )),
    };
    Reply { id, op, label, items, took: sent.elapsed(), answer }
}

/// A call's id, its batch's operation and size, and a word for it (logs,
/// metric labels).
fn describe(call: &GroupCall) -> (BatchId, Option<BatchOp>, usize, &'static str) {
    match call {
        GroupCall::Batch(b) => (b.id, Some(b.op), b.entries.len(), op_label(b.op)),
        GroupCall::Heartbeat { id, .. } => (*id, None, 0, "heartbeat"),
        GroupCall::Leave { id } => (*id, None, 0, "leave"),
    }
}

/// The answer of a call that waited out the operation timeout for a
/// worker: not sent; its machines have abandoned it already.
fn expired_job(job: Job) -> Reply {
    let e = StoreError::retryable(format!(
        "no store-call worker came free within {} (not sent)",
        crate::error::Human(job.timeout)
    ));
    let (id, op, items, label) = describe(&job.call);
    let answer = match &job.call {
        GroupCall::Batch(b) => batch_answer(b, b.failed(&e)),
        _ => Answer::Members(Err(e)),
    };
    Reply { id, op, label, items, took: Duration::ZERO, answer }
}

/// A leave's answer carries no reading; the group only needs the result.
fn job_now() -> crate::DbTime {
    crate::DbTime::from_unix_micros(0)
}

/// The most released names a group takes from the store's feed at once
/// (their claims go in one batch).
const RELEASES_AT_ONCE: usize = 4096;

struct Driver {
    core: GroupMachine,
    elections: HashMap<ElectionKey, Handoff<Reach>>,
    names: HashMap<Arc<str>, ElectionKey>,
    leavers: HashMap<ElectionKey, Vec<LeaveReply>>,
    /// Elections whose guards of an ended term hold the next one back.
    held: HashSet<ElectionKey>,
    payload: Arc<[u8]>,
    workers: Workers<Job, Reply>,
    common: Arc<Common>,
    shared: Arc<GroupShared>,
    /// The first release that failed at shutdown.
    release_result: Result<(), ElectionError>,
    /// Calls no worker could take, to be failed as answers are: one at a
    /// time, after the events before them have been carried out.
    not_started: std::collections::VecDeque<(GroupCall, StoreError)>,
    /// The store's feed of released elections ([`Store::releases`]), or
    /// a channel that never delivers.
    releases: Receiver<Released>,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::GroupMetrics,
}

impl Driver {
    fn now(&self) -> LocalTime {
        LocalTime::from_duration(self.common.origin.elapsed())
    }

    fn run(mut self, cmd_rx: Receiver<Command>, term_rx: Receiver<TermCommand>) -> Result<(), ElectionError> {
        let mut commands_open = true;
        loop {
            self.pump();
            if self.core.is_stopped() {
                break;
            }
            let origin = self.common.origin;
            let wake = self.core.poll_timeout().and_then(|t| origin.checked_add(t.as_duration()));
            let wake = [wake, self.check_holds()].into_iter().flatten().min();
            let timeout = wake.map_or(crossbeam_channel::never(), crossbeam_channel::at);
            let commands = if commands_open { cmd_rx.clone() } else { crossbeam_channel::never() };
            select! {
                recv(self.workers.replies) -> msg => {
                    if let Ok(reply) = msg {
                        self.reply(reply);
                    }
                }
                recv(term_rx) -> cmd => {
                    if let Ok(cmd) = cmd {
                        self.term_command(cmd);
                    }
                }
                recv(commands) -> cmd => match cmd {
                    Ok(cmd) => self.command(cmd),
                    Err(_) => {
                        // Every handle is gone: shut down.
                        commands_open = false;
                        let now = self.now();
                        self.core.shutdown(now, true);
                    }
                },
                recv(self.releases) -> released => match released {
                    Ok(r) => self.released(r),
                    // The feed ended: learn of releases by polling alone.
                    Err(_) => self.releases = crossbeam_channel::never(),
                },
                recv(timeout) -> _ => {
                    let now = self.now();
                    self.core.handle_timeout(now);
                }
            }
        }
        self.finish()
    }

    /// Wakes the elections the store saw released: `first` and every name
    /// already waiting behind it, so their claims go in one batch.
    fn released(&mut self, first: Released) {
        let waiting: Vec<Released> = self.releases.try_iter().take(RELEASES_AT_ONCE).collect();
        let woken: Vec<(ElectionKey, Option<u64>)> = std::iter::once(first)
            .chain(waiting)
            .filter_map(|r| self.names.get(r.name.as_str()).map(|k| (*k, r.fence)))
            .collect();
        if !woken.is_empty() {
            let now = self.now();
            self.core.handle_wakes(now, &woken);
        }
    }

    /// Carries out what the core produced: each election's outputs through
    /// its hand-off, their state published, the calls started.
    fn pump(&mut self) {
        loop {
            let now = self.now();
            while let Some((key, out)) = self.core.poll_event() {
                let stopped = matches!(out, Output::Stopped);
                if let Some(handoff) = self.elections.get_mut(&key) {
                    self.core.with_machine(now, key, |m| {
                        handoff.publish(m);
                        handoff.handle(m, out);
                    });
                    if handoff.held_back.is_some() {
                        self.held.insert(key);
                    }
                }
                if stopped {
                    self.election_stopped(key);
                }
            }
            for key in self.core.take_touched() {
                if let (Some(handoff), Some(m)) = (self.elections.get_mut(&key), self.core.machine(key)) {
                    handoff.settled(m);
                }
            }
            let mut started = false;
            while let Some(call) = self.core.poll_call() {
                started = true;
                self.start(call);
            }
            // A call that could not start fails as an answer would: its
            // events are carried out at the top of the loop before any call
            // they lead to starts.
            if let Some((call, e)) = self.not_started.pop_front() {
                started = true;
                self.fail(call, &e);
            }
            if !started {
                break;
            }
        }
        self.publish();
    }

    /// Election `key`'s machine stopped: its hand-off finishes, whoever
    /// waits for its leave hears how the release went, and it is gone.
    fn election_stopped(&mut self, key: ElectionKey) {
        let Some(handoff) = self.elections.remove(&key) else { return };
        let name = Arc::clone(&handoff.outside.name);
        let result = handoff.finish();
        if let Err(e) = &result {
            if self.release_result.is_ok() {
                self.release_result = Err(e.clone());
            }
        }
        for reply in self.leavers.remove(&key).into_iter().flatten() {
            let _ = reply.send(result.clone());
        }
        self.names.remove(&name);
        self.held.remove(&key);
        self.core.forget(key);
    }

    /// Starts `call` on a worker; a call that cannot start is queued to
    /// fail (see [`Driver::pump`]).
    fn start(&mut self, call: GroupCall) {
        let job = Job {
            call,
            store: Arc::clone(&self.common.store),
            identity: Arc::clone(&self.common.identity),
            group: Arc::clone(&self.common.group),
            timeout: self.common.timeout,
        };
        if let Err((job, why)) = self.workers.start(job) {
            let e = match not_started(why) {
                ElectionError::Store { error, .. } => error,
                other => StoreError::retryable(other.to_string()),
            };
            self.not_started.push_back((job.call, e));
        }
    }

    /// `call` could not start: it fails with `e`, as its answer would.
    fn fail(&mut self, call: GroupCall, e: &StoreError) {
        let now = self.now();
        match call {
            GroupCall::Batch(b) => {
                let (failed, members) = b.failed(e);
                self.core.handle_batch_reply(now, b.id, failed);
                if let (Some(h), Some(m)) = (b.heartbeat, members) {
                    self.core.handle_members_reply(now, h.id, m);
                }
            }
            call => self.core.handle_members_reply(now, call.id(), Err(e.clone())),
        }
    }

    fn reply(&mut self, reply: Reply) {
        let now = self.now();
        let failure = match &reply.answer {
            Answer::Batch(out, members) => {
                whole_failure(out).or_else(|| members.as_ref().and_then(|(_, r)| r.as_ref().err().cloned()))
            }
            Answer::Members(r) => r.as_ref().err().cloned(),
        };
        {
            let mut f = self.shared.figures.lock();
            f.calls += 1;
            f.last_call_rtt = Some(reply.took);
            f.slowest_call = f.slowest_call.max(Some(reply.took));
            match &failure {
                Some(e) => {
                    f.calls_failed += 1;
                    f.last_error = Some(e.clone());
                }
                None => f.last_error = None,
            }
        }
        #[cfg(feature = "metrics")]
        self.metrics.call(reply.label, failure.is_none(), reply.took);
        if let Some(e) = &failure {
            let what = match reply.op {
                Some(_) => format!("{} batch of {} elections", reply.label, reply.items),
                None => format!("members {}", reply.label),
            };
            log::warn!("leaderelection: group {:?}: {:?}: {what} failed: {e}", self.shared.name, self.shared.identity);
        }
        match reply.answer {
            Answer::Batch(out, members) => {
                if let Some(op) = reply.op.map(op_kind) {
                    for key in self.core.batch_keys(reply.id) {
                        if let Some(h) = self.elections.get(&key) {
                            h.call_returned(op, reply.took);
                        }
                    }
                }
                self.core.handle_batch_reply(now, reply.id, out);
                if let Some((id, r)) = members {
                    self.core.handle_members_reply(now, id, r);
                }
            }
            Answer::Members(r) => self.core.handle_members_reply(now, reply.id, r),
        }
    }

    fn term_command(&mut self, cmd: TermCommand) {
        let Some(term) = cmd.term() else { return };
        let key = ElectionKey::of_term(term);
        let now = self.now();
        let Some(handoff) = self.elections.get_mut(&key) else { return };
        self.core.with_machine(now, key, |m| handoff.command(m, now, cmd));
        if handoff.held_back.is_none() {
            self.held.remove(&key);
        }
    }

    fn command(&mut self, cmd: Command) {
        let now = self.now();
        match cmd {
            Command::Join { name, payload, reply } => {
                let _ = reply.send(self.join(now, name, payload));
            }
            Command::Leave { key, release, reply } => {
                if !self.elections.contains_key(&key) {
                    let _ = reply.send(Ok(()));
                    return;
                }
                self.leavers.entry(key).or_default().push(reply);
                self.core.leave(now, key, release);
            }
            Command::Shutdown { release } => self.core.shutdown(now, release),
        }
    }

    fn join(&mut self, now: LocalTime, name: String, payload: Option<Vec<u8>>) -> Joined {
        let name: Arc<str> = name.into();
        if self.names.contains_key(&name) {
            return Err(JoinError::Duplicate(name.to_string()));
        }
        let payload = payload.map_or_else(|| Arc::clone(&self.payload), Arc::from);
        let key = self.core.join(now, Arc::clone(&name), payload).map_err(|r| match r {
            JoinRefused::Stopping => JoinError::Stopped,
            JoinRefused::OutOfKeys => JoinError::OutOfKeys,
        })?;
        let shared = Arc::new(Shared {
            origin: self.common.origin,
            name: name.to_string(),
            identity: self.shared.identity.clone(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            #[cfg(loom)]
            mutant: None,
        });
        let reach = Reach { common: Arc::clone(&self.common), name: Arc::clone(&name), shared: Arc::clone(&shared) };
        let handoff = Handoff::new(
            reach,
            Arc::clone(&shared),
            Counters::unexported(),
            self.common.term_tx.clone(),
            self.common.started_callback,
            self.common.lease_duration,
        )
        .quiet_failures();
        self.elections.insert(key, handoff);
        self.names.insert(name, key);
        Ok((key, shared))
    }

    /// Warns about elections whose old guards hold the next term back;
    /// returns when to look again.
    fn check_holds(&mut self) -> Option<Instant> {
        let mut next = None;
        for key in &self.held {
            if let Some(h) = self.elections.get_mut(key) {
                next = [next, h.check_hold()].into_iter().flatten().min();
            }
        }
        next
    }

    fn publish(&self) {
        let mut f = self.shared.figures.lock();
        f.elections = self.core.len();
        f.leading = self.core.leading();
        f.claiming = self.core.claiming();
        f.live_members = self.core.live_members();
        f.share = self.core.share();
        f.shed = self.core.shed_count();
        f.call_threads = self.workers.alive();
        if let Some(e) = self.core.members_error() {
            f.last_error = Some(e.clone());
        }
        #[cfg(feature = "metrics")]
        self.metrics.state(f.elections, f.leading, f.live_members, f.share, f.shed);
    }

    fn finish(self) -> Result<(), ElectionError> {
        self.shared.figures.lock().stopped = true;
        self.release_result
    }
}

/// The error every item of a batch failed with, if they all failed alike
/// (a statement, a connection, a timeout): the batch failed as a whole.
fn whole_failure(out: &[Outcome]) -> Option<StoreError> {
    let first = match out.first()? {
        Outcome::Lease(Err(e)) | Outcome::Released(Err(e)) => e,
        _ => return None,
    };
    if matches!(first.kind(), ErrorKind::LeaseLost | ErrorKind::NoLease) {
        return None;
    }
    let same = out.iter().all(|o| match o {
        Outcome::Lease(Err(e)) | Outcome::Released(Err(e)) => e.message() == first.message(),
        _ => false,
    });
    same.then(|| first.clone())
}

/// A batch's operation in a word (logs, metric labels).
fn op_label(op: BatchOp) -> &'static str {
    match op {
        BatchOp::Acquire => "acquire",
        BatchOp::Renew => "renew",
        BatchOp::Release => "release",
        BatchOp::Inspect => "inspect",
    }
}

fn op_kind(op: BatchOp) -> OpKind {
    match op {
        BatchOp::Acquire => OpKind::Acquire,
        BatchOp::Renew => OpKind::Renew,
        BatchOp::Release => OpKind::Release,
        BatchOp::Inspect => OpKind::Inspect,
    }
}

/// The group's watchdog: ends each term at its deadline, whatever the
/// driver is doing, for every election. Terms wait in a heap by the
/// deadline they had when queued; one whose deadline moved (a renewal) is
/// queued again for the new one.
fn watchdog(terms: Receiver<(Arc<Shared>, Arc<TermShared>)>) {
    let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut watched: HashMap<u64, (Arc<Shared>, Arc<TermShared>)> = HashMap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<_>, watched: &mut HashMap<_, _>, entry: (Arc<Shared>, Arc<TermShared>)| {
        seq += 1;
        heap.push(Reverse((entry.1.deadline(), seq)));
        watched.insert(seq, entry);
    };
    loop {
        let wake = match heap.peek() {
            Some(Reverse((at, _))) => crossbeam_channel::at(*at),
            None => crossbeam_channel::never(),
        };
        select! {
            recv(terms) -> msg => match msg {
                Ok(entry) => push(&mut heap, &mut watched, entry),
                Err(_) => return,
            },
            recv(wake) -> _ => {
                let now = Instant::now();
                while let Some(Reverse((at, id))) = heap.peek().copied() {
                    if at > now {
                        break;
                    }
                    heap.pop();
                    let Some((shared, term)) = watched.remove(&id) else { continue };
                    if term.is_ended() {
                        continue;
                    }
                    // Re-reads the deadline: a renewal may have moved it.
                    if let Some(term) = watchdog_fired(&shared, term, now) {
                        push(&mut heap, &mut watched, (shared, term));
                    }
                }
            }
        }
    }
}

/// Runs the group's callbacks in the order events happened.
fn callbacks(
    events: Receiver<(Arc<str>, Event)>, started: Option<Arc<GroupStartedFn>>, stopped: Option<Arc<GroupStoppedFn>>,
    new_leader: Option<Arc<GroupNewLeaderFn>>,
) {
    for (name, ev) in events {
        // Which callback ran, and whether it panicked.
        let ran = match ev {
            Event::Started(guard) => started.as_ref().map(|f| {
                let panicked = catching(
                    || {
                        f(&name, guard);
                        false
                    },
                    || true,
                );
                ("on_started_leading", panicked)
            }),
            Event::Stopped => stopped.as_ref().map(|f| {
                let panicked = catching(
                    || {
                        f(&name);
                        false
                    },
                    || true,
                );
                ("on_stopped_leading", panicked)
            }),
            Event::NewLeader(id, fence) => new_leader.as_ref().map(|f| {
                let panicked = catching(
                    || {
                        f(&name, &id, fence);
                        false
                    },
                    || true,
                );
                ("on_new_leader", panicked)
            }),
        };
        if let Some((callback, true)) = ran {
            log::warn!("leaderelection: {name:?}: {callback} panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::core::{BatchEntry, BatchHeartbeat};
    use crate::lease::Lease;
    use crate::machine::CallId;

    fn entry(key: u32, name: &str) -> BatchEntry {
        BatchEntry {
            key: ElectionKey(key),
            call: CallId(u64::from(key)),
            name: name.into(),
            fence: 7,
            payload: [].into(),
        }
    }

    fn job(call: GroupCall) -> Job {
        Job {
            call,
            store: Arc::new(crate::MemStore::new()),
            identity: "a#1".into(),
            group: "shards".into(),
            timeout: Duration::from_millis(300),
        }
    }

    fn lease_error(o: &Outcome) -> Option<&StoreError> {
        match o {
            Outcome::Lease(r) => r.as_ref().err(),
            Outcome::Released(r) => r.as_ref().err(),
        }
    }

    const NOT_SENT: &str = "no store-call worker came free within 300ms (not sent)";

    // A call that waited out the operation timeout for a worker is not
    // sent: every election in it, and the heartbeat that went with it,
    // fails retryably, saying so, as if the call had failed.
    #[test]
    fn a_call_that_found_no_worker_in_time_fails_every_part_of_it_unsent() {
        let heartbeat = Some(BatchHeartbeat { id: BatchId(9), ttl: Duration::from_secs(5), leading: 2 });
        let batch = Batch {
            id: BatchId(8),
            op: BatchOp::Renew,
            ttl: Duration::from_secs(5),
            entries: vec![entry(1, "shard-1"), entry(2, "shard-2")],
            heartbeat,
        };
        let reply = expired_job(job(GroupCall::Batch(batch)));
        assert_eq!(
            (reply.id, reply.op, reply.label, reply.items, reply.took),
            (BatchId(8), Some(BatchOp::Renew), "renew", 2, Duration::ZERO)
        );
        let Answer::Batch(out, Some((beat, members))) = reply.answer else { panic!("not a batch's answer") };
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|o| lease_error(o).is_some_and(|e| e.is_retryable() && e.message() == NOT_SENT)));
        assert_eq!(beat, BatchId(9));
        assert_eq!(members.map_err(|e| e.to_string()), Err(NOT_SENT.to_owned()));

        let release = Batch {
            id: BatchId(11),
            op: BatchOp::Release,
            ttl: Duration::from_secs(5),
            entries: vec![entry(1, "shard-1")],
            heartbeat: None,
        };
        let reply = expired_job(job(GroupCall::Batch(release)));
        assert_eq!((reply.id, reply.label, reply.items), (BatchId(11), "release", 1));
        let Answer::Batch(out, None) = reply.answer else { panic!("not a release batch's answer") };
        assert!(matches!(&out[..], [Outcome::Released(Err(_))]), "{out:?}");
        assert!(lease_error(&out[0]).is_some_and(|e| e.is_retryable() && e.message() == NOT_SENT));

        let reply = expired_job(job(GroupCall::Heartbeat { id: BatchId(10), ttl: Duration::from_secs(5), leading: 0 }));
        assert_eq!((reply.id, reply.op, reply.label, reply.items), (BatchId(10), None, "heartbeat", 0));
        let Answer::Members(members) = reply.answer else { panic!("not a heartbeat's answer") };
        assert!(members.is_err_and(|e| e.is_retryable() && e.message() == NOT_SENT));
    }

    // A batch failed as a whole only when every item failed alike: one
    // that renewed some elections, or lost some leases, did not.
    #[test]
    fn a_batch_failed_as_a_whole_only_when_every_item_failed_alike() {
        let reset = || Outcome::Lease(Err(StoreError::retryable("connection reset")));
        let t = crate::DbTime::from_unix_micros(1);
        let lease = Lease {
            name: "shard-1".into(),
            holder: "a#1".into(),
            fence: 7,
            acquired_at: t,
            renewed_at: t,
            expires_at: t,
            now: t,
            payload: Vec::new(),
        };
        let renewed = || Outcome::Lease(Ok(lease.clone()));
        assert_eq!(whole_failure(&[reset(), reset()]).map(|e| e.to_string()), Some("connection reset".to_owned()));
        assert!(whole_failure(&[reset(), renewed()]).is_none(), "one item renewed");
        assert!(whole_failure(&[renewed(), reset()]).is_none(), "one item renewed");
        let other = Outcome::Lease(Err(StoreError::retryable("deadlock")));
        assert!(whole_failure(&[reset(), other]).is_none(), "two failures");
        assert!(whole_failure(&[Outcome::Lease(Err(StoreError::lease_lost()))]).is_none(), "a lost lease is its own");
        assert!(whole_failure(&[]).is_none());
    }

    // The group takes every call out of its elections' machines; one that
    // reached an election's hand-off would be a bug of the group, and fails
    // fatally instead of running.
    #[test]
    fn a_call_that_reaches_an_elections_hand_off_fails_fatally() {
        let (dog_tx, _dog) = crossbeam_channel::unbounded();
        let (term_tx, _terms) = crossbeam_channel::unbounded();
        let common = Arc::new(Common {
            origin: Instant::now(),
            store: Arc::new(crate::MemStore::new()),
            identity: "a#1".into(),
            group: "shards".into(),
            timeout: Duration::from_millis(300),
            dog_tx,
            events: None,
            started_callback: false,
            lease_duration: Duration::from_secs(15),
            term_tx,
        });
        let shared = Arc::new(Shared {
            origin: common.origin,
            name: "shard-1".into(),
            identity: "a#1".into(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            #[cfg(loom)]
            mutant: None,
        });
        let mut reach = Reach { common, name: "shard-1".into(), shared };
        let refused = reach.start_call(Call { id: CallId(1), op: crate::machine::Op::Inspect });
        let Err(outcome) = refused else { panic!("the call ran") };
        let e = lease_error(&outcome).expect("an error");
        assert!(e.is_fatal(), "{e}");
        assert_eq!(e.message(), "a group election's call reached its hand-off");
    }
}
