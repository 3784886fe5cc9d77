//! The group fleet on virtual time: participants each running a
//! [`GroupMachine`] over many elections, one shared [`MemStore`], and the
//! oracle that watches every election.

use crate::events::{dur, nanos};
use crate::fleet::{
    outputs_disagree, stretches, Fleet, Net, Process, ReleaseStats, ReleaseTotals, Timeline, Timer, Windowed,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::group_schedule::{GroupFault, GroupSchedule, GroupTarget, GroupVariant};
use super::world::{Property, DB_BASE_MICROS};
use leaderelection::group::core::{Batch, BatchId, BatchOp, ElectionKey, GroupCall, GroupMachine, GroupMachineConfig};
use leaderelection::machine::{CallId, LocalTime, Outcome, Output, TermId};
use leaderelection::{Members, Store, StoreError, MAX_GROUP_CALL_THREADS};

/// The group's name among the members table's groups.
pub const GROUP: &str = "sim-group";

/// Runaway guard: no schedule the decoder produces comes near it.
const MAX_EVENTS: u64 = 5_000_000;

/// The name of election `i`.
pub fn election_name(i: usize) -> String {
    format!("e{i:03}")
}

fn election_index(name: &str) -> Option<usize> {
    name.strip_prefix('e')?.parse().ok()
}

/// A property that failed, when, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupViolation {
    /// Which property.
    pub property: Property,
    /// Virtual time since the start of the run.
    pub at: Duration,
    /// The election, when the property is about one.
    pub election: Option<String>,
    /// What the oracle saw.
    pub detail: String,
}

impl fmt::Display for GroupViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violated at {:?}", self.property.name(), self.at)?;
        if let Some(e) = &self.election {
            write!(f, " in election {e}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What one group run did.
#[derive(Clone, Debug, Default)]
pub struct GroupRunReport {
    /// The first property that failed, if any (the run stops there).
    pub violation: Option<GroupViolation>,
    /// Events, lost messages, times and the trace; the recovery is the
    /// last election's.
    pub timeline: Timeline,
    /// Participants' hosts.
    pub participants: usize,
    /// Processes run (first starts and fresh processes after kills and
    /// shutdowns).
    pub processes: usize,
    /// Elections per participant.
    pub elections: usize,
    /// Whether the run had a fair share.
    pub fair_share: bool,
    /// Calls, terms, faults and leaves, counted.
    pub counts: GroupCounts,
    /// The fairness allowance for this schedule (with a fair share).
    pub fairness_allowance: Duration,
    /// With a fair share: how long after the faults ended a live
    /// participant was last seen leading beyond its share (zero if never).
    pub fairness_convergence: Option<Duration>,
    /// The release feed: releases, wakes ([`GroupSchedule::wakes`]) and
    /// the hand-overs after releases, per election.
    pub releases: ReleaseStats,
}

/// What a group run counts. In a [`GroupExploration`], summed over its
/// runs (of `max_batch_entries` and `max_renew_entries`, the largest).
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupCounts {
    /// Processes that started after the first lease of the run: late
    /// joiners and fresh processes, joining a group already led.
    pub late_joins: u64,
    /// Store calls sent: batches, by kind.
    pub batches: u64,
    /// See [`GroupCounts::batches`].
    pub acquire_batches: u64,
    /// See [`GroupCounts::batches`].
    pub renew_batches: u64,
    /// See [`GroupCounts::batches`].
    pub release_batches: u64,
    /// See [`GroupCounts::batches`].
    pub inspect_batches: u64,
    /// Elections' calls carried by the batches, summed.
    pub batch_entries: u64,
    /// The most elections one batch carried.
    pub max_batch_entries: usize,
    /// The most elections one renewal batch carried.
    pub max_renew_entries: usize,
    /// Heartbeats and leave calls sent.
    pub member_calls: u64,
    /// Of the heartbeats, those that went with a renewal batch (a member
    /// that splits its renewals, see
    /// [`GroupMachineConfig::split_renewals_from`]).
    pub beats_with_renewals: u64,
    /// Calls that found every store-call worker busy
    /// ([`MAX_GROUP_CALL_THREADS`]) and waited for one, as the library's
    /// pool does.
    pub queued_calls: u64,
    /// Of those, calls that waited out the operation timeout and were
    /// answered with a failure without being sent.
    pub refused_calls: u64,
    /// Calls applied by the database.
    pub applied: u64,
    /// Batch answers that reached a participant after it had given the
    /// batch up.
    pub late_replies: u64,
    /// Calls the machines abandoned at the operation timeout.
    pub abandoned: u64,
    /// Terms started, over every election.
    pub terms: u64,
    /// Terms started by another participant than the election's previous
    /// term.
    pub handovers: u64,
    /// Processes killed.
    pub kills: u64,
    /// Of those, the hosts that never came back.
    pub permanent_kills: u64,
    /// Clean shutdowns.
    pub shutdowns: u64,
    /// Elections that left a running group.
    pub leaves: u64,
    /// Renewal batches held in transit across a leave that reached the
    /// database after it.
    pub landed_late: u64,
    /// Elections that joined a running group again.
    pub rejoins: u64,
    /// Terms the program resigned.
    pub resigns: u64,
    /// Terms resigned by the fair share to come down to it.
    pub shed: u64,
    /// Under [`GroupVariant::ReplaysLateAnswers`]: answers handed to the
    /// machines a second time, after the batch's operation timeout.
    pub replayed: u64,
    /// Of those, how many a machine was still waiting for (and took).
    pub replays_taken: u64,
}

impl std::ops::AddAssign for GroupCounts {
    fn add_assign(&mut self, o: GroupCounts) {
        add_fields!(self, o: GroupCounts {
            sum: late_joins, batches, acquire_batches, renew_batches, release_batches, inspect_batches,
                batch_entries, member_calls, beats_with_renewals, queued_calls, refused_calls, applied,
                late_replies, abandoned, terms, handovers, kills, permanent_kills, shutdowns, leaves, landed_late,
                rejoins, resigns, shed, replayed, replays_taken;
            max: max_batch_entries, max_renew_entries,
        });
    }
}

#[derive(Clone, Debug)]
enum Answer {
    /// A batch's outcomes, and the answer of the heartbeat that went with
    /// it, if one did.
    Batch(Vec<Outcome>, Option<(BatchId, Result<Members, StoreError>)>),
    Members(Result<Members, StoreError>),
}

/// The events of a group's world besides those of every world.
enum Own {
    Reply {
        node: usize,
        id: BatchId,
        answer: Answer,
    },
    /// [`GroupVariant::ReplaysLateAnswers`]: a batch's answers again,
    /// straight to its machines.
    Replay {
        node: usize,
        calls: Vec<(ElectionKey, CallId)>,
        out: Vec<Outcome>,
    },
    /// A store-call worker of `node` comes free (its call timed out).
    WorkerFree {
        node: usize,
    },
    Rejoin {
        node: usize,
        elections: Vec<usize>,
    },
    /// [`GroupFault::LeaveRejoin`] with renewals held: the leave, once they
    /// have been sent.
    Leave(usize),
    /// The oldest renewal batch `node` has held in transit reaches the
    /// database.
    Land {
        node: usize,
    },
    /// The record of `election` expires before the guard of `node`'s term
    /// `term` does: look then.
    CheckBacked {
        election: usize,
        node: usize,
        term: TermId,
    },
    CheckFairness,
    /// The release feed's wake for `elections` (each with the released
    /// fence) reaches `node`.
    Wake {
        node: usize,
        elections: Vec<(usize, Option<u64>)>,
    },
}

type Ev = crate::fleet::Ev<GroupCall, Own>;

type Guard = crate::fleet::Guard;

struct Node {
    host: usize,
    identity: String,
    /// The name it heartbeats under (its identity, but for a control).
    member: String,
    payload: Arc<[u8]>,
    /// Running or stopping; `None` once killed or stopped.
    gm: Option<GroupMachine>,
    stopping: bool,
    keys: HashMap<ElectionKey, usize>,
    by_election: Vec<Option<ElectionKey>>,
    /// Live guards, by election.
    guards: BTreeMap<usize, Guard>,
    timer: Timer,
    shutdown_at: Option<u64>,
    /// Elections leaving, since when.
    leaving_since: HashMap<ElectionKey, u64>,
    /// Elections to join again once their leave has finished.
    rejoin_pending: Vec<bool>,
    /// Renewal batches still to hold in transit ([`GroupFault::LeaveRejoin`]'s
    /// `stuck`), and the fault whose leave follows the last.
    hold_renewals: (usize, usize),
    /// When each batch in flight was sent (real time), and its calls.
    sent_at: HashMap<BatchId, (u64, Vec<(ElectionKey, CallId)>)>,
    /// The store-call workers' calls: busy until the answer comes back or,
    /// with no answer, until the store call times out.
    workers: Vec<(BatchId, u64)>,
    /// Calls waiting for a worker to come free, since when (the pool
    /// queues a call while its workers are busy but none is hung; one that
    /// waited past the operation timeout is answered without being sent).
    queued: std::collections::VecDeque<(u64, GroupCall)>,
}

struct Elec {
    name: Arc<str>,
    /// Nodes with a live guard of it.
    holders: Vec<usize>,
    max_issued: u64,
    record_fence: u64,
    /// Fences issued: (fence, node, the key whose term started with it).
    issued: Vec<(u64, usize, Option<ElectionKey>)>,
    max_term_fence: u64,
    last_leader: Option<usize>,
    intervals: Vec<(u64, u64)>,
    /// When the database applied the last release the feed reported,
    /// until the election's next term starts.
    released_at: Option<u64>,
}

struct World<'a> {
    s: &'a GroupSchedule,
    net: Net<'a, GroupCall, Own>,
    nodes: Vec<Node>,
    /// Renewal batches held in transit across a leave, by node, in the
    /// order sent.
    stuck: Vec<(usize, GroupCall)>,
    /// Faults whose leave waits for renewals to be held.
    deferred_leaves: BTreeSet<usize>,
    elecs: Vec<Elec>,
    report: GroupRunReport,
    faults_end: u64,
    /// From when the fair share is checked (`u64::MAX` without one).
    fair_from: u64,
    /// The last instant after the faults a live participant led beyond
    /// its share.
    last_over: Option<u64>,
    /// The store's release feed: watched in every run, passed on to the
    /// participants with [`GroupSchedule::wakes`].
    feed: Option<crossbeam_channel::Receiver<leaderelection::Released>>,
}

/// Runs `schedule` to its end, or to the first violation. With `trace`,
/// the report carries every event as text (slower).
pub fn run_group(schedule: &GroupSchedule, trace: bool) -> GroupRunReport {
    let s = schedule;
    let faults_end = s.faults_end();
    let bound = s.liveness_bound();
    let allowance = s.fairness_allowance();
    let mut w = World {
        s,
        net: Net::new(s.seed, &s.participants, trace),
        nodes: Vec::new(),
        stuck: Vec::new(),
        deferred_leaves: BTreeSet::new(),
        elecs: (0..s.elections)
            .map(|i| Elec {
                name: election_name(i).into(),
                holders: Vec::new(),
                max_issued: 0,
                record_fence: 0,
                issued: Vec::new(),
                max_term_fence: 0,
                last_leader: None,
                intervals: Vec::new(),
                released_at: None,
            })
            .collect(),
        report: GroupRunReport {
            participants: s.participants.len(),
            elections: s.elections,
            fair_share: s.fair_share,
            fairness_allowance: if s.fair_share { allowance } else { Duration::ZERO },
            releases: ReleaseStats { feed: s.wakes.is_some(), ..ReleaseStats::default() },
            ..GroupRunReport::default()
        },
        faults_end: nanos(faults_end),
        fair_from: if s.fair_share { nanos(faults_end + allowance) } else { u64::MAX },
        last_over: None,
        feed: None,
    };
    // Subscribed before any call, as a driver does when it starts.
    w.feed = w.net.store.releases();
    w.net.timeline.faults_end = faults_end;
    w.net.timeline.liveness_bound = bound;
    w.net.start_hosts();
    for (i, f) in s.faults.iter().enumerate() {
        w.net.push(nanos(f.at), Ev::FaultStart(i));
    }
    let settle = if s.fair_share { bound.max(allowance) } else { bound };
    let end = nanos(faults_end + settle + s.timing.lease_duration * 2);
    if s.fair_share {
        w.net.push_own(w.fair_from, Own::CheckFairness);
    }
    GroupRunReport { timeline: w.run_to(end, MAX_EVENTS), ..w.report }
}

fn op_name(op: BatchOp) -> &'static str {
    match op {
        BatchOp::Acquire => "claim",
        BatchOp::Renew => "renewal",
        BatchOp::Release => "release",
        BatchOp::Inspect => "look",
    }
}

