//! The fleet on virtual time, and the oracle that watches every step.

use crate::events::{dur, nanos};
use crate::fleet::{outputs_disagree, stretches, Fleet, Net, Process, ReleaseStats, Timeline, Timer, Windowed};
use std::fmt;
use std::time::Duration;

use super::schedule::{Fault, Schedule, Target, Variant, OPERATOR_CLOCK_WAIT, PPM};
use leaderelection::machine::{Call, CallId, LocalTime, Machine, MachineConfig, Op, Outcome, Output, TermId};
use leaderelection::{Lease, StoreError};
use leaderelection::{MemStore, Store};

/// The election every simulated participant runs.
pub const ELECTION: &str = "sim";

/// Where the database clock starts, in microseconds since the Unix epoch:
/// 2023-11-14 plus three days. Local clocks read days of uptime instead, so
/// any mixing of the two clocks would show at once.
pub const DB_BASE_MICROS: i64 = 1_700_000_000_000_000 + 3 * 86_400_000_000;

/// Runaway guard: no schedule the decoder produces comes near it.
const MAX_EVENTS: u64 = 20_000_000;

/// A property the oracles check, named as the design states it: one list
/// for both worlds. A single-election run ([`crate::run`]) checks all but
/// the three marked *group runs*; a group run ([`crate::run_group`]) checks
/// each shared property for every election of the group, and all but the
/// three marked *single-election runs*.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Property {
    /// always: at most one participant holds a valid guard (of an election)
    /// at any instant of real time. After an operator fault, guards granted before it are
    /// exempt (they are counted as operator overlaps and held to
    /// [`Property::OperatorOverlapBounded`]); with no operator fault in the
    /// schedule, no guard is exempt.
    AtMostOneValidGuard,
    /// always (single-election runs): a guard granted before an operator
    /// fault stays valid no longer than the deadline it was granted before
    /// the fault, at most one lease after the fault.
    OperatorOverlapBounded,
    /// always: every fence the database issues is above every fence it issued
    /// before (across deleted, restored and re-created rows too), each term
    /// starts under a fence issued to its participant and never used by
    /// another term, and a term granted since the last operator fault has a
    /// fence above every term started before it. In a group run, per
    /// election: each term starts under a fence issued to its participant
    /// for that election, and an election's terms start in fence order.
    FencesIncrease,
    /// always: the fence on the record never goes backwards.
    StoreFenceMonotonic,
    /// always: while a guard is valid the record names its holder and fence
    /// and has not expired on the database clock.
    GuardBackedByRecord,
    /// always: a guard that turned invalid never turns valid again.
    GuardNeverRevives,
    /// always: the machine's outputs agree with its own view of its term. In
    /// a group run: the driver's record of each election's term agrees with
    /// the machine's, and the group never hands a machine's call out as an
    /// event.
    OutputsMatchMachine,
    /// always: the machine's timers move forward (no busy loop).
    MachineMakesProgress,
    /// always (single-election runs): a clean shutdown finishes within two
    /// operation timeouts (on the slowest clock), whatever the database does.
    ShutdownCompletes,
    /// eventually (single-election runs): within the liveness bound after
    /// the last fault somebody leads, and keeps leading to the end of the
    /// run.
    SomeoneLeadsAfterFaults,
    /// always (group runs): an election's leave finishes within two
    /// operation timeouts and two ticks, a participant's clean shutdown
    /// within three (on the slowest clock), whatever the database does.
    StopCompletes,
    /// eventually (group runs): within the liveness bound after the faults
    /// end every election is led, and stays led to the end of the run.
    EveryElectionLed,
    /// always, with a fair share (group runs), from the fairness allowance
    /// after the faults end: no live participant holds more than
    /// `ceil(elections / live participants)` valid guards.
    FairShare,
}

impl Property {
    /// Whether it is a safety property (as opposed to liveness or fairness).
    pub fn is_safety(self) -> bool {
        !matches!(
            self,
            Property::SomeoneLeadsAfterFaults
                | Property::EveryElectionLed
                | Property::FairShare
                | Property::MachineMakesProgress
                | Property::ShutdownCompletes
                | Property::StopCompletes
        )
    }

    /// Its name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            Property::AtMostOneValidGuard => "always: at most one valid guard per election",
            Property::OperatorOverlapBounded => "always: an operator fault's overlap ends within a lease",
            Property::FencesIncrease => "always: fences strictly increase per election",
            Property::StoreFenceMonotonic => "always: the record's fence never goes backwards",
            Property::GuardBackedByRecord => "always: a valid guard is backed by the record",
            Property::GuardNeverRevives => "always: an invalid guard stays invalid",
            Property::OutputsMatchMachine => "always: outputs match the machines' terms",
            Property::MachineMakesProgress => "always: timers make progress",
            Property::ShutdownCompletes => "always: shutdown completes within two operation timeouts",
            Property::SomeoneLeadsAfterFaults => "eventually: someone leads after the faults",
            Property::StopCompletes => "always: leaves and shutdowns complete in time",
            Property::EveryElectionLed => "eventually: every election is led after the faults",
            Property::FairShare => "eventually always: nobody leads beyond its fair share",
        }
    }
}

