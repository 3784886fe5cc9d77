//! The hand-off of a term between the elector's threads: what the renewal
//! thread decides when the state machine starts, extends or ends a term,
//! when the program (a guard's drop, `resign`) or the watchdog ends one
//! behind the machine's back, and whether guards of an ended term hold the
//! next campaign back.
//!
//! This is shipped code, not a model of it: the threaded driver in
//! `elector.rs` owns the threads (the select loop, the store-call workers,
//! the watchdog's timer, the callback thread) and reaches them only through
//! [`Outside`]; everything that decides about a term's end is here, over the
//! real [`Machine`] and the shared [`State`]. The loom models in
//! `handoff_loom.rs` run this same code with a model standing in for the
//! threads around it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::error::WaitLeaderError;
use crate::error::{ElectionError, Human, OpKind};
use crate::guard::{Command, LeaderGuard, TermShared, TermStore};
use crate::machine::reason_name;
use crate::machine::{Call, EndReason, LocalTime, Machine, Observed, Outcome, Output, TermId};
use crate::status::{is_renewal, Counters, Figures, LeaderInfo, Status};
use crate::sync::{link, Condvar, Link, Mutex};

/// The calls an [`Elector`](crate::Elector) and a group's
/// [`Election`](crate::Election) both offer on their one election, written
/// once over the type's `shared: Arc<Shared>`. `$ty` names the type in
/// the docs; `identity` and `wait_leader` take each type's own docs.
macro_rules! one_election_calls {
    ($ty:literal, $(#[$identity:meta])* identity; $(#[$wait:meta])* wait_leader;) => {
        $(#[$identity])*
        pub fn identity(&self) -> &str {
            &self.shared.identity
        }

        $(#[$wait])*
        pub fn wait_leader(&self) -> Result<$crate::LeaderGuard, $crate::WaitLeaderError> {
            self.shared.wait_leader(None)
        }

        /// The election's name.
        pub fn name(&self) -> &str {
            &self.shared.name
        }

        /// Whether this participant leads the election right now:
        /// re-checks the current term's deadline against the monotonic
        /// clock on every call.
        pub fn is_leader(&self) -> bool {
            self.shared.is_leader()
        }

        /// The current term's fence, when leading.
        pub fn fence(&self) -> Option<u64> {
            self.shared.fence()
        }

        /// A guard on the current term, without waiting; `None` when not
        /// leading. Dropping the last guard of a live term resigns it, and
        /// while a guard of an ended term is alive this participant starts
        /// no new term (see [`Elector::wait_leader`](crate::Elector::wait_leader)).
        pub fn guard(&self) -> Option<$crate::LeaderGuard> {
            self.shared.guard()
        }

        #[doc = concat!("Like [`", $ty, "::wait_leader`], giving up after `timeout`.")]
        ///
        /// # Errors
        ///
        /// [`WaitLeaderError::Timeout`](crate::WaitLeaderError::Timeout) or
        /// [`WaitLeaderError::Stopped`](crate::WaitLeaderError::Stopped).
        pub fn wait_leader_timeout(
            &self, timeout: ::std::time::Duration,
        ) -> Result<$crate::LeaderGuard, $crate::WaitLeaderError> {
            self.shared.wait_leader(::std::time::Instant::now().checked_add(timeout))
        }

        #[doc = concat!("Like [`", $ty, "::wait_leader`], giving up at `deadline`.")]
        ///
        /// # Errors
        ///
        /// [`WaitLeaderError::Timeout`](crate::WaitLeaderError::Timeout) or
        /// [`WaitLeaderError::Stopped`](crate::WaitLeaderError::Stopped).
        pub fn wait_leader_deadline(
            &self, deadline: ::std::time::Instant,
        ) -> Result<$crate::LeaderGuard, $crate::WaitLeaderError> {
            self.shared.wait_leader(Some(deadline))
        }

        /// A snapshot of the election as this participant sees it, with
        /// its counters (terms, renewals, abandoned calls). Takes the state
        /// lock once and copies; cheap enough to call on every scrape or
        /// health check.
        pub fn status(&self) -> $crate::Status {
            self.shared.status()
        }
    };
}
pub(crate) use one_election_calls;

/// The two ways an [`Elector`](crate::Elector), a [`Group`](crate::Group)
/// or a group's [`Election`](crate::Election) ends: `$stop` releases and
/// says how the release went, `$quiet` leaves the lease to run out; both
/// over the type's `fn $inner(&self, release: bool)`. Each takes its docs.
macro_rules! stop_calls {
    ($(#[$stop_doc:meta])* $stop:ident; $(#[$quiet_doc:meta])* $quiet:ident; by $inner:ident) => {
        $(#[$stop_doc])*
        pub fn $stop(&self) -> Result<(), $crate::ElectionError> {
            self.$inner(true)
        }

        $(#[$quiet_doc])*
        pub fn $quiet(&self) {
            let _ = self.$inner(false);
        }
    };
}
pub(crate) use stop_calls;

/// What an [`Elector`](crate::Elector) and a group's
/// [`Election`](crate::Election) do when dropped (`$end`, releasing) and
/// show as `Debug` (name, identity, whether leading), over `shared`.
macro_rules! one_election_handle {
    ($ty:ident, dropped: $end:ident) => {
        impl Drop for $ty {
            fn drop(&mut self) {
                let _ = self.$end();
            }
        }

        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.shared.debug_as(stringify!($ty), f)
            }
        }
    };
}
pub(crate) use one_election_handle;

/// State shared by the elector handle, the renewal thread and the watchdog.
/// The lock is never held across a store call.
pub(crate) struct Shared {
    pub(crate) origin: Instant,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) state: Mutex<State>,
    pub(crate) changed: Condvar,
    /// A deliberate bug switched on for a loom negative control.
    #[cfg(loom)]
    pub(crate) mutant: Option<Mutant>,
}

impl Shared {
    /// The `Debug` of a handle on this election: its name, identity and
    /// whether it leads now.
    pub(crate) fn debug_as(&self, handle: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(handle)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("is_leader", &self.is_leader())
            .finish()
    }

    /// Whether this participant leads right now: the current term's
    /// deadline is re-read against the monotonic clock.
    pub(crate) fn is_leader(&self) -> bool {
        self.state.lock().term.as_ref().is_some_and(|t| t.is_valid())
    }

    /// The current term's fence, when leading.
    pub(crate) fn fence(&self) -> Option<u64> {
        let st = self.state.lock();
        st.term.as_ref().filter(|t| t.is_valid()).map(|t| t.fence)
    }

    /// A guard on the current term, when leading.
    pub(crate) fn guard(&self) -> Option<LeaderGuard> {
        let st = self.state.lock();
        st.term.as_ref().filter(|t| t.is_valid()).map(TermShared::guard)
    }

    /// Blocks until this participant leads (a guard on the term), the
    /// participant stops, or `deadline` passes.
    pub(crate) fn wait_leader(&self, deadline: Option<Instant>) -> Result<LeaderGuard, WaitLeaderError> {
        let mut st = self.state.lock();
        loop {
            if let Some(term) = st.term.as_ref().filter(|t| t.is_valid()) {
                return Ok(term.guard());
            }
            if st.stopped {
                return Err(WaitLeaderError::Stopped);
            }
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut st, d).timed_out() {
                        if let Some(term) = st.term.as_ref().filter(|t| t.is_valid()) {
                            return Ok(term.guard());
                        }
                        return Err(if st.stopped { WaitLeaderError::Stopped } else { WaitLeaderError::Timeout });
                    }
                }
                None => self.changed.wait(&mut st),
            }
        }
    }

    /// A snapshot of the election as this participant sees it.
    pub(crate) fn status(&self) -> Status {
        let (name, identity) = (self.name.clone(), self.identity.clone());
        let st = self.state.lock();
        let term = st.term.as_ref().filter(|t| t.is_valid());
        let fig = st.figures;
        Status {
            name,
            identity,
            is_leader: term.is_some(),
            fence: term.map(|t| t.fence),
            valid_until: term.map(|t| t.deadline()),
            term_started: term.and(fig.term_started),
            terms_started: fig.terms_started,
            terms_ended: fig.terms_ended,
            renewals_ok: fig.renewals_ok,
            renewals_failed: fig.renewals_failed,
            calls_abandoned: fig.calls_abandoned,
            last_call_rtt: fig.last_call_rtt,
            leader: st.observed.as_ref().map(|o| LeaderInfo {
                identity: o.identity.clone(),
                fence: o.fence,
                payload: o.payload.clone(),
                valid: o.valid,
                seen_at: self.origin.checked_add(o.at.as_duration()).unwrap_or(self.origin),
            }),
            last_error: st.last_error.clone(),
            held_back: st.held_back,
            stopped: st.stopped,
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) term: Option<Arc<TermShared>>,
    pub(crate) observed: Option<Observed>,
    pub(crate) last_error: Option<ElectionError>,
    pub(crate) held_back: bool,
    pub(crate) stopped: bool,
    pub(crate) figures: Figures,
}

/// Deliberate bugs in the hand-off, each a mistake the loom models must
/// catch (their negative controls). Only under `cfg(loom)`: normal builds
/// have no switch.
#[cfg(loom)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// A renewal's extension is taken as done, whatever `extend` says about
    /// a term that ended while the answer travelled.
    IgnoreExtendAnswer,
    /// The watchdog expires the term at the deadline it was armed for,
    /// without reading the deadline again.
    WatchdogSkipsReread,
    /// A guards-gone notice is taken for "no guard is left", without
    /// reading the count again: the count it carries may be stale.
    StaleGuardCount,
    /// A late command of an earlier term is applied to the current term.
    CommandTermUnchecked,
    /// The machine is not told that a resignation beat its own end of the
    /// term, so it does not back off.
    ResignationForgotten,
}