impl World<'_> {
    fn violate(&mut self, t: u64, property: Property, election: Option<usize>, detail: String) {
        if self.report.violation.is_none() {
            let election = election.map(|e| self.elecs[e].name.to_string());
            let at = election.as_deref().map_or(String::new(), |e| format!(" in {e}"));
            self.net.note(t, 99, 0, 0, || format!("VIOLATION {}{at}: {detail}", property.name()));
            self.report.violation = Some(GroupViolation { property, at: dur(t), election, detail });
        }
    }

    // ---- guards ----

    /// `LeaderGuard::is_valid` of `node`'s guard of election `e` at real
    /// instant `t`: the process lives, the term is live and the local clock,
    /// re-read now, is before its deadline.
    fn valid(&self, node: usize, e: usize, t: u64) -> bool {
        let n = &self.nodes[node];
        n.gm.is_some() && n.guards.get(&e).is_some_and(|g| self.net.local(n.host, t) < g.deadline)
    }

    fn valid_count(&self, node: usize, t: u64) -> usize {
        let n = &self.nodes[node];
        if n.gm.is_none() {
            return 0;
        }
        let now = self.net.local(n.host, t);
        n.guards.values().filter(|g| now < g.deadline).count()
    }

    /// Live participants: processes running and not shutting down.
    fn live(&self) -> usize {
        self.nodes.iter().filter(|n| n.gm.is_some() && !n.stopping).count()
    }

    fn share(&self) -> usize {
        self.s.elections.div_ceil(self.live().max(1))
    }

    fn close_guard(&mut self, t: u64, node: usize, e: usize) {
        let Some(g) = self.nodes[node].guards.get(&e).copied() else { return };
        if self.s.fair_share && t >= self.faults_end && !self.nodes[node].stopping {
            // The fairness convergence metric: was it over its share just
            // before this term ended?
            if self.valid_count(node, t) > self.share() {
                self.last_over = Some(t);
            }
        }
        self.nodes[node].guards.remove(&e);
        let end = t.min(self.net.real_at(self.nodes[node].host, g.deadline)).max(g.start);
        let el = &mut self.elecs[e];
        el.intervals.push((g.start, end));
        el.holders.retain(|&n| n != node);
    }

    // ---- events ----

    fn join(&mut self, t: u64, node: usize, e: usize) {
        let now = self.net.local(self.nodes[node].host, t);
        let name = Arc::clone(&self.elecs[e].name);
        let n = &mut self.nodes[node];
        let payload = Arc::clone(&n.payload);
        let Some(gm) = n.gm.as_mut() else { return };
        if let Ok(key) = gm.join(now, name, payload) {
            n.keys.insert(key, e);
            n.by_election[e] = Some(key);
        }
    }

    /// After `node`'s group took an input: carry out each election's
    /// outputs, check the machines against them, send the calls, re-arm the
    /// timer, as the threaded driver's loop does.
    fn after(&mut self, t: u64, node: usize) {
        loop {
            let Some(gm) = self.nodes[node].gm.as_mut() else { return };
            let mut events: Vec<(ElectionKey, Output)> = std::iter::from_fn(|| gm.poll_event()).collect();
            // Each election's outputs in order; elections in key order (the
            // core's order across elections may follow a hash map's).
            events.sort_by_key(|(k, _)| *k);
            for (key, out) in events {
                self.output(t, node, key, out);
            }
            let Some(gm) = self.nodes[node].gm.as_mut() else { return };
            let mut touched = gm.take_touched();
            touched.sort_unstable();
            for key in touched {
                self.check_outputs(t, node, key);
            }
            let calls: Vec<GroupCall> = match self.nodes[node].gm.as_mut() {
                Some(gm) => std::iter::from_fn(|| gm.poll_call()).collect(),
                None => Vec::new(),
            };
            if calls.is_empty() {
                break;
            }
            for call in calls {
                self.send(t, node, call);
            }
        }
        if self.nodes[node].gm.as_ref().is_some_and(GroupMachine::is_stopped) {
            self.stopped(t, node);
            return;
        }
        self.rearm(t, node);
    }

    fn output(&mut self, t: u64, node: usize, key: ElectionKey, out: Output) {
        let Some(e) = self.nodes[node].keys.get(&key).copied() else {
            let detail = format!("an output for {key:?}, which is not in the group: {out:?}");
            self.violate(t, Property::OutputsMatchMachine, None, detail);
            return;
        };
        self.net.note_output(t, node, Some(&self.elecs[e].name), &out);
        match out {
            Output::Call(call) => {
                let detail = format!("the group handed out {}'s call {call:?} as an event", self.elecs[e].name);
                self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
            }
            Output::CallAbandoned(_) => self.report.counts.abandoned += 1,
            Output::TermStarted { term, fence, deadline } => {
                self.report.counts.terms += 1;
                self.term_started(t, node, key, e, term, fence, deadline);
            }
            Output::DeadlineExtended { term, deadline } => self.deadline_extended(t, node, e, term, deadline),
            Output::TermEnded { term, .. } => {
                if self.nodes[node].guards.get(&e).is_some_and(|g| g.term == term) {
                    self.close_guard(t, node, e);
                } else {
                    let ident = self.nodes[node].identity.clone();
                    let detail = format!("{ident} ended {term:?}, not live");
                    self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
                }
            }
            Output::NewLeader { .. } | Output::Released { .. } | Output::Failed(_) => {}
            Output::Stopped => self.election_stopped(t, node, key, e),
        }
    }

    /// Election `e`'s machine stopped (its leave, or the group's
    /// shutdown): the driver forgets it, and joins it again if that is due.
    fn election_stopped(&mut self, t: u64, node: usize, key: ElectionKey, e: usize) {
        if let Some(since) = self.nodes[node].leaving_since.remove(&key) {
            let bound = nanos(self.s.stop_bound(false));
            if t.saturating_sub(since) > bound {
                let detail = format!(
                    "{} began leaving at {:?} and its machine stopped at {:?} (bound {:?})",
                    self.nodes[node].identity,
                    dur(since),
                    dur(t),
                    dur(bound)
                );
                self.violate(t, Property::StopCompletes, Some(e), detail);
            }
        }
        if self.nodes[node].guards.contains_key(&e) {
            let detail = format!("{} stopped with its term live", self.nodes[node].identity);
            self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
            self.close_guard(t, node, e);
        }
        let n = &mut self.nodes[node];
        if let Some(gm) = n.gm.as_mut() {
            gm.forget(key);
        }
        n.keys.remove(&key);
        if n.by_election[e] == Some(key) {
            n.by_election[e] = None;
        }
        if std::mem::take(&mut n.rejoin_pending[e]) && !n.stopping {
            self.join(t, node, e);
            self.report.counts.rejoins += 1;
            let name = Arc::clone(&self.elecs[e].name);
            self.net.note(t, 19, node as u64, e as u64, || format!("n{node} {name} joins again"));
        }
    }

    /// The whole group of `node` has stopped (a clean shutdown finished).
    fn stopped(&mut self, t: u64, node: usize) {
        if let Some(since) = self.nodes[node].shutdown_at {
            self.check_shutdown_time(t, node, since);
        }
        let guards: Vec<usize> = self.nodes[node].guards.keys().copied().collect();
        if !guards.is_empty() {
            let detail = format!("{} stopped with {} terms live", self.nodes[node].identity, guards.len());
            self.violate(t, Property::OutputsMatchMachine, guards.first().copied(), detail);
        }
        for e in guards {
            self.close_guard(t, node, e);
        }
        self.retire(node);
        self.net.note(t, 7, node as u64, 0, || format!("n{node} has stopped"));
    }

    /// The process is gone: count what its group did.
    fn retire(&mut self, node: usize) {
        if let Some(gm) = self.nodes[node].gm.take() {
            self.report.counts.shed += gm.shed_count();
        }
        self.nodes[node].timer.at = None;
    }

    fn check_shutdown_time(&mut self, t: u64, node: usize, since: u64) {
        let bound = nanos(self.s.stop_bound(true));
        if t.saturating_sub(since) > bound {
            let detail = format!(
                "{} began shutting down at {:?} and had not stopped by {:?} (bound {:?})",
                self.nodes[node].identity,
                dur(since),
                dur(t),
                dur(bound)
            );
            self.violate(t, Property::StopCompletes, None, detail);
        }
    }

    fn check_outputs(&mut self, t: u64, node: usize, key: ElectionKey) {
        let n = &self.nodes[node];
        let Some(gm) = n.gm.as_ref() else { return };
        let e = n.keys.get(&key).copied();
        let guard = e.and_then(|e| n.guards.get(&e));
        if let Some(detail) = outputs_disagree(&n.identity, guard, gm.machine(key).and_then(|m| m.term())) {
            self.violate(t, Property::OutputsMatchMachine, e, detail);
        }
    }

    fn rearm(&mut self, t: u64, node: usize) {
        let n = &self.nodes[node];
        let Some(gm) = n.gm.as_ref() else { return };
        let (host, at) = (n.host, gm.poll_timeout());
        self.net.arm(t, node, host, &mut self.nodes[node].timer, at);
    }

    // ---- messages ----

    /// Starts `call` on one of `node`'s store-call workers, or queues it
    /// for the first to come free.
    fn send(&mut self, t: u64, node: usize, mut call: GroupCall) {
        let host = self.nodes[node].host;
        let id = call.id();
        if self.s.variant == GroupVariant::DropsHeartbeats && matches!(call, GroupCall::Heartbeat { .. }) {
            self.net.note(t, 9, node as u64, id.0, || format!("n{node} heartbeat {} dropped by the driver", id.0));
            return;
        }
        if let (GroupVariant::DropsHeartbeats, GroupCall::Batch(b)) = (self.s.variant, &mut call) {
            if let Some(h) = b.heartbeat.take() {
                self.net
                    .note(t, 9, node as u64, h.id.0, || format!("n{node} heartbeat {} dropped by the driver", h.id.0));
            }
        }
        self.nodes[node].workers.retain(|&(_, until)| until > t);
        if self.nodes[node].workers.len() >= MAX_GROUP_CALL_THREADS {
            // Every worker busy, none hung (a worker here is busy at most
            // an operation timeout): the call waits for the first to come
            // free, as the library's pool does.
            self.report.counts.queued_calls += 1;
            self.net.note(t, 2, node as u64, id.0, || format!("n{node} call {} waits for a worker", id.0));
            let free = self.nodes[node].workers.iter().map(|&(_, until)| until).min().unwrap_or(t);
            self.nodes[node].queued.push_back((t, call));
            self.net.push_own(free, Own::WorkerFree { node });
            return;
        }
        let busy_until = t.saturating_add(self.net.real_span(host, self.s.timing.operation_timeout));
        self.nodes[node].workers.push((id, busy_until));
        match &call {
            GroupCall::Batch(b) => {
                self.report.counts.batches += 1;
                self.report.counts.batch_entries += b.entries.len() as u64;
                self.report.counts.max_batch_entries = self.report.counts.max_batch_entries.max(b.entries.len());
                match b.op {
                    BatchOp::Acquire => self.report.counts.acquire_batches += 1,
                    BatchOp::Renew => {
                        self.report.counts.renew_batches += 1;
                        self.report.counts.max_renew_entries =
                            self.report.counts.max_renew_entries.max(b.entries.len());
                    }
                    BatchOp::Release => self.report.counts.release_batches += 1,
                    BatchOp::Inspect => self.report.counts.inspect_batches += 1,
                }
                let calls = if self.s.variant == GroupVariant::ReplaysLateAnswers {
                    b.entries.iter().map(|e| (e.key, e.call)).collect()
                } else {
                    Vec::new()
                };
                self.nodes[node].sent_at.insert(id, (t, calls));
                let (op, len) = (b.op, b.entries.len());
                self.net.note(t, 10, node as u64, id.0, || format!("n{node} batch {}: {} of {len}", id.0, op_name(op)));
            }
            GroupCall::Heartbeat { .. } | GroupCall::Leave { .. } => {
                self.report.counts.member_calls += 1;
                let what = if matches!(call, GroupCall::Leave { .. }) { "leave" } else { "heartbeat" };
                self.net.note(t, 10, node as u64, id.0, || format!("n{node} call {}: {what}", id.0));
            }
        }
        if let GroupCall::Batch(b) = &call {
            let (left, fault) = self.nodes[node].hold_renewals;
            if b.op == BatchOp::Renew && left > 0 {
                self.nodes[node].hold_renewals.0 -= 1;
                self.net.note(t, 3, node as u64, id.0, || format!("n{node} batch {} held in transit", id.0));
                let first = !self.stuck.iter().any(|(n, _)| *n == node);
                self.stuck.push((node, call));
                if first {
                    self.schedule_landing(t, node);
                }
                if left == 1 {
                    self.net.push_own(t, Own::Leave(fault));
                }
                return;
            }
        }
        self.net.transmit(t, node, host, id.0, false, Ev::Request { node, call });
    }

    /// The oracle's view of a batch the database applied: fences issued by
    /// claims, the record's fence, and every valid guard of the elections
    /// it wrote still backed by its record.
    fn batch_applied<'n>(
        &mut self, t: u64, node: usize, op: BatchOp, names: impl Iterator<Item = &'n str>, out: &[Outcome],
    ) {
        let elections: Vec<usize> = names.filter_map(election_index).collect();
        for (&e, o) in elections.iter().zip(out) {
            if e >= self.elecs.len() {
                continue;
            }
            if let (BatchOp::Acquire, Outcome::Lease(Ok(l))) = (op, o) {
                let before = self.elecs[e].record_fence;
                if l.fence < before {
                    let detail = format!("record fence went from {before} to {}", l.fence);
                    self.violate(t, Property::StoreFenceMonotonic, Some(e), detail);
                }
                if l.fence != before {
                    self.fence_issued(t, node, e, l.fence, &l.holder);
                }
                self.elecs[e].record_fence = l.fence;
            }
            let holders = self.elecs[e].holders.clone();
            for h in holders {
                if self.valid(h, e, t) {
                    self.check_backed(t, h, e);
                }
            }
        }
    }

    /// The release feed, after the database applied a call of `from`: the
    /// elections it reports released (each release ended a live term)
    /// start their hand-overs' clocks and, with [`GroupSchedule::wakes`],
    /// wake the running process of every other host, one wake naming them
    /// all over its link, as a group driver takes every name waiting at
    /// once ([`GroupMachine::handle_wakes`]).
    fn tell_releases(&mut self, t: u64, from: usize) {
        let Some(rx) = &self.feed else { return };
        let elections: Vec<(usize, Option<u64>)> = rx
            .try_iter()
            .filter_map(|r| election_index(&r.name).map(|e| (e, r.fence)))
            .filter(|&(e, _)| e < self.elecs.len())
            .collect();
        if elections.is_empty() {
            return;
        }
        self.report.releases.releases += elections.len() as u64;
        for &(e, _) in &elections {
            self.elecs[e].released_at = Some(t);
        }
        let n = elections.len();
        self.net.note(t, 40, from as u64, n as u64, || format!("the feed reports {n} elections n{from} released"));
        let Some(feed) = self.s.wakes else { return };
        let from_host = self.nodes[from].host;
        for host in (0..self.net.states.len()).filter(|&h| h != from_host) {
            let Some(node) = self.net.states[host].current.filter(|&n| self.nodes[n].gm.is_some()) else { continue };
            let again_within = self.s.timing.retry_period;
            for at in self.net.send_wake(t, (node, host), feed, again_within, &mut self.report.releases) {
                self.net.push_own(at, Own::Wake { node, elections: elections.clone() });
            }
        }
    }

    /// A wake for `elections` reaches `node`: its group wakes the
    /// machines it runs them with, their claims in one batch.
    fn woken_by_feed(&mut self, t: u64, node: usize, elections: &[(usize, Option<u64>)]) {
        let host = self.nodes[node].host;
        if self.nodes[node].gm.is_none() || self.net.wake_cut_off(t, node, host, &mut self.report.releases) {
            return;
        }
        let n = &self.nodes[node];
        let woken: Vec<(ElectionKey, Option<u64>)> =
            elections.iter().filter_map(|&(e, fence)| n.by_election[e].map(|k| (k, fence))).collect();
        let now = self.net.local(host, t);
        if let Some(gm) = self.nodes[node].gm.as_mut() {
            gm.handle_wakes(now, &woken);
        }
        self.after(t, node);
    }

    /// Hands waiting calls to the workers that are free: a call that
    /// waited past the operation timeout is answered with a failure
    /// without being sent (its machines have abandoned it), the others are
    /// sent.
    fn start_queued(&mut self, t: u64, node: usize) {
        let host = self.nodes[node].host;
        let waited_out = self.net.real_span(host, self.s.timing.operation_timeout);
        loop {
            self.nodes[node].workers.retain(|&(_, until)| until > t);
            if self.nodes[node].workers.len() >= MAX_GROUP_CALL_THREADS {
                if !self.nodes[node].queued.is_empty() {
                    let free = self.nodes[node].workers.iter().map(|&(_, until)| until).min().unwrap_or(t);
                    self.net.push_own(free, Own::WorkerFree { node });
                }
                return;
            }
            let Some((since, call)) = self.nodes[node].queued.pop_front() else { return };
            if t.saturating_sub(since) < waited_out {
                self.send(t, node, call);
                continue;
            }
            self.report.counts.refused_calls += 1;
            let id = call.id();
            self.net
                .note(t, 2, node as u64, id.0, || format!("n{node} call {} waited out the timeout: not sent", id.0));
            let e = StoreError::retryable("no store-call worker came free within the operation timeout (not sent)");
            let now = self.net.local(host, t);
            if let Some(gm) = self.nodes[node].gm.as_mut() {
                match call {
                    GroupCall::Batch(b) => {
                        let (failed, members) = b.failed(&e);
                        gm.handle_batch_reply(now, b.id, failed);
                        if let (Some(h), Some(m)) = (b.heartbeat, members) {
                            gm.handle_members_reply(now, h.id, m);
                        }
                    }
                    call => gm.handle_members_reply(now, call.id(), Err(e)),
                }
            }
        }
    }

    fn deliver(&mut self, t: u64, node: usize, id: BatchId, answer: Answer) {
        let host = self.nodes[node].host;
        if self.net.reply_cut_off(t, node, host, id.0) {
            return;
        }
        if self.nodes[node].gm.is_none() {
            return;
        }
        // The store call has returned: its worker is free.
        self.nodes[node].workers.retain(|&(w, _)| w != id);
        self.start_queued(t, node);
        let now = self.net.local(host, t);
        let variant = self.s.variant;
        match answer {
            Answer::Batch(mut out, members) => {
                let sent = self.nodes[node].sent_at.remove(&id);
                let gm = self.nodes[node].gm.as_ref().expect("checked above");
                let known = !gm.batch_keys(id).is_empty();
                if !known {
                    self.report.counts.late_replies += 1;
                }
                self.net.note(t, 5, node as u64, id.0, || {
                    format!(
                        "n{node} answer to batch {} ({} items){}",
                        id.0,
                        out.len(),
                        if known { "" } else { ", given up" }
                    )
                });
                if variant == GroupVariant::RotatedAnswers && out.len() > 1 {
                    out.rotate_right(1);
                }
                if let Some((sent, calls)) = sent.filter(|(_, c)| !c.is_empty()) {
                    // Again after the operation timeout and a tick, when
                    // the core and every machine have given the calls up.
                    let late = self.net.real_span(host, self.s.timing.operation_timeout + self.s.tick);
                    let at = sent.saturating_add(late).max(t) + 1;
                    self.net.push_own(at, Own::Replay { node, calls, out: out.clone() });
                }
                if let Some(gm) = self.nodes[node].gm.as_mut() {
                    gm.handle_batch_reply(now, id, out);
                }
                if let Some((mid, r)) = members {
                    self.net.note(t, 6, node as u64, mid.0, || format!("n{node} members answer {}: {r:?}", mid.0));
                    if let Some(gm) = self.nodes[node].gm.as_mut() {
                        gm.handle_members_reply(now, mid, r);
                    }
                }
            }
            Answer::Members(r) => {
                self.net.note(t, 6, node as u64, id.0, || format!("n{node} members answer {}: {r:?}", id.0));
                if let Some(gm) = self.nodes[node].gm.as_mut() {
                    gm.handle_members_reply(now, id, r);
                }
            }
        }
        self.after(t, node);
    }

    /// [`GroupVariant::ReplaysLateAnswers`]: the driver hands each answer
    /// of a batch given up straight to its election's machine, as if fresh,
    /// past the core's bookkeeping of batches: only the machine's own check
    /// of the call's id stands between the stale answer and the term.
    fn replay(&mut self, t: u64, node: usize, calls: Vec<(ElectionKey, CallId)>, out: Vec<Outcome>) {
        let host = self.nodes[node].host;
        let now = self.net.local(host, t);
        let Some(gm) = self.nodes[node].gm.as_mut() else { return };
        let mut taken = 0;
        for ((key, call), outcome) in calls.iter().copied().zip(out) {
            let waiting = gm.machine(key).and_then(|m| m.call_in_flight()).is_some_and(|c| c.id == call);
            taken += u64::from(waiting);
            gm.with_machine(now, key, |m| m.handle_reply(now, call, outcome));
        }
        self.report.counts.replayed += calls.len() as u64;
        self.report.counts.replays_taken += taken;
        let n = calls.len();
        self.net.note(t, 8, node as u64, n as u64, || format!("n{node} REPLAYS {n} answers as fresh ({taken} taken)"));
        self.after(t, node);
    }

    // ---- faults ----

    /// The host a fault hits: its own, or the one whose process leads the
    /// most elections (host 0 if nobody leads).
    fn resolve(&self, t: u64, target: GroupTarget) -> usize {
        match target {
            GroupTarget::Host(h) => h,
            GroupTarget::Leader => {
                let mut best = (0, 0);
                for (host, hs) in self.net.states.iter().enumerate() {
                    let Some(node) = hs.current else { continue };
                    let count = self.valid_count(node, t);
                    if count > best.1 {
                        best = (host, count);
                    }
                }
                best.0
            }
        }
    }

    /// The running (not stopping) process of `host`, if any.
    fn running(&self, host: usize) -> Option<usize> {
        self.net.states[host].current.filter(|&n| self.nodes[n].gm.is_some() && !self.nodes[n].stopping)
    }

    /// Whether `host` may go for good: another host is still in the fleet.
    fn may_go(&self, host: usize) -> bool {
        self.net.states.iter().enumerate().any(|(h, hs)| h != host && !hs.gone)
    }

    fn kill(&mut self, t: u64, i: usize, host: usize, down: Duration, permanent: bool) {
        let Some(node) = self.net.states[host].current.filter(|&n| self.nodes[n].gm.is_some()) else { return };
        if self.net.states[host].restart_pending {
            return;
        }
        let forever = permanent && self.may_go(host);
        self.net.note(t, 30, i as u64, host as u64, || {
            format!("fault {i}: KILL host {host} (n{node}){}", if forever { " for good" } else { "" })
        });
        self.report.counts.kills += 1;
        // The process is gone: its guards with it, its leases and member
        // row left on the database.
        let guards: Vec<usize> = self.nodes[node].guards.keys().copied().collect();
        for e in guards {
            self.close_guard(t, node, e);
        }
        self.retire(node);
        if forever {
            self.net.states[host].gone = true;
            self.report.counts.permanent_kills += 1;
        } else {
            self.restart_later(t, host, down);
        }
    }

    fn shutdown(&mut self, t: u64, i: usize, host: usize, down: Duration, permanent: bool) {
        let Some(node) = self.running(host) else { return };
        if self.net.states[host].restart_pending {
            return;
        }
        let forever = permanent && self.may_go(host);
        self.net.note(t, 30, i as u64, host as u64, || {
            format!("fault {i}: SHUTDOWN host {host} (n{node}){}", if forever { " for good" } else { "" })
        });
        self.report.counts.shutdowns += 1;
        let now = self.net.local(host, t);
        self.nodes[node].shutdown_at = Some(t);
        self.nodes[node].stopping = true;
        self.nodes[node].rejoin_pending.iter_mut().for_each(|p| *p = false);
        if let Some(gm) = self.nodes[node].gm.as_mut() {
            gm.shutdown(now, true);
        }
        self.after(t, node);
        if forever {
            self.net.states[host].gone = true;
        } else {
            self.restart_later(t, host, down);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn leave_some(
        &mut self, t: u64, i: usize, host: usize, first: usize, count: usize, release: bool, after: Duration,
    ) {
        let Some(node) = self.running(host) else { return };
        let now = self.net.local(host, t);
        let mut left = Vec::new();
        for k in 0..count.min(self.s.elections) {
            let e = (first + k) % self.s.elections;
            let n = &mut self.nodes[node];
            let Some(key) = n.by_election[e] else { continue };
            if n.leaving_since.contains_key(&key) {
                continue;
            }
            n.leaving_since.insert(key, t);
            if let Some(gm) = n.gm.as_mut() {
                gm.leave(now, key, release);
            }
            left.push(e);
        }
        self.report.counts.leaves += left.len() as u64;
        let n_left = left.len();
        self.net.note(t, 30, i as u64, host as u64, || {
            format!(
                "fault {i}: {n_left} elections of n{node} LEAVE{} from {first}, to join again after {after:?}",
                if release { "" } else { " without release" }
            )
        });
        self.after(t, node);
        self.net.push_own(t + nanos(after), Own::Rejoin { node, elections: left });
    }

    /// [`GroupFault::LeaveRejoin`] with renewals held, once they went (or
    /// at the latest they could have): the leave, while they are in transit.
    fn leave_held(&mut self, t: u64, i: usize) {
        if !self.deferred_leaves.remove(&i) {
            return;
        }
        let GroupFault::LeaveRejoin { target, first, count, release, after, .. } = self.s.faults[i].fault else {
            unreachable!("only a leave is deferred")
        };
        for n in &mut self.nodes {
            if n.hold_renewals.1 == i {
                n.hold_renewals.0 = 0;
            }
        }
        let host = self.resolve(t, target);
        self.leave_some(t, i, host, first, count, release, after);
    }

    /// Arms the landing of `node`'s oldest held batch: a millisecond before
    /// the earliest of its leases still live expires (the database clock
    /// runs at the real rate), at once if none is.
    fn schedule_landing(&mut self, t: u64, node: usize) {
        self.net.advance_db(t);
        let Some((_, GroupCall::Batch(b))) = self.stuck.iter().find(|(n, _)| *n == node) else { return };
        let identity = &self.nodes[node].identity;
        let left = b
            .entries
            .iter()
            .filter_map(|e| self.net.store.peek(&e.name).filter(|l| l.held_by(identity) && l.fence == e.fence))
            .map(|l| l.ttl())
            .min()
            .unwrap_or_default();
        self.net.push_own(t + nanos(left.saturating_sub(Duration::from_millis(1))), Own::Land { node });
    }

    fn land(&mut self, t: u64, node: usize) {
        let Some(at) = self.stuck.iter().position(|(n, _)| *n == node) else { return };
        let (_, call) = self.stuck.remove(at);
        let id = call.id();
        self.report.counts.landed_late += 1;
        self.net.note(t, 4, node as u64, id.0, || format!("n{node} batch {} held in transit lands", id.0));
        self.apply(t, node, call);
        self.schedule_landing(t, node);
    }

    fn rejoin(&mut self, t: u64, node: usize, elections: &[usize]) {
        if self.nodes[node].gm.is_none() || self.nodes[node].stopping {
            return;
        }
        let mut joined = 0;
        for &e in elections {
            match self.nodes[node].by_election[e] {
                None => {
                    self.join(t, node, e);
                    joined += 1;
                }
                Some(key) if self.nodes[node].leaving_since.contains_key(&key) => {
                    self.nodes[node].rejoin_pending[e] = true;
                }
                Some(_) => {}
            }
        }
        self.report.counts.rejoins += joined;
        self.net.note(t, 19, node as u64, joined, || {
            format!("n{node}: {joined} elections join again ({} wait for their leave)", elections.len() as u64 - joined)
        });
        self.after(t, node);
    }

    fn resign_some(&mut self, t: u64, i: usize, host: usize, count: usize) {
        let Some(node) = self.running(host) else { return };
        let now = self.net.local(host, t);
        let led: Vec<usize> = self.nodes[node].guards.keys().copied().take(count).collect();
        self.net.note(t, 30, i as u64, host as u64, || format!("fault {i}: n{node} resigns {} terms", led.len()));
        for e in led {
            let n = &mut self.nodes[node];
            let (Some(key), Some(gm)) = (n.by_election[e], n.gm.as_mut()) else { continue };
            gm.with_machine(now, key, |m| {
                if let Some(term) = m.term() {
                    m.resign(now, term.id);
                }
            });
            self.report.counts.resigns += 1;
        }
        self.after(t, node);
    }

    // ---- the oracle ----

    /// The database issued `fence` for a new term of election `e`, in a
    /// claim of `node`'s.
    fn fence_issued(&mut self, t: u64, node: usize, e: usize, fence: u64, holder: &str) {
        let el = &self.elecs[e];
        if fence <= el.max_issued {
            let detail = format!(
                "the database issued fence {fence} to {holder}, but it had issued fence {} before",
                el.max_issued
            );
            self.violate(t, Property::FencesIncrease, Some(e), detail);
        }
        if holder != self.nodes[node].identity {
            let detail = format!("a claim of {} changed the fence to {fence} for {holder}", self.nodes[node].identity);
            self.violate(t, Property::FencesIncrease, Some(e), detail);
        }
        let el = &mut self.elecs[e];
        el.max_issued = el.max_issued.max(fence);
        el.issued.push((fence, node, None));
    }

    #[allow(clippy::too_many_arguments)]
    fn term_started(
        &mut self, t: u64, node: usize, key: ElectionKey, e: usize, term: TermId, fence: u64, deadline: LocalTime,
    ) {
        let ident = self.nodes[node].identity.clone();
        if self.nodes[node].guards.contains_key(&e) {
            let detail = format!("{ident} started {term:?} inside another term");
            self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
            return;
        }
        let mut problem = None;
        match self.elecs[e].issued.iter_mut().rev().find(|(f, _, _)| *f == fence) {
            Some((_, to, started @ None)) if *to == node => *started = Some(key),
            Some((_, to, started)) => {
                let to = *to;
                // The same process under an earlier key of the same
                // election: it left and joined again (the group must keep
                // the fences it led under; see GroupMachine::forget).
                let rejoined = to == node && started.is_some_and(|k| k != key);
                problem = Some(format!(
                    "{ident} started a term with fence {fence}, issued to {} and {}",
                    self.nodes[to].identity,
                    match (to == node, rejoined) {
                        (true, true) => "already led under before the election left and joined again",
                        (true, false) => "already led under",
                        _ => "not to it",
                    }
                ));
            }
            None => {
                problem = Some(format!(
                    "{ident} started a term with fence {fence}, which the database never issued for this election"
                ));
            }
        }
        if problem.is_none() && fence <= self.elecs[e].max_term_fence {
            problem = Some(format!(
                "{ident} started a term with fence {fence}, but a term with fence {} started before",
                self.elecs[e].max_term_fence
            ));
        }
        if let Some(detail) = problem {
            self.violate(t, Property::FencesIncrease, Some(e), detail);
        }
        if let Some(released) = self.elecs[e].released_at.take() {
            self.report.releases.handed_over(released, t);
        }
        let host = self.nodes[node].host;
        if self.net.local(host, t) >= deadline {
            let detail = format!("{ident} started {term:?} already past its deadline");
            self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
        }
        let el = &mut self.elecs[e];
        el.max_term_fence = el.max_term_fence.max(fence);
        if el.last_leader.is_some_and(|l| l != node) {
            self.report.counts.handovers += 1;
        }
        el.last_leader = Some(node);
        el.holders.push(node);
        self.nodes[node].guards.insert(e, Guard { term, fence, deadline, start: t, more: () });
        self.check_one_valid(t, node, e);
        if self.valid(node, e, t) {
            self.check_backed(t, node, e);
        }
        if self.s.fair_share && t >= self.faults_end {
            if self.valid_count(node, t) > self.share() {
                self.last_over = Some(t);
            }
            if t >= self.fair_from {
                self.check_fair(t, node);
            }
        }
    }

    fn deadline_extended(&mut self, t: u64, node: usize, e: usize, term: TermId, deadline: LocalTime) {
        let ident = self.nodes[node].identity.clone();
        let Some(g) = self.nodes[node].guards.get(&e).copied().filter(|g| g.term == term) else {
            let detail = format!("{ident} extended {term:?}, which is not live");
            self.violate(t, Property::OutputsMatchMachine, Some(e), detail);
            return;
        };
        if !self.valid(node, e, t) {
            let detail = self.net.revived(&ident, self.nodes[node].host, &g, deadline, t);
            self.violate(t, Property::GuardNeverRevives, Some(e), detail);
            return;
        }
        self.nodes[node].guards.insert(e, Guard { deadline, ..g });
        self.check_one_valid(t, node, e);
        self.check_backed(t, node, e);
    }

    /// Validity turns on only when a term starts (and a deadline extended
    /// on a guard already valid keeps it on; one that was off is a
    /// violation of its own), and turns off at events and deadlines; so
    /// checking at each start and extension covers every instant.
    fn check_one_valid(&mut self, t: u64, node: usize, e: usize) {
        if !self.valid(node, e, t) {
            return;
        }
        let others: Vec<usize> =
            self.elecs[e].holders.iter().copied().filter(|&h| h != node && self.valid(h, e, t)).collect();
        if others.is_empty() {
            return;
        }
        let who: Vec<String> = std::iter::once(node)
            .chain(others)
            .map(|n| {
                let nd = &self.nodes[n];
                self.net.holder(&nd.identity, nd.host, &nd.guards[&e], t)
            })
            .collect();
        self.violate(t, Property::AtMostOneValidGuard, Some(e), who.join(" and "));
    }

    /// `node`'s valid guard of `e` must be backed by the record now, and
    /// the record must not expire before the guard does unless something
    /// writes it first (every write is checked again; an expiry before the
    /// guard's deadline is looked at when it comes).
    fn check_backed(&mut self, t: u64, node: usize, e: usize) {
        self.net.advance_db(t);
        let n = &self.nodes[node];
        let Some(g) = n.guards.get(&e).copied() else { return };
        let row = self.net.store.peek(&self.elecs[e].name);
        let ok = row.as_ref().is_some_and(|r| r.holder == n.identity && r.fence == g.fence && !r.expired());
        if !ok {
            let detail = format!("{} holds fence {} but the record is {row:?}", n.identity, g.fence);
            self.violate(t, Property::GuardBackedByRecord, Some(e), detail);
            return;
        }
        let row = row.expect("checked");
        let expires = u64::try_from(row.expires_at.as_unix_micros() - DB_BASE_MICROS).unwrap_or(0) * 1000;
        if expires < self.net.real_at(n.host, g.deadline) {
            self.net.push_own(expires.max(t), Own::CheckBacked { election: e, node, term: g.term });
        }
    }

    fn check_fair(&mut self, t: u64, node: usize) {
        if self.nodes[node].gm.is_none() || self.nodes[node].stopping || !self.s.fair_share {
            return;
        }
        let (count, share, live) = (self.valid_count(node, t), self.share(), self.live());
        if count > share {
            let detail = format!(
                "{} holds {count} valid guards, beyond ceil({} / {live}) = {share} ({:?} after the faults ended, \
                 allowance {:?})",
                self.nodes[node].identity,
                self.s.elections,
                dur(t.saturating_sub(self.faults_end)),
                self.report.fairness_allowance
            );
            self.violate(t, Property::FairShare, None, detail);
        }
    }
}

impl<'a> Fleet<'a> for World<'a> {
    type Call = GroupCall;
    type Own = Own;

    fn net(&mut self) -> &mut Net<'a, GroupCall, Own> {
        &mut self.net
    }

    fn process(&mut self, node: usize) -> Process<'_> {
        let n = &mut self.nodes[node];
        Process { host: n.host, identity: &n.identity, timer: n.gm.as_ref().map(|_| &mut n.timer) }
    }

    fn woken(&mut self, t: u64, node: usize) {
        let now = self.net.local(self.nodes[node].host, t);
        if let Some(gm) = self.nodes[node].gm.as_mut() {
            gm.handle_timeout(now);
        }
        self.after(t, node);
    }

    fn go_on(&mut self, _: u64) -> bool {
        self.report.violation.is_none()
    }

    fn finish(&mut self, now: u64, end: u64) {
        if self.report.violation.is_none() {
            for node in 0..self.nodes.len() {
                if let (Some(since), true) = (self.nodes[node].shutdown_at, self.nodes[node].gm.is_some()) {
                    self.check_shutdown_time(now, node, since);
                }
                let leaving: Vec<(ElectionKey, u64)> =
                    self.nodes[node].leaving_since.iter().map(|(k, s)| (*k, *s)).collect();
                let bound = nanos(self.s.stop_bound(false));
                if let Some((key, since)) = leaving.into_iter().filter(|(_, s)| now.saturating_sub(*s) > bound).min() {
                    if self.nodes[node].gm.is_some() {
                        let e = self.nodes[node].keys.get(&key).copied();
                        let detail = format!(
                            "{} began leaving at {:?} and had not stopped by {:?}",
                            self.nodes[node].identity,
                            dur(since),
                            dur(now)
                        );
                        self.violate(now, Property::StopCompletes, e, detail);
                    }
                }
            }
        }
        for node in 0..self.nodes.len() {
            let guards: Vec<usize> = self.nodes[node].guards.keys().copied().collect();
            for e in guards {
                self.close_guard(end, node, e);
            }
            self.retire(node);
        }
        if self.s.fair_share {
            self.report.fairness_convergence = Some(dur(self.last_over.map_or(0, |t| t - self.faults_end)));
        }
        if self.report.violation.is_some() {
            return;
        }
        let deadline = self.faults_end.saturating_add(nanos(self.net.timeline.liveness_bound));
        // With a fair share, a term shed after the faults (the share's own
        // hand-over, until the shares have evened out) leaves its election
        // unled until a member under its share looks: a gap of at most
        // this. Without one, no gap at all.
        let gap = if self.s.fair_share { nanos(self.s.handover_bound()) } else { 0 };
        let mut worst = 0;
        for e in 0..self.elecs.len() {
            let stretches = stretches(std::mem::take(&mut self.elecs[e].intervals));
            // From the bound to the end of the run, every stretch without a
            // leader (the one the bound falls in included) no longer than a
            // hand-over's, and someone leading at the end.
            let first = stretches.iter().position(|&(_, x)| x >= deadline);
            let mut ok = first.is_some() && stretches.last().is_some_and(|l| l.1 >= end);
            let mut longest_gap = 0;
            if let Some(i) = first {
                if stretches[i].0 > deadline {
                    // Unled at the bound: since the stretch before ended.
                    let g = match i.checked_sub(1) {
                        Some(p) => stretches[i].0 - stretches[p].1,
                        None => u64::MAX,
                    };
                    longest_gap = longest_gap.max(g);
                    ok &= g <= gap;
                }
                for w in stretches[i..].windows(2) {
                    let g = w[1].0 - w[0].1;
                    longest_gap = longest_gap.max(g);
                    ok &= g <= gap;
                }
            }
            if ok {
                // The recovery: how long after the faults the stretch in
                // force at the bound began (an election in a hand-over at
                // the bound is not a recovery; its gap was checked above).
                let i = first.expect("checked");
                if stretches[i].0 <= deadline {
                    worst = worst.max(stretches[i].0.saturating_sub(self.faults_end));
                }
                continue;
            }
            let shown: Vec<String> = stretches
                .iter()
                .filter(|(_, x)| *x >= self.faults_end)
                .take(6)
                .map(|(s, x)| format!("{:?}..{:?}", dur(*s), dur(*x)))
                .collect();
            let detail = format!(
                "{}; longest gap after the bound {:?} (allowed {:?}); stretches of leadership since the faults: {}",
                self.net.timeline.missed(end),
                if longest_gap == u64::MAX { Duration::MAX } else { dur(longest_gap) },
                dur(gap),
                if shown.is_empty() { "none".to_owned() } else { shown.join(", ") }
            );
            self.violate(end, Property::EveryElectionLed, Some(e), detail);
            return;
        }
        self.net.timeline.recovery = Some(dur(worst));
    }

    fn no_progress(&mut self, t: u64, detail: String) {
        self.violate(t, Property::MachineMakesProgress, None, detail);
    }

    fn own(&mut self, t: u64, ev: Own) {
        match ev {
            Own::Reply { node, id, answer } => self.deliver(t, node, id, answer),
            Own::Replay { node, calls, out } => self.replay(t, node, calls, out),
            Own::WorkerFree { node } => {
                if self.nodes[node].gm.is_some() && !self.nodes[node].queued.is_empty() {
                    self.start_queued(t, node);
                    self.after(t, node);
                }
            }
            Own::Rejoin { node, elections } => self.rejoin(t, node, &elections),
            Own::Leave(i) => self.leave_held(t, i),
            Own::Land { node } => self.land(t, node),
            Own::CheckBacked { election, node, term } => {
                if self.nodes[node].guards.get(&election).is_some_and(|g| g.term == term)
                    && self.valid(node, election, t)
                {
                    self.check_backed(t, node, election);
                }
            }
            Own::CheckFairness => {
                for node in 0..self.nodes.len() {
                    self.check_fair(t, node);
                }
            }
            Own::Wake { node, elections } => self.woken_by_feed(t, node, &elections),
        }
    }

    fn spawn(&mut self, t: u64, host: usize) {
        let s = self.s;
        let hs = &mut self.net.states[host];
        hs.processes += 1;
        let identity = format!("p{host}.{}#{:016x}", hs.processes, self.net.rng.next_u64());
        let member = if s.variant == GroupVariant::SharedMemberName { "member".to_owned() } else { identity.clone() };
        let h = &s.participants[host];
        let mut cfg = GroupMachineConfig::new(identity.clone(), GROUP, s.timing, self.net.rng.next_u64());
        cfg.fair_share = s.fair_share && s.variant != GroupVariant::FairShareOff;
        cfg.tick = s.tick;
        cfg.phase = h.phase;
        cfg.release_on_shutdown = h.release_on_shutdown;
        cfg.unsafe_anchor_at_reply = s.variant == GroupVariant::AnchorAtReply;
        cfg.unsafe_lead_on_wake = s.variant == GroupVariant::LeadsOnWake;
        // A third of the schedules (by their seed, so the byte format keeps
        // its meaning) split renewals from two terms: two renewal batches
        // per interval, the heartbeat riding on one of them.
        if s.seed.is_multiple_of(3) {
            cfg.split_renewals_from = 2;
        }
        let node = self.nodes.len();
        self.net.note(t, 1, node as u64, host as u64, || format!("n{node} starts as {identity} on host {host}"));
        self.nodes.push(Node {
            host,
            identity,
            member,
            payload: Arc::from(vec![host as u8]),
            gm: Some(GroupMachine::new(cfg)),
            stopping: false,
            keys: HashMap::new(),
            by_election: vec![None; s.elections],
            guards: BTreeMap::new(),
            timer: Timer::default(),
            shutdown_at: None,
            leaving_since: HashMap::new(),
            rejoin_pending: vec![false; s.elections],
            hold_renewals: (0, 0),
            sent_at: HashMap::new(),
            workers: Vec::new(),
            queued: std::collections::VecDeque::new(),
        });
        self.net.states[host].current = Some(node);
        self.report.processes += 1;
        if t > nanos(s.timing.lease_duration) {
            self.report.counts.late_joins += 1;
        }
        for e in 0..s.elections {
            self.join(t, node, e);
        }
        self.after(t, node);
    }

    /// The database runs one call at real instant `t` on its own clock.
    fn apply(&mut self, t: u64, node: usize, call: GroupCall) {
        self.net.advance_db(t);
        self.report.counts.applied += 1;
        let host = self.nodes[node].host;
        let identity = self.nodes[node].identity.clone();
        let op_timeout = self.s.timing.operation_timeout;
        let id = call.id();
        let answer = match &call {
            GroupCall::Batch(b) => {
                // A heartbeat that goes with the batch is the member's, by
                // its member name (as a call of its own), then the batch.
                let members = b.heartbeat.map(|h| {
                    let r = self.net.store.heartbeat(GROUP, &self.nodes[node].member, h.leading, h.ttl, op_timeout);
                    self.net
                        .note(t, 21, node as u64, h.id.0, || format!("db applies n{node} heartbeat {}: {r:?}", h.id.0));
                    self.report.counts.member_calls += 1;
                    self.report.counts.beats_with_renewals += 1;
                    (h.id, r)
                });
                let bare = Batch { heartbeat: None, ..b.clone() };
                let (out, _) = bare.run(&self.net.store, GROUP, &identity, op_timeout);
                self.net.note(t, 20, node as u64, id.0, || {
                    let ok = out
                        .iter()
                        .filter(|o| {
                            matches!(o, Outcome::Lease(Ok(l)) if l.holder == identity)
                                || matches!(o, Outcome::Released(Ok(())))
                        })
                        .count();
                    format!(
                        "db applies n{node} batch {}: {} of {}, {ok} held by it or released",
                        id.0,
                        op_name(b.op),
                        out.len()
                    )
                });
                if b.op != BatchOp::Inspect {
                    self.batch_applied(t, node, b.op, b.entries.iter().map(|e| &*e.name), &out);
                }
                Answer::Batch(out, members)
            }
            GroupCall::Heartbeat { ttl, leading, .. } => {
                let r = self.net.store.heartbeat(GROUP, &self.nodes[node].member, *leading, *ttl, op_timeout);
                self.net.note(t, 21, node as u64, id.0, || format!("db applies n{node} heartbeat {}: {r:?}", id.0));
                Answer::Members(r)
            }
            GroupCall::Leave { .. } => {
                let r = self
                    .net
                    .store
                    .leave_group(GROUP, &self.nodes[node].member, op_timeout)
                    .map(|()| Members::new(0, self.net.store.now()));
                self.net.note(t, 21, node as u64, id.0, || format!("db applies n{node} leave {}: {r:?}", id.0));
                Answer::Members(r)
            }
        };
        self.tell_releases(t, node);
        self.net.transmit(t, node, host, id.0, true, Ev::Own(Own::Reply { node, id, answer }));
    }

    fn fault_start(&mut self, t: u64, i: usize) {
        let fault = self.s.faults[i].fault;
        if let Some((target, length, window)) = fault.window() {
            let host = target.map_or(usize::MAX, |target| self.resolve(t, target));
            self.net.open(t, (i, fault), host, length, window);
            return;
        }
        match fault {
            GroupFault::Kill { target, down, permanent } => {
                let host = self.resolve(t, target);
                self.kill(t, i, host, down, permanent);
            }
            GroupFault::Shutdown { target, down, permanent } => {
                let host = self.resolve(t, target);
                self.shutdown(t, i, host, down, permanent);
            }
            GroupFault::LeaveRejoin { target, first, count, release, after, stuck } => {
                let host = self.resolve(t, target);
                if stuck == 0 {
                    self.leave_some(t, i, host, first, count, release, after);
                } else if let Some(node) = self.running(host) {
                    self.net.note(t, 30, i as u64, host as u64, || {
                        format!("fault {i}: n{node} holds its next {stuck} renewal batches in transit, then leaves")
                    });
                    self.nodes[node].hold_renewals = (stuck, i);
                    self.deferred_leaves.insert(i);
                    // If the renewals do not all go (it leads nothing), the
                    // leave goes anyway.
                    let timing = self.s.timing;
                    let most = (timing.renew_interval + timing.operation_timeout) * stuck as u32;
                    let wait = self.net.real_span(host, most);
                    self.net.push_own(t + wait, Own::Leave(i));
                }
            }
            GroupFault::Resign { target, count } => {
                let host = self.resolve(t, target);
                self.resign_some(t, i, host, count);
            }
            _ => unreachable!("a window: {fault:?}"),
        }
    }
}