/// A property that failed, when, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which property.
    pub property: Property,
    /// Virtual time since the start of the run.
    pub at: Duration,
    /// What the oracle saw.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violated at {:?}: {}", self.property.name(), self.at, self.detail)
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// The first property that failed, if any (the run stops there).
    pub violation: Option<Violation>,
    /// Events, lost messages, times and the trace.
    pub timeline: Timeline,
    /// Store calls started by the machines.
    pub calls: u64,
    /// Calls applied by the database.
    pub applied: u64,
    /// Calls the machines abandoned at the operation timeout.
    pub abandoned: u64,
    /// Replies delivered to a call already abandoned.
    pub late_replies: u64,
    /// Terms started.
    pub terms: u64,
    /// Processes run (first starts and restarts).
    pub processes: usize,
    /// Hosts in the fleet.
    pub hosts: usize,
    /// Operator faults applied: rows deleted, older rows restored, tables
    /// cleared.
    pub deletes: u64,
    /// See [`RunReport::deletes`].
    pub restores: u64,
    /// See [`RunReport::deletes`].
    pub clears: u64,
    /// Failovers to a lagging replica ([`Fault::Failover`]).
    pub failovers: u64,
    /// Of those, how many found the replica's copy of the row older than
    /// the row on the old server (so acknowledged writes were lost).
    pub failovers_lost_writes: u64,
    /// Of those, how many brought back a copy older than an operator fault,
    /// and were judged as part of it.
    pub failovers_across_operator_faults: u64,
    /// Operator faults applied while somebody held a valid guard.
    pub operator_faults_under_leader: u64,
    /// Operator faults that waited for the database clock to pass the last
    /// fence issued.
    pub operator_faults_deferred: u64,
    /// Guards granted before an operator fault that were valid while another
    /// guard was: each such overlap is allowed, counted here, and bounded.
    pub operator_overlaps: u64,
    /// The longest of those overlaps (real time).
    pub longest_operator_overlap: Duration,
    /// Terms that started under a grant made before an operator fault (the
    /// reply arrived after it).
    pub terms_granted_before_operator_fault: u64,
    /// Fences issued by the database.
    pub fences_issued: u64,
    /// The release feed: releases, wakes ([`Schedule::wakes`]) and the
    /// hand-overs after releases.
    pub releases: ReleaseStats,
}

/// The events of one election's world besides those of every world.
enum Own {
    /// `epoch`: the operator epoch in which the database applied the call.
    Reply {
        node: usize,
        id: CallId,
        outcome: Outcome,
        epoch: u32,
    },
    /// Copies the record for a later [`Fault::RestoreRow`].
    Snapshot(usize),
    GuardsDropped {
        node: usize,
    },
    /// The release feed's wake reaches `node`, with the released fence.
    Wake {
        node: usize,
        fence: Option<u64>,
    },
}

type Ev = crate::fleet::Ev<Call, Own>;

type Guard = crate::fleet::Guard<Grant>;

/// What one election's guard adds.
#[derive(Clone, Copy, Debug)]
struct Grant {
    /// The operator epoch in which the database applied the call that granted
    /// the current deadline: below the world's epoch, an operator fault came
    /// after the grant, and the guard is exempt from the one-guard rule.
    epoch: u32,
    /// When it was first seen valid beside another valid guard.
    overlap_from: Option<u64>,
}

struct Node {
    host: usize,
    identity: String,
    machine: Option<Machine>,
    timer: Timer,
    guard: Option<Guard>,
    /// When a clean shutdown began.
    shutdown_at: Option<u64>,
}

struct World<'a> {
    s: &'a Schedule,
    net: Net<'a, Call, Own>,
    nodes: Vec<Node>,
    leading: Vec<usize>,
    max_fence: u64,
    store_fence: u64,
    /// Terms, as (start, end) in real time.
    intervals: Vec<(u64, u64)>,
    report: RunReport,
    /// Operator epoch: how many operator faults have been applied.
    epoch: u32,
    /// When each operator fault was applied (the end of epoch `i`).
    epoch_ends: Vec<u64>,
    /// The epoch of the reply being handled, while its outputs are drained.
    reply_epoch: Option<u32>,
    /// The record's fence after the last change (`None`: no row).
    record_fence: Option<u64>,
    /// The highest fence the database has issued, and the database clock (µs
    /// since the run began) when it issued the last one.
    max_issued: u64,
    last_issue_micros: Option<u64>,
    /// Fences issued: (fence, node it went to, whether a term started with it).
    issued: Vec<(u64, usize, bool)>,
    /// Copies of the record for restores, by fault index (`None`: no row).
    snapshots: Vec<Option<Lease>>,
    /// When the last failover happened.
    last_failover: Option<u64>,
    /// The store's release feed: watched in every run, passed on to the
    /// participants with [`Schedule::wakes`].
    feed: Option<crossbeam_channel::Receiver<leaderelection::Released>>,
    /// When the database applied the last release the feed reported, until
    /// the next term starts (the hand-over it measures).
    released_at: Option<u64>,
}