/// Whether the named mutant is switched on; always false outside loom.
#[cfg(loom)]
macro_rules! mutant {
    ($shared:expr, $m:ident) => {
        $shared.mutant == Some(Mutant::$m)
    };
}
#[cfg(not(loom))]
macro_rules! mutant {
    ($shared:expr, $m:ident) => {
        false
    };
}

/// What the hand-off needs from the threads around it: the elector's real
/// ones, or a loom model's stand-in with a clock it sets and lists it reads.
pub(crate) trait Outside {
    /// The local monotonic clock, as the machine counts it.
    fn now(&self) -> LocalTime;
    /// Starts a store call; `Err` is its outcome when it cannot start.
    fn start_call(&mut self, call: Call) -> Result<(), Outcome>;
    /// What a new term's guards need for store calls of their own (slots);
    /// `None` leaves a term without (as a model's are).
    fn term_store(&self) -> Option<Arc<TermStore>>;
    /// Hands a new term to the watchdog.
    fn watch(&mut self, term: &Arc<TermShared>);
    /// Queues an event for the callback thread.
    fn event(&mut self, ev: Event);
    /// Sees each machine output before the hand-off acts on it (models
    /// record them).
    fn saw(&mut self, _out: &Output) {}
}

/// Events for the callback thread, in the order they happened.
pub(crate) enum Event {
    Started(LeaderGuard),
    Stopped,
    NewLeader(String, u64),
}