/// The one-line command that replays `schedule`.
pub fn group_replay_command(schedule: &GroupSchedule) -> String {
    format!(
        "SIM_GROUP_BYTES={} SIM_GROUP_VARIANT={} cargo test -p leaderelection-sim --test sim_group replay -- --nocapture",
        super::schedule::to_hex(&schedule.bytes),
        schedule.variant.name()
    )
}

/// A failed run, described for a person: the violation, the schedule, the
/// replay command and the end of the trace.
pub fn describe_group_failure(seed: Option<u64>, schedule: &GroupSchedule) -> String {
    let report = run_group(schedule, true);
    let violation = report.violation.as_ref().map(|v| format!("sim-group: {v}"));
    crate::describe(violation, seed, &schedule.bytes, schedule, &report.timeline.trace, &group_replay_command(schedule))
}

/// Totals over many group runs.
#[derive(Clone, Debug, Default)]
pub struct GroupExploration {
    /// Schedules run.
    pub schedules: u64,
    /// Of those, with a fair share.
    pub fair_schedules: u64,
    /// Events processed, summed.
    pub events: u64,
    /// Elections driven (per schedule, its elections times its processes),
    /// summed.
    pub elections_driven: u64,
    /// The runs' counts, summed.
    pub counts: GroupCounts,
    /// Requests and replies lost, summed.
    pub lost: u64,
    /// Fair-share schedules in which some term was shed.
    pub schedules_shedding: u64,
    /// The slowest recovery after the faults, and the bound it was held to.
    pub worst_recovery: (Duration, Duration),
    /// The latest a participant led beyond its share after the faults, and
    /// the allowance it was held to.
    pub worst_fairness: (Duration, Duration),
    /// Virtual time of all runs, summed.
    pub total_virtual: Duration,
    /// Releases, wakes and hand-overs after releases (per election), in
    /// the schedules whose participants had the release feed
    /// ([`GroupSchedule::wakes`]).
    pub with_wakes: ReleaseTotals,
    /// The same in the schedules without it.
    pub without_wakes: ReleaseTotals,
    /// The seeds whose runs found a violation, with it.
    pub failures: Vec<(u64, GroupViolation)>,
    /// Wall-clock time spent.
    pub elapsed: Duration,
}