/// Runs `schedule` to its end, or to the first violation. With `trace`, the
/// report carries every event as text (slower).
pub fn run(schedule: &Schedule, trace: bool) -> RunReport {
    let mut w = World {
        s: schedule,
        net: Net::new(schedule.seed, &schedule.hosts, trace),
        nodes: Vec::new(),
        leading: Vec::new(),
        max_fence: 0,
        store_fence: 0,
        intervals: Vec::new(),
        report: RunReport { hosts: schedule.hosts.len(), ..RunReport::default() },
        epoch: 0,
        epoch_ends: Vec::new(),
        reply_epoch: None,
        record_fence: None,
        max_issued: 0,
        last_issue_micros: None,
        issued: Vec::new(),
        snapshots: vec![None; schedule.faults.len()],
        last_failover: None,
        feed: None,
        released_at: None,
    };
    // Subscribed before any call, as a driver does when it starts.
    w.feed = w.net.store.releases();
    w.net.store.set_claims_inherited_rows(schedule.variant == Variant::ClaimsInheritedRows);
    w.report.releases.feed = schedule.wakes.is_some();
    w.net.timeline.faults_end = schedule.faults_end();
    w.net.timeline.liveness_bound = schedule.liveness_bound();
    w.net.start_hosts();
    for (i, f) in schedule.faults.iter().enumerate() {
        if let Fault::RestoreRow { lag } | Fault::Failover { lag } = f.fault {
            if lag <= f.at {
                w.net.push(nanos(f.at - lag), Ev::Own(Own::Snapshot(i)));
            }
        }
        w.net.push(nanos(f.at), Ev::FaultStart(i));
    }
    let end = nanos(schedule.faults_end() + schedule.liveness_bound() + schedule.timing.lease_duration * 2);
    RunReport { timeline: w.run_to(end, MAX_EVENTS), ..w.report }
}