/// An ended term whose guards are still alive, since when, and whether the
/// warning about it was logged.
pub(crate) struct HeldBack {
    pub(crate) term: Arc<TermShared>,
    since: Instant,
    warned: bool,
}

/// The renewal thread's side of the hand-off: what it knows beyond the
/// machine and the shared state.
pub(crate) struct Handoff<O> {
    pub(crate) outside: O,
    pub(crate) shared: Arc<Shared>,
    counters: Counters,
    /// Given to every term, for its guards' commands.
    pub(crate) cmd_tx: Link<Command>,
    /// `on_started_leading` is set.
    started_callback: bool,
    lease_duration: Duration,
    /// An ended term whose guards are still alive.
    pub(crate) held_back: Option<HeldBack>,
    /// `resign()` calls waiting for their release.
    resigners: Vec<(u64, Sender<Result<(), ElectionError>>)>,
    /// The last release's fence and result.
    last_release: Option<(u64, Result<(), ElectionError>)>,
    shutdown_result: Result<(), ElectionError>,
    /// The fatal error last logged at `warn`: the same one again (a
    /// follower polling a store it cannot use: a missing table, a setting
    /// the store cannot work under) is logged at `debug` until a call
    /// succeeds or another error comes.
    logged_fatal: Option<String>,
    /// Failed calls are logged at `debug` only: a group logs each failed
    /// batch once, not once per election in it.
    quiet_failures: bool,
}