impl GroupExploration {
    /// Adds one run.
    pub fn add(&mut self, seed: u64, r: &GroupRunReport) {
        self.merge(GroupExploration::of(seed, r));
    }

    /// The totals of one run.
    fn of(seed: u64, r: &GroupRunReport) -> GroupExploration {
        let (with_wakes, without_wakes) = ReleaseTotals::by_feed(&r.releases);
        GroupExploration {
            schedules: 1,
            fair_schedules: u64::from(r.fair_share),
            events: r.timeline.events,
            elections_driven: (r.elections * r.processes) as u64,
            counts: r.counts,
            lost: r.timeline.lost(),
            schedules_shedding: u64::from(r.fair_share && r.counts.shed > 0),
            worst_recovery: r.timeline.recovery_of_bound(),
            worst_fairness: r.fairness_convergence.map_or_else(Default::default, |c| (c, r.fairness_allowance)),
            total_virtual: r.timeline.virtual_time,
            with_wakes,
            without_wakes,
            failures: r.violation.iter().map(|v| (seed, v.clone())).collect(),
            elapsed: Duration::ZERO,
        }
    }

    fn merge(&mut self, o: GroupExploration) {
        merge_totals!(self, o: GroupExploration {
            sum: schedules, fair_schedules, events, elections_driven, counts, lost, schedules_shedding, total_virtual,
                with_wakes, without_wakes;
            max: ;
            worst: worst_recovery, worst_fairness,
        });
    }