impl World<'_> {
    fn violate(&mut self, t: u64, property: Property, detail: String) {
        if self.report.violation.is_none() {
            self.net.note(t, 99, 0, 0, || format!("VIOLATION {}: {detail}", property.name()));
            self.report.violation = Some(Violation { property, at: dur(t), detail });
        }
    }

    // ---- the guard, as production models it ----

    fn watchdog(&self) -> bool {
        self.s.variant != Variant::NoWatchdog
    }

    /// `LeaderGuard::is_valid` at real instant `t`: the term is live and the
    /// local clock, re-read now, is before its deadline. The no-watchdog
    /// control trusts the term alone.
    fn valid(&self, node: usize, t: u64) -> bool {
        let n = &self.nodes[node];
        n.guard.is_some_and(|g| !self.watchdog() || self.net.local(n.host, t) < g.deadline)
    }

    /// When a guard stopped (or will stop) being valid by its deadline.
    fn guard_expiry(&self, node: usize, g: &Guard) -> u64 {
        if self.watchdog() {
            self.net.real_at(self.nodes[node].host, g.deadline)
        } else {
            u64::MAX
        }
    }

    fn close_guard(&mut self, t: u64, node: usize) {
        if let Some(g) = self.nodes[node].guard.take() {
            let end = t.min(self.guard_expiry(node, &g)).max(g.start);
            self.intervals.push((g.start, end));
            self.leading.retain(|&n| n != node);
            if let Some(from) = g.more.overlap_from {
                let overlap = dur(end.saturating_sub(from));
                self.report.longest_operator_overlap = self.report.longest_operator_overlap.max(overlap);
            }
            self.check_orphan_bound(t, node, &g, end);
        }
    }

    /// A guard granted before an operator fault is valid at most until the
    /// deadline it already had, which ends within one lease of the fault
    /// (its grant was applied before the fault, and a clock at the slowest
    /// safe rate reads `lease - margin` within `lease`).
    fn check_orphan_bound(&mut self, t: u64, node: usize, g: &Guard, valid_until: u64) {
        let Some(at) = self.orphaned_at(g) else { return };
        if !self.watchdog() {
            return;
        }
        let bound = at.saturating_add(nanos(self.s.timing.lease_duration));
        if valid_until > bound {
            let detail = format!(
                "{} (fence {}) was granted before the operator fault at {:?} and stayed valid until {:?}",
                self.nodes[node].identity,
                g.fence,
                dur(at),
                dur(valid_until)
            );
            self.violate(t, Property::OperatorOverlapBounded, detail);
        }
    }

    // ---- events ----

    /// Hands the machine of `node` one input at real instant `t`, then carries
    /// out its outputs and re-arms its timer, as the elector's loop does.
    fn with_node(&mut self, t: u64, node: usize, f: impl FnOnce(&mut Machine, LocalTime)) {
        let host = self.nodes[node].host;
        let now = self.net.local(host, t);
        let Some(m) = self.nodes[node].machine.as_mut() else { return };
        f(m, now);
        self.drain(t, node);
        self.check_outputs(t, node);
        self.rearm(t, node);
    }

    fn drain(&mut self, t: u64, node: usize) {
        let mut stopped = false;
        while let Some(out) = self.nodes[node].machine.as_mut().and_then(Machine::poll_output) {
            self.net.note_output(t, node, None, &out);
            match out {
                Output::Call(call) => {
                    self.report.calls += 1;
                    self.net
                        .note(t, 10, node as u64, call.id.0, || format!("n{node} call {}: {:?}", call.id.0, call.op));
                    self.send(t, node, call);
                }
                Output::CallAbandoned(_) => self.report.abandoned += 1,
                Output::TermStarted { term, fence, deadline } => {
                    self.report.terms += 1;
                    self.term_started(t, node, term, fence, deadline);
                }
                Output::DeadlineExtended { term, deadline } => self.deadline_extended(t, node, term, deadline),
                Output::TermEnded { term, .. } => {
                    if self.nodes[node].guard.is_some_and(|g| g.term == term) {
                        self.close_guard(t, node);
                        self.hold_guards(t, node);
                    } else {
                        let ident = self.nodes[node].identity.clone();
                        self.violate(t, Property::OutputsMatchMachine, format!("{ident} ended {term:?}, not live"));
                    }
                }
                Output::NewLeader { .. } | Output::Released { .. } | Output::Failed(_) => {}
                Output::Stopped => stopped = true,
            }
        }
        if stopped {
            if let Some(since) = self.nodes[node].shutdown_at {
                self.check_shutdown_time(t, node, since);
            }
            self.close_guard(t, node);
            self.nodes[node].machine = None;
            self.nodes[node].timer.at = None;
        }
    }

    /// A program that keeps the guards of an ended term a while: the elector
    /// holds the machine back until the last one is dropped.
    fn hold_guards(&mut self, t: u64, node: usize) {
        let host = self.nodes[node].host;
        let hold = self.s.hosts[host].guard_hold;
        if hold.is_zero() {
            return;
        }
        let now = self.net.local(host, t);
        if let Some(m) = self.nodes[node].machine.as_mut() {
            m.set_hold_back(now, true);
        }
        let real = u64::try_from(hold.as_nanos() * u128::from(PPM) / u128::from(self.s.hosts[host].rate_ppm))
            .unwrap_or(u64::MAX);
        self.net.push(t.saturating_add(real), Ev::Own(Own::GuardsDropped { node }));
    }

    fn rearm(&mut self, t: u64, node: usize) {
        let n = &self.nodes[node];
        let Some(m) = n.machine.as_ref() else { return };
        // The no-watchdog driver is blocked inside the store call: nothing
        // fires until the call returns.
        if !self.watchdog() && m.call_in_flight().is_some() {
            self.nodes[node].timer.at = None;
            return;
        }
        let (host, at) = (n.host, m.poll_timeout());
        self.net.arm(t, node, host, &mut self.nodes[node].timer, at);
    }

    fn send(&mut self, t: u64, node: usize, call: Call) {
        let host = self.nodes[node].host;
        self.net.transmit(t, node, host, call.id.0, false, Ev::Request { node, call });
    }

    /// The release feed, after the database applied a call of `from`: a
    /// release it reports (one that ended a live term) starts the
    /// hand-over's clock and, with [`Schedule::wakes`], wakes the running
    /// process of every other host, each over its own link, as a driver
    /// subscribed to the store's feed is woken.
    fn tell_releases(&mut self, t: u64, from: usize) {
        let Some(rx) = &self.feed else { return };
        let released: Vec<Option<u64>> = rx.try_iter().filter(|r| r.name == ELECTION).map(|r| r.fence).collect();
        if released.is_empty() {
            return;
        }
        self.report.releases.releases += released.len() as u64;
        self.released_at = Some(t);
        self.net.note(t, 40, from as u64, 0, || format!("the feed reports n{from}'s release"));
        let Some(feed) = self.s.wakes else { return };
        let from_host = self.nodes[from].host;
        for host in (0..self.net.states.len()).filter(|&h| h != from_host) {
            let Some(node) = self.net.states[host].current.filter(|&n| self.nodes[n].machine.is_some()) else {
                continue;
            };
            for &fence in &released {
                let again_within = self.s.timing.retry_period;
                for at in self.net.send_wake(t, (node, host), feed, again_within, &mut self.report.releases) {
                    self.net.push_own(at, Own::Wake { node, fence });
                }
            }
        }
    }

    // ---- faults ----

    fn resolve(&self, t: u64, target: Target) -> usize {
        match target {
            Target::Host(h) => h,
            Target::Leader => self.leading.iter().find(|&&n| self.valid(n, t)).map_or(0, |&n| self.nodes[n].host),
        }
    }

    /// An operator's or a failover's change to the record. It waits until the
    /// database clock reads [`OPERATOR_CLOCK_WAIT`] past the last fence
    /// issued (the clock caveat of the fence rule, as the acceptance suite
    /// waits), then opens a new operator epoch: every grant made before it
    /// is exempt from the one-guard rule from now on.
    /// The database fails over to a replica lagging by the fault's `lag`:
    /// its copy of the row (taken then) replaces the current one, under a
    /// new server history. Judged by the oracle as it is: no guard is
    /// exempt. The record's own fence may go back with the lost writes, so
    /// the check that it never does starts again from the replica's copy.
    fn failover(&mut self, t: u64, i: usize) {
        self.net.advance_db(t);
        let before = self.net.store.peek(ELECTION);
        let copy = self.snapshots[i].clone();
        self.report.failovers += 1;
        self.last_failover = Some(t);
        let lost = copy
            .as_ref()
            .zip(before.as_ref())
            .is_some_and(|(c, b)| (c.fence, c.renewed_at, c.expires_at) != (b.fence, b.renewed_at, b.expires_at));
        self.report.failovers_lost_writes += u64::from(lost);
        self.net.store.fail_over(copy.as_ref());
        let after = self.net.store.peek(ELECTION);
        self.net.note(t, 36, i as u64, after.as_ref().map_or(0, |r| r.fence), || {
            format!(
                "fault {i}: FAILOVER to a replica: record {} -> {}",
                before.as_ref().map_or("no row".into(), show_lease),
                after.as_ref().map_or("no row".into(), show_lease)
            )
        });
        self.record_fence = after.as_ref().map(|r| r.fence);
        if let Some(f) = self.record_fence {
            self.store_fence = f;
        }
        // A replica whose copy predates an operator's change brings the
        // operator's doing back with it (a leader whose row the operator
        // deleted finds it again, unexpired, and renews it): that is judged
        // as the operator fault it extends, by the relaxed rule.
        let copied_at = t.saturating_sub(nanos(self.s.faults[i].fault.lag()));
        if self.epoch_ends.last().is_some_and(|&op| op > copied_at) {
            self.report.failovers_across_operator_faults += 1;
            self.epoch += 1;
            self.epoch_ends.push(t);
        }
    }

    fn operator_fault(&mut self, t: u64, i: usize) {
        self.net.advance_db(t);
        if let Some(last) = self.last_issue_micros.filter(|_| self.s.variant != Variant::NoOperatorClockWait) {
            let ready = last + OPERATOR_CLOCK_WAIT.as_micros() as u64;
            if self.net.db_micros < ready {
                self.report.operator_faults_deferred += 1;
                self.net.note(t, 34, i as u64, ready, || format!("fault {i} waits for the database clock"));
                self.net.push(ready * 1000, Ev::FaultStart(i));
                return;
            }
        }
        let fault = self.s.faults[i].fault;
        let before = self.net.store.peek(ELECTION);
        match fault {
            Fault::DeleteRow => {
                self.report.deletes += 1;
                self.net.store.delete_row(ELECTION);
            }
            Fault::ClearTable => {
                self.report.clears += 1;
                self.net.store.clear();
            }
            Fault::RestoreRow { .. } => {
                self.report.restores += 1;
                match &self.snapshots[i] {
                    Some(row) => self.net.store.restore_row(row),
                    None => {
                        self.net.store.delete_row(ELECTION);
                    }
                }
            }
            _ => unreachable!("not an operator fault: {fault:?}"),
        }
        let after = self.net.store.peek(ELECTION);
        let leader = self.leading.iter().any(|&n| self.valid(n, t));
        self.report.operator_faults_under_leader += u64::from(leader);
        self.net.note(t, 35, i as u64, after.as_ref().map_or(0, |r| r.fence), || {
            format!(
                "fault {i}: OPERATOR {fault:?}{}: record {} -> {}",
                if leader { " under a live leader" } else { "" },
                before.as_ref().map_or("no row".into(), show_lease),
                after.as_ref().map_or("no row".into(), show_lease)
            )
        });
        // The operator set the record's fence, maybe backwards: the check of
        // the record's own fence starts again from here; the check of the
        // fences issued does not.
        self.record_fence = after.as_ref().map(|r| r.fence);
        if let Some(f) = self.record_fence {
            self.store_fence = f;
        }
        self.epoch += 1;
        self.epoch_ends.push(t);
    }

    fn crash(&mut self, t: u64, host: usize, down: Duration) {
        let Some(node) = self.net.states[host].current else { return };
        if self.net.states[host].restart_pending || self.nodes[node].machine.is_none() {
            return;
        }
        // The process is gone: its guard with it, its lease left on the record.
        self.close_guard(t, node);
        self.nodes[node].machine = None;
        self.nodes[node].timer.at = None;
        self.restart_later(t, host, down);
    }

    fn shutdown(&mut self, t: u64, host: usize, down: Duration) {
        let Some(node) = self.net.states[host].current else { return };
        if self.net.states[host].restart_pending || self.nodes[node].machine.as_ref().is_none_or(Machine::is_stopping) {
            return;
        }
        self.nodes[node].shutdown_at = Some(t);
        self.with_node(t, node, |m, now| m.shutdown(now));
        self.restart_later(t, host, down);
    }

    // ---- the oracle ----

    /// The database issued `fence` for a new term, to `node`.
    fn fence_issued(&mut self, t: u64, node: usize, fence: u64) {
        self.report.fences_issued += 1;
        if fence <= self.max_issued {
            let detail = format!(
                "the database issued fence {fence} to {}, but it had issued fence {} before{}",
                self.nodes[node].identity,
                self.max_issued,
                if self.epoch > 0 { format!(" ({} operator faults so far)", self.epoch) } else { String::new() }
            );
            self.violate(t, Property::FencesIncrease, detail);
        }
        self.max_issued = self.max_issued.max(fence);
        self.last_issue_micros = Some(self.net.db_micros);
        self.issued.push((fence, node, false));
    }

    /// Whether `g` was granted before the last operator fault, and if so when
    /// the first operator fault after its grant came.
    fn orphaned_at(&self, g: &Guard) -> Option<u64> {
        (g.more.epoch < self.epoch).then(|| self.epoch_ends[g.more.epoch as usize])
    }

    fn term_started(&mut self, t: u64, node: usize, term: TermId, fence: u64, deadline: LocalTime) {
        let ident = self.nodes[node].identity.clone();
        if self.nodes[node].guard.is_some() {
            self.violate(t, Property::OutputsMatchMachine, format!("{ident} started {term:?} inside another term"));
            return;
        }
        let epoch = self.reply_epoch.unwrap_or(self.epoch);
        match self.issued.iter_mut().rev().find(|(f, _, _)| *f == fence) {
            Some((_, to, started)) if *to == node && !*started => *started = true,
            Some((_, to, _)) => {
                let detail = format!(
                    "{ident} started a term with fence {fence}, issued to {} and {}",
                    self.nodes[*to].identity,
                    if *to == node { "already led under" } else { "not to it" }
                );
                self.violate(t, Property::FencesIncrease, detail);
            }
            None => {
                let detail = format!("{ident} started a term with fence {fence}, which the database never issued");
                self.violate(t, Property::FencesIncrease, detail);
            }
        }
        if epoch < self.epoch {
            // Granted before an operator fault, started after it: a later
            // fence may already be in use, as the operator made possible.
            self.report.terms_granted_before_operator_fault += 1;
        } else if fence <= self.max_fence {
            let detail =
                format!("{ident} started a term with fence {fence}, but fence {} was issued before", self.max_fence);
            self.violate(t, Property::FencesIncrease, detail);
        }
        self.max_fence = self.max_fence.max(fence);
        let host = self.nodes[node].host;
        if self.net.local(host, t) >= deadline {
            self.violate(
                t,
                Property::OutputsMatchMachine,
                format!("{ident} started {term:?} already past its deadline"),
            );
        }
        if let Some(released) = self.released_at.take() {
            self.report.releases.handed_over(released, t);
        }
        self.nodes[node].guard =
            Some(Guard { term, fence, deadline, start: t, more: Grant { epoch, overlap_from: None } });
        self.leading.push(node);
    }

    fn deadline_extended(&mut self, t: u64, node: usize, term: TermId, deadline: LocalTime) {
        let ident = self.nodes[node].identity.clone();
        let Some(g) = self.nodes[node].guard.filter(|g| g.term == term) else {
            self.violate(t, Property::OutputsMatchMachine, format!("{ident} extended {term:?}, which is not live"));
            return;
        };
        if !self.valid(node, t) {
            let detail = self.net.revived(&ident, self.nodes[node].host, &g, deadline, t);
            self.violate(t, Property::GuardNeverRevives, detail);
            return;
        }
        let epoch = self.reply_epoch.unwrap_or(self.epoch);
        self.nodes[node].guard = Some(Guard { deadline, more: Grant { epoch, ..g.more }, ..g });
    }

    fn check_outputs(&mut self, t: u64, node: usize) {
        let n = &self.nodes[node];
        let Some(m) = n.machine.as_ref() else { return };
        if let Some(detail) = outputs_disagree(&n.identity, n.guard.as_ref(), m.term()) {
            self.violate(t, Property::OutputsMatchMachine, detail);
        }
    }

    /// Runs after every event: validity changes only at events and at
    /// deadlines, and a deadline passing only turns a guard off, so checking
    /// each event instant covers every instant of real time.
    fn check_instant(&mut self, t: u64) {
        let valid: Vec<usize> = self.leading.iter().copied().filter(|&n| self.valid(n, t)).collect();
        // Guards granted since the last operator fault: at most one may be
        // valid. With no operator fault in the run that is every guard.
        let current: Vec<usize> = valid
            .iter()
            .copied()
            .filter(|&n| self.nodes[n].guard.is_some_and(|g| self.orphaned_at(&g).is_none()))
            .collect();
        if valid.len() > 1 && current.len() <= 1 {
            // The overlap an operator fault made possible: count it, bound it.
            for &n in &valid {
                let Some(mut g) = self.nodes[n].guard else { continue };
                if self.orphaned_at(&g).is_none() {
                    continue;
                }
                if g.more.overlap_from.is_none() {
                    g.more.overlap_from = Some(t);
                    self.nodes[n].guard = Some(g);
                    self.report.operator_overlaps += 1;
                    let ident = self.nodes[n].identity.clone();
                    self.net.note(t, 36, n as u64, g.fence, || {
                        format!("n{n} {ident} (fence {}) overlaps a newer guard after an operator fault", g.fence)
                    });
                }
                self.check_orphan_bound(t, n, &g, t);
            }
        } else if valid.len() > 1 {
            let who: Vec<String> = current
                .iter()
                .filter_map(|&n| {
                    let (node, g) = (&self.nodes[n], self.nodes[n].guard?);
                    Some(self.net.holder(&node.identity, node.host, &g, t))
                })
                .collect();
            let since = if self.epoch > 0 { ", both granted since the last operator fault" } else { "" };
            self.violate(t, Property::AtMostOneValidGuard, format!("{}{since}", who.join(" and ")));
            return;
        }
        if self.s.variant != Variant::Normal {
            // The broken drivers are judged on the headline properties only.
            return;
        }
        // A guard granted before an operator fault is not backed by the
        // record any more, by the operator's doing; the current one must be.
        if let Some(&n) = current.first() {
            self.net.advance_db(t);
            let g = self.nodes[n].guard.expect("valid implies a guard");
            let row = self.net.store.peek(ELECTION);
            // A row inherited across a failover may lack the renewals (or
            // the claim) behind this guard: it backs nobody until it is
            // written again, and nobody can claim it before then.
            // So may the row a failover left: a guard granted before the last
            // failover (or by a call the old server applied, answered after
            // it) is backed by what the old server acknowledged, which the
            // replica may lack (renewals, or the very claim): the row stays
            // inherited, or is held for nobody, until its deadline has
            // passed; nobody else can claim it meanwhile, which the
            // one-guard rule checks.
            let before_failover = self.last_failover.is_some_and(|f| g.start < f);
            let held_for_nobody = row.as_ref().is_some_and(|r| r.holder.is_empty());
            let ok = before_failover
                || held_for_nobody
                || self.net.store.is_inherited(ELECTION)
                || row
                    .as_ref()
                    .is_some_and(|r| r.holder == self.nodes[n].identity && r.fence == g.fence && !r.expired());
            if !ok {
                let detail = format!("{} holds fence {} but the record is {row:?}", self.nodes[n].identity, g.fence);
                self.violate(t, Property::GuardBackedByRecord, detail);
            }
        }
    }

    /// A shutdown waits for an acquire in flight (one operation timeout) and
    /// then for its release (another).
    fn check_shutdown_time(&mut self, t: u64, node: usize, since: u64) {
        if !self.watchdog() {
            // The blocking driver waits on a hung call for ever, by design.
            return;
        }
        let host = self.nodes[node].host;
        let o = self.s.timing.operation_timeout * 2;
        let bound = u64::try_from(o.as_nanos() * u128::from(PPM) / u128::from(self.s.hosts[host].rate_ppm))
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        if t.saturating_sub(since) > bound {
            let detail = format!(
                "{} began shutting down at {:?} and had not stopped by {:?}",
                self.nodes[node].identity,
                dur(since),
                dur(t)
            );
            self.violate(t, Property::ShutdownCompletes, detail);
        }
    }
}