impl<O: Outside> Handoff<O> {
    pub(crate) fn new(
        outside: O, shared: Arc<Shared>, counters: Counters, cmd_tx: Sender<Command>, started_callback: bool,
        lease_duration: Duration,
    ) -> Handoff<O> {
        Handoff {
            outside,
            shared,
            counters,
            cmd_tx: link(cmd_tx),
            started_callback,
            lease_duration,
            held_back: None,
            resigners: Vec::new(),
            last_release: None,
            shutdown_result: Ok(()),
            logged_fatal: None,
            quiet_failures: false,
        }
    }

    /// Logs failed calls at `debug` only (see `quiet_failures`).
    pub(crate) fn quiet_failures(mut self) -> Handoff<O> {
        self.quiet_failures = true;
        self
    }

    fn now(&self) -> LocalTime {
        self.outside.now()
    }

    /// Carries out the machine's outputs. Returns true once it has stopped.
    pub(crate) fn drain(&mut self, machine: &mut Machine) -> bool {
        // Status first, so whoever a term start wakes sees the lease behind it.
        self.publish(machine);
        while let Some(out) = machine.poll_output() {
            if self.handle(machine, out) {
                return true;
            }
        }
        self.settled(machine);
        false
    }

    /// After a round of outputs: the status shows the machine's state, and
    /// a success forgets the fatal error last logged.
    pub(crate) fn settled(&mut self, machine: &Machine) {
        self.publish(machine);
        if machine.last_error().is_none() {
            self.logged_fatal = None;
        }
    }

    /// Carries out one of the machine's outputs (a group's driver hands
    /// them over one at a time, having taken the calls itself). Returns
    /// true once the machine has stopped.
    pub(crate) fn handle(&mut self, machine: &mut Machine, out: Output) -> bool {
        self.outside.saw(&out);
        match out {
            Output::Call(call) => {
                let now = self.now();
                if let Err(e) = self.outside.start_call(call) {
                    machine.handle_reply(now, call.id, e);
                }
            }
            Output::CallAbandoned(id) => log::debug!("leaderelection: store call {} abandoned", id.0),
            Output::TermStarted { term, fence, deadline } => self.term_started(term, fence, deadline),
            Output::DeadlineExtended { term, deadline } => {
                // The term may have ended while the answer travelled (its
                // last guard dropped, its deadline seen passing): then it
                // stays over, for the reason that ended it.
                let ended = {
                    let mut st = self.shared.state.lock();
                    self.counters.renewed(&mut st.figures);
                    st.term.as_ref().filter(|t| t.id == term).and_then(|t| t.extend(deadline.as_duration()))
                };
                if let Some(reason) = ended.filter(|_| !mutant!(self.shared, IgnoreExtendAnswer)) {
                    let now = self.now();
                    self.settle(machine, now, term, reason);
                }
            }
            Output::TermEnded { term, reason, .. } => self.term_ended(machine, term, reason),
            Output::NewLeader { identity, fence } => {
                // Its own term's start has a line of its own.
                let level = if identity == self.shared.identity { log::Level::Debug } else { log::Level::Info };
                log::log!(level, "leaderelection: {:?}: leader is {identity:?} with fence {fence}", self.shared.name);
                self.outside.event(Event::NewLeader(identity, fence));
            }
            Output::Released { fence, result } => {
                self.last_release = Some((fence, result.clone()));
                if machine.is_stopping() {
                    self.shutdown_result = result.clone();
                }
                self.resigners.retain(|(f, reply)| {
                    if *f == fence {
                        let _ = reply.send(result.clone());
                        false
                    } else {
                        true
                    }
                });
            }
            Output::Failed(e) => self.call_failed(&e),
            Output::Stopped => {
                self.publish(machine);
                return true;
            }
        }
        false
    }