    /// One line for the test log.
    pub fn summary(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let c = &self.counts;
        format!(
            "sim-group: explored {} schedules ({:.1}/s, {} with a fair share), {:.2} M events, {} elections driven, \
             {} terms, {} hand-overs; {} batches carrying {} calls (largest {}, largest renewal {}), {} heartbeats with renewals; {} messages \
             lost, {} late answers, {} calls waited for a worker ({} waited out the timeout); {} kills ({} for good), {} clean shutdowns, {} late joins, {} elections left \
             and {} joined again ({} renewals landed after a leave), {} resignations, {} terms shed (in {} schedules); slowest recovery {:?} of bound \
             {:?}; latest fairness convergence {:?} of allowance {:?}; {:.0} h virtual; {}; {}; {} failing",
            self.schedules,
            self.schedules as f64 / secs,
            self.fair_schedules,
            self.events as f64 / 1e6,
            self.elections_driven,
            c.terms,
            c.handovers,
            c.batches,
            c.batch_entries,
            c.max_batch_entries,
            c.max_renew_entries,
            c.beats_with_renewals,
            self.lost,
            c.late_replies,
            c.queued_calls,
            c.refused_calls,
            c.kills,
            c.permanent_kills,
            c.shutdowns,
            c.late_joins,
            c.leaves,
            c.rejoins,
            c.landed_late,
            c.resigns,
            c.shed,
            self.schedules_shedding,
            self.worst_recovery.0,
            self.worst_recovery.1,
            self.worst_fairness.0,
            self.worst_fairness.1,
            self.total_virtual.as_secs_f64() / 3600.0,
            self.with_wakes.summary("with wakes on release"),
            self.without_wakes.summary("without"),
            self.failures.len()
        )
    }
}

/// Runs the group schedules of seeds `first..first + count` under
/// `variant` on `threads` threads. Each run is deterministic; only the
/// order of the failures list depends on the threads.
pub fn explore_groups(first: u64, count: u64, variant: GroupVariant, threads: usize) -> GroupExploration {
    let started = std::time::Instant::now();
    let mut total = crate::over_seeds(
        first,
        count,
        threads,
        |seed, e: &mut GroupExploration| {
            e.add(seed, &run_group(&GroupSchedule::from_seed(seed, variant), false));
        },
        GroupExploration::merge,
    );
    total.failures.sort_by_key(|(seed, _)| *seed);
    total.elapsed = started.elapsed();
    total
}