impl<'a> Fleet<'a> for World<'a> {
    type Call = Call;
    type Own = Own;

    fn net(&mut self) -> &mut Net<'a, Call, Own> {
        &mut self.net
    }

    fn process(&mut self, node: usize) -> Process<'_> {
        let n = &mut self.nodes[node];
        Process { host: n.host, identity: &n.identity, timer: n.machine.as_ref().map(|_| &mut n.timer) }
    }

    fn woken(&mut self, t: u64, node: usize) {
        self.with_node(t, node, |m, now| m.handle_timeout(now));
    }

    fn go_on(&mut self, t: u64) -> bool {
        if self.report.violation.is_none() {
            self.check_instant(t);
        }
        self.report.violation.is_none()
    }

    fn finish(&mut self, now: u64, end: u64) {
        if self.report.violation.is_none() {
            for node in 0..self.nodes.len() {
                if let (Some(since), Some(_)) = (self.nodes[node].shutdown_at, &self.nodes[node].machine) {
                    self.check_shutdown_time(now, node, since);
                }
            }
        }
        for node in self.leading.clone() {
            self.close_guard(end, node);
        }
        if self.report.violation.is_some() || self.s.variant == Variant::NoWatchdog {
            return;
        }
        let last = stretches(std::mem::take(&mut self.intervals)).pop();
        let timeline = &mut self.net.timeline;
        let faults_end = nanos(timeline.faults_end);
        let deadline = faults_end.saturating_add(nanos(timeline.liveness_bound));
        match last {
            Some((start, until)) if until >= end && start <= deadline => {
                timeline.recovery = Some(dur(start.saturating_sub(faults_end)));
            }
            other => {
                let detail = format!(
                    "{}; last stretch of leadership: {}",
                    timeline.missed(end),
                    other.map_or("none".to_owned(), |(s, e)| format!("{:?}..{:?}", dur(s), dur(e)))
                );
                self.violate(end, Property::SomeoneLeadsAfterFaults, detail);
            }
        }
    }

    fn no_progress(&mut self, t: u64, detail: String) {
        self.violate(t, Property::MachineMakesProgress, detail);
    }

    fn own(&mut self, t: u64, ev: Own) {
        match ev {
            Own::Reply { node, id, outcome, epoch } => {
                let host = self.nodes[node].host;
                if self.net.reply_cut_off(t, node, host, id.0) {
                    return;
                }
                let Some(m) = self.nodes[node].machine.as_ref() else { return };
                if m.call_in_flight().is_none_or(|c| c.id != id) {
                    self.report.late_replies += 1;
                }
                self.net
                    .note(t, 5, node as u64, id.0, || format!("n{node} reply {}: {}", id.0, show_outcome(&outcome)));
                self.reply_epoch = Some(epoch);
                self.with_node(t, node, |m, now| m.handle_reply(now, id, outcome));
                self.reply_epoch = None;
            }
            Own::Snapshot(i) => {
                self.net.advance_db(t);
                let row = self.net.store.peek(ELECTION);
                self.net.note(t, 33, i as u64, row.as_ref().map_or(0, |r| r.fence), || {
                    format!("a replica's copy for fault {i}: {}", row.as_ref().map_or("no row".into(), show_lease))
                });
                self.snapshots[i] = row;
            }
            Own::GuardsDropped { node } => {
                self.net.note(t, 6, node as u64, 0, || format!("n{node} drops the guards of its ended term"));
                self.with_node(t, node, |m, now| m.set_hold_back(now, false));
            }
            Own::Wake { node, fence } => {
                let host = self.nodes[node].host;
                let Some(m) = self.nodes[node].machine.as_ref() else { return };
                // The no-watchdog control's driver is blocked in its store
                // call: it reads nothing from the feed until the call returns.
                let blocked = !self.watchdog() && m.call_in_flight().is_some();
                if blocked || self.net.wake_cut_off(t, node, host, &mut self.report.releases) {
                    return;
                }
                self.with_node(t, node, |m, now| m.handle_wake(now, fence));
            }
        }
    }

    fn spawn(&mut self, t: u64, host: usize) {
        let hs = &mut self.net.states[host];
        hs.processes += 1;
        let identity = format!("h{host}.{}-{:04x}", hs.processes, self.net.rng.below(0x1_0000));
        let mut cfg = MachineConfig::new(identity.clone(), self.s.timing, self.net.rng.next_u64());
        cfg.release_on_shutdown = self.s.hosts[host].release_on_shutdown;
        cfg.unsafe_anchor_at_reply = self.s.variant == Variant::AnchorAtReply;
        cfg.unsafe_lead_on_wake = self.s.variant == Variant::LeadsOnWake;
        let node = self.nodes.len();
        self.net.note(t, 1, node as u64, host as u64, || format!("n{node} starts as {identity} on host {host}"));
        self.nodes.push(Node {
            host,
            identity,
            machine: Some(Machine::new(cfg)),
            timer: Timer::default(),
            guard: None,
            shutdown_at: None,
        });
        self.net.states[host].current = Some(node);
        self.report.processes += 1;
        if self.s.variant == Variant::NeverCampaigns {
            self.with_node(t, node, |m, now| m.set_hold_back(now, true));
        } else {
            self.with_node(t, node, |m, now| m.handle_timeout(now));
        }
    }

    /// The database runs one call at real instant `t` on its own clock.
    fn apply(&mut self, t: u64, node: usize, call: Call) {
        self.net.advance_db(t);
        self.report.applied += 1;
        let host = self.nodes[node].host;
        let id = self.nodes[node].identity.clone();
        let payload = [host as u8];
        let o = self.s.timing.operation_timeout;
        let before = (self.s.variant == Variant::OldFenceRule).then(|| self.net.store.peek(ELECTION));
        let mut outcome = call.op.run(&self.net.store, ELECTION, &id, &payload, o);
        if let Some(before) = before {
            old_fence_rule(&self.net.store, call.op, before, &id, &mut outcome);
        }
        if self.s.variant == Variant::RenewsLostLease {
            renews_lost_lease(&self.net.store, call.op, &id, &payload, &mut outcome);
        }
        self.net.note(t, 20, node as u64, call.id.0, || {
            format!("db applies n{node} call {}: {}", call.id.0, show_outcome(&outcome))
        });
        if let Some(row) = self.net.store.peek(ELECTION) {
            if matches!(call.op, Op::Acquire { .. }) && self.record_fence != Some(row.fence) {
                self.fence_issued(t, node, row.fence);
            }
            if row.fence < self.store_fence {
                let detail = format!("record fence went from {} to {}", self.store_fence, row.fence);
                self.violate(t, Property::StoreFenceMonotonic, detail);
            }
            self.store_fence = row.fence;
            self.record_fence = Some(row.fence);
        }
        self.tell_releases(t, node);
        let reply = Ev::Own(Own::Reply { node, id: call.id, outcome, epoch: self.epoch });
        self.net.transmit(t, node, host, call.id.0, true, reply);
    }

    fn fault_start(&mut self, t: u64, i: usize) {
        let fault = self.s.faults[i].fault;
        if fault.is_operator() {
            self.operator_fault(t, i);
            return;
        }
        if let Some((target, length, window)) = fault.window() {
            let host = target.map_or(usize::MAX, |target| self.resolve(t, target));
            self.net.open(t, (i, fault), host, length, window);
            return;
        }
        match fault {
            Fault::Crash { target, down } => {
                let host = self.resolve(t, target);
                self.net.note(t, 30, i as u64, host as u64, || format!("fault {i}: crash host {host} for {down:?}"));
                self.crash(t, host, down);
            }
            Fault::Shutdown { target, down } => {
                let host = self.resolve(t, target);
                self.net
                    .note(t, 30, i as u64, host as u64, || format!("fault {i}: shut down host {host} for {down:?}"));
                self.shutdown(t, host, down);
            }
            Fault::Failover { .. } => self.failover(t, i),
            Fault::Resign { target } => {
                let host = self.resolve(t, target);
                self.net.note(t, 30, i as u64, host as u64, || format!("fault {i}: host {host} resigns"));
                let node = self.net.states[host].current;
                if let Some(node) = node {
                    if let Some(g) = self.nodes[node].guard {
                        self.with_node(t, node, |m, now| m.resign(now, g.term));
                    }
                }
            }
            _ => unreachable!("a window or an operator fault: {fault:?}"),
        }
    }
}