    pub(crate) fn publish(&self, machine: &Machine) {
        let mut st = self.shared.state.lock();
        // In place (see `Observed::clone_from`): every election of a group
        // publishes each reading of its lease.
        match (&mut st.observed, machine.observed()) {
            (Some(to), Some(from)) => to.clone_from(from),
            (to, from) => *to = from.cloned(),
        }
        st.last_error = machine.last_error().cloned();
        st.held_back = self.held_back.is_some();
    }

    /// A command from a guard (or the watchdog), or the elector's shutdown.
    pub(crate) fn command(&mut self, machine: &mut Machine, now: LocalTime, cmd: Command) {
        match cmd {
            Command::Shutdown { release: true } => machine.shutdown(now),
            Command::Shutdown { release: false } => machine.shutdown_without_release(now),
            Command::Resign(term, fence, reply) => self.resign(machine, now, term, fence, reply),
            Command::GuardsGone(term) => self.guards_gone(machine, now, self.about(term)),
            Command::Expired(term) => self.settle(machine, now, self.about(term), EndReason::ExpiredLocally),
        }
    }

    /// The term a guard's command is about: the one it names, which may have
    /// ended long ago (the machine and the checks below ignore such a term),
    /// never whichever term happens to be current.
    fn about(&self, id: TermId) -> TermId {
        if mutant!(self.shared, CommandTermUnchecked) {
            return self.shared.state.lock().term.as_ref().map_or(id, |t| t.id);
        }
        id
    }

    fn term_started(&mut self, id: TermId, fence: u64, deadline: LocalTime) {
        let mut term =
            TermShared::new(id, fence, self.shared.origin, deadline.as_duration(), Some(self.cmd_tx.clone()));
        if let Some(store) = self.outside.term_store() {
            term = term.with_store(store);
        }
        let term = Arc::new(term);
        log::info!("leaderelection: {:?}: {:?} leads with fence {fence}", self.shared.name, self.shared.identity);
        {
            let mut st = self.shared.state.lock();
            st.term = Some(Arc::clone(&term));
            self.counters.term_started(&mut st.figures);
            self.shared.changed.notify_all();
        }
        self.outside.watch(&term);
        if self.started_callback {
            // Only a callback that will hold it gets a guard: a guard nobody
            // holds would be dropped at once and resign the term.
            let guard = term.guard();
            self.outside.event(Event::Started(guard));
        }
    }

    fn term_ended(&mut self, machine: &mut Machine, id: TermId, reason: EndReason) {
        let (ended, first) = {
            let mut st = self.shared.state.lock();
            let Some(term) = st.term.take_if(|t| t.id == id) else { return };
            let first = term.end(reason);
            // Counted and logged for the reason that won, once per term.
            self.counters.term_ended(&mut st.figures, first.err().unwrap_or(reason));
            self.shared.changed.notify_all();
            (term, first)
        };
        self.log_end(machine, ended.fence, first.err().unwrap_or(reason));
        self.outside.event(Event::Stopped);
        if first == Err(EndReason::Resigned) && !mutant!(self.shared, ResignationForgotten) {
            // The program let go of the term before the machine's own end
            // reached it: the term was resigned, and the back-off applies.
            let now = self.now();
            machine.resign(now, id);
        }
        // Read after the end: no guard of this term can be handed out from
        // here on, so the count only falls, and the last drop's notice comes
        // after this read.
        if ended.guards() > 0 {
            self.held_back = Some(HeldBack { term: ended, since: Instant::now(), warned: false });
            let now = self.now();
            machine.set_hold_back(now, true);
        }
    }

    /// One line per term's end: `info` when the program or a shutdown ended
    /// it, `warn` with the cause when it ended early.
    fn log_end(&self, machine: &Machine, fence: u64, reason: EndReason) {
        let (name, id, why) = (&self.shared.name, &self.shared.identity, reason_name(reason));
        if matches!(reason, EndReason::Resigned | EndReason::Shutdown) {
            log::info!("leaderelection: {name:?}: {id:?} term with fence {fence} ended: {why}");
            return;
        }
        let cause = match machine.last_error() {
            Some(ElectionError::LeaseExpiredLocally { cause: Some(c) }) => {
                format!("no renewal confirmed the lease before its deadline; last failure: {c}")
            }
            Some(ElectionError::LeaseExpiredLocally { cause: None }) | None => {
                "no renewal confirmed the lease before its deadline".to_owned()
            }
            Some(e) => e.to_string(),
        };
        log::warn!("leaderelection: {name:?}: {id:?} term with fence {fence} ended: {why}: {cause}");
    }

    /// A failed store call: counted, and logged at `warn` with its cause (a
    /// renewal with the fence and how long the term has left).
    fn call_failed(&mut self, e: &ElectionError) {
        let (name, id) = (&self.shared.name, &self.shared.identity);
        let term = {
            let mut st = self.shared.state.lock();
            self.counters.failed(&mut st.figures, e);
            st.term.as_ref().map(|t| (t.fence, t.deadline()))
        };
        // A fatal error is reported once, not at every poll.
        let repeated = e.is_fatal() && self.logged_fatal.as_deref() == Some(e.to_string().as_str());
        self.logged_fatal = e.is_fatal().then(|| e.to_string());
        if repeated || self.quiet_failures {
            log::debug!("leaderelection: {name:?}: {id:?}: {e} (again)");
            return;
        }
        let renew = is_renewal(e);
        let cause: &dyn fmt::Display = match e {
            ElectionError::Store { error, .. } => error,
            other => other,
        };
        match term {
            Some((fence, deadline)) if renew => {
                let left = Human::about(deadline.saturating_duration_since(Instant::now()));
                log::warn!("leaderelection: {name:?}: {id:?} renewal failed (fence {fence}, {left} left): {cause}");
            }
            _ if renew => log::warn!("leaderelection: {name:?}: {id:?} renewal failed: {cause}"),
            _ => log::warn!("leaderelection: {name:?}: {id:?}: {e}"),
        }
    }

    /// A store call answered: its round trip, for the status.
    pub(crate) fn call_returned(&self, op: OpKind, took: Duration) {
        self.counters.call_returned(&mut self.shared.state.lock().figures, op, took);
    }

    /// Tells the machine how term `id` ended, as its shared state decided:
    /// once, whoever got there first.
    fn settle(&mut self, machine: &mut Machine, now: LocalTime, id: TermId, reason: EndReason) {
        // Only the program resigns and only a deadline expires a term behind
        // the machine's back; the other reasons come from the machine itself,
        // which has then ended the term already, so `expire` finds nothing.
        match reason {
            EndReason::Resigned => machine.resign(now, id),
            _ => machine.expire(now, id),
        }
    }