fn show_outcome(o: &Outcome) -> String {
    match o {
        Outcome::Lease(Ok(l)) => show_lease(l),
        Outcome::Lease(Err(e)) => format!("error {:?}: {e}", e.kind()),
        Outcome::Released(r) => format!("release {r:?}"),
    }
}

fn show_lease(l: &Lease) -> String {
    format!("{} fence {} ttl {:?}{}", l.holder, l.fence, l.ttl(), if l.expired() { " (expired)" } else { "" })
}

/// The negative control's store ([`Variant::OldFenceRule`]): a new term's
/// fence, in a claim's `outcome`, by the old rule, absent row → 1 and
/// expired row → fence + 1 (`before`: the row before the claim), written
/// over what the store assigned.
fn old_fence_rule(store: &MemStore, op: Op, before: Option<Lease>, identity: &str, outcome: &mut Outcome) {
    let (Op::Acquire { .. }, Outcome::Lease(Ok(lease))) = (op, outcome) else { return };
    let new_term = lease.holder == identity && before.as_ref().is_none_or(|b| b.fence != lease.fence);
    if new_term {
        lease.fence = before.map_or(1, |b| b.fence + 1);
        store.restore_row(lease);
    }
}

/// The negative control's store ([`Variant::RenewsLostLease`]): a renewal
/// answers success, having written nothing, when the lease is gone or
/// someone else's.
fn renews_lost_lease(store: &MemStore, op: Op, identity: &str, payload: &[u8], outcome: &mut Outcome) {
    let (Op::Renew { fence, ttl }, Outcome::Lease(answer)) = (op, outcome) else { return };
    if answer.as_ref().is_err_and(StoreError::is_lease_lost) {
        *answer = Ok(Lease::granted(ELECTION, identity, fence, store.now(), ttl, payload));
    }
}