    fn guards_gone(&mut self, machine: &mut Machine, now: LocalTime, id: TermId) {
        let resigned = {
            let st = self.shared.state.lock();
            st.term.as_ref().is_some_and(|t| t.id == id && t.was_resigned())
        };
        if resigned {
            // The program let go of a live term (its last guard ended it):
            // hand it over.
            self.settle(machine, now, id, EndReason::Resigned);
        }
        // The count again, not the notice's: a guard taken as the last one
        // dropped (invalid from the start) holds the next term back too.
        let stale = mutant!(self.shared, StaleGuardCount);
        if self.held_back.as_ref().is_some_and(|h| h.term.id == id && (stale || h.term.guards() == 0)) {
            self.held_back = None;
            machine.set_hold_back(now, false);
        }
    }

    fn resign(
        &mut self, machine: &mut Machine, now: LocalTime, id: TermId, fence: u64,
        reply: Sender<Result<(), ElectionError>>,
    ) {
        machine.resign(now, id);
        if machine.releasing() == Some(fence) {
            self.resigners.push((fence, reply));
            return;
        }
        // Nothing left to send: the release already finished (its result
        // answers), or the lease was lost and nothing is held.
        let result = match &self.last_release {
            Some((f, result)) if *f == fence => result.clone(),
            _ => Ok(()),
        };
        let _ = reply.send(result);
    }

    /// Warns once when guards of an ended term have held a new campaign back
    /// for a whole lease duration; returns when to look again.
    pub(crate) fn check_hold(&mut self) -> Option<Instant> {
        let lease = self.lease_duration;
        let held = self.held_back.as_mut().filter(|h| !h.warned)?;
        let warn_at = held.since.checked_add(lease)?;
        if Instant::now() < warn_at {
            return Some(warn_at);
        }
        held.warned = true;
        log::warn!(
            "leaderelection: {:?}: {:?} does not campaign: a guard of its last term (fence {}) has been held for {} \
             after the term ended; drop it (a `guard = elector.wait_leader()` assignment keeps the old guard alive \
             while it waits)",
            self.shared.name,
            self.shared.identity,
            held.term.fence,
            Human::about(held.since.elapsed()),
        );
        None
    }

    /// After the machine stopped: the elector is stopped, and `resign()`
    /// calls still waiting learn that their release was abandoned.
    pub(crate) fn finish(mut self) -> Result<(), ElectionError> {
        let mut st = self.shared.state.lock();
        st.stopped = true;
        st.term = None;
        self.shared.changed.notify_all();
        drop(st);
        // Their release was abandoned by the shutdown: not confirmed.
        for (_, reply) in self.resigners.drain(..) {
            let _ = reply.send(Err(ElectionError::Stopped));
        }
        self.shutdown_result
    }
}

/// The watchdog's step when it wakes for `term` at `now`: ends the term if
/// its deadline, read again now, has passed (a renewal may have moved it
/// since the wake-up was set), and records why in the status. Returns the
/// term if it is still to be watched.
pub(crate) fn watchdog_fired(shared: &Shared, term: Arc<TermShared>, now: Instant) -> Option<Arc<TermShared>> {
    if !mutant!(shared, WatchdogSkipsReread) && now < term.deadline() {
        return Some(term);
    }
    if term.expire() {
        // The renewal thread logs the term's end when it hears.
        log::debug!(
            "leaderelection: {:?}: {:?} stepped down at its local deadline (fence {})",
            shared.name,
            shared.identity,
            term.fence
        );
        let mut st = shared.state.lock();
        if st.term.as_ref().is_some_and(|t| Arc::ptr_eq(t, &term)) {
            let cause = st.last_error.take().map(Box::new);
            st.last_error = Some(ElectionError::LeaseExpiredLocally { cause });
        }
        shared.changed.notify_all();
    }
    None
}

#[cfg(all(test, loom))]
#[path = "handoff_loom.rs"]
mod loom_tests;
