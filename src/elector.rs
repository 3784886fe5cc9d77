//! The threaded driver: a renewal thread that runs the state machine, a
//! watchdog that ends terms at their deadline, worker threads for store calls,
//! and a thread for callbacks.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::config::{Config, NewLeaderFn, StartedFn, StoppedFn};
use crate::error::{ElectionError, Human, OpKind};
use crate::guard::{Command, LeaderGuard, TermShared, TermStore};
use crate::identity::{default_identity, with_instance, IdentityError};
use crate::machine::{
    Call, CallId, EndReason, LocalTime, Machine, MachineConfig, Observed, Op, Outcome, Output, TermId,
};
use crate::status::{is_renewal, reason_name, Counters, Figures, LeaderInfo, Status};
use crate::store::{Store, StoreError};
use crate::ConfigError;

/// How many worker threads may exist for store calls: one for the call in
/// flight and the rest for calls abandoned at the operation timeout that have
/// not come back yet. When all are stuck, new calls fail at once.
const MAX_CALL_THREADS: usize = 4;

/// One participant in one election, running on its own threads.
///
/// [`Elector::start`] spawns them; [`Elector::shutdown`] (or `Drop`) ends the
/// term, releases the lease and joins them.
///
/// # Examples
///
/// ```
/// use leaderelection::{Config, Elector, MemStore};
/// use std::time::Duration;
///
/// let elector = Elector::start(Config::new(MemStore::new(), "invoice-reconciler"))?;
/// let guard = elector.wait_leader_timeout(Duration::from_secs(5))?;
/// let mut written = Vec::new();
/// for job in ["a", "b", "c"] {
///     if !guard.is_valid() {
///         break; // the term ended: stop writing
///     }
///     written.push((job, guard.fence()));
/// }
/// let f = guard.fence();
/// assert_eq!(written, [("a", f), ("b", f), ("c", f)]); // one term, one fence
/// drop(guard); // resigns: a successor could take over at once
/// elector.shutdown()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Elector {
    shared: Arc<Shared>,
    cmd_tx: Sender<Command>,
    threads: Mutex<Threads>,
}

#[derive(Default)]
struct Threads {
    renewal: Option<JoinHandle<Result<(), ElectionError>>>,
    watchdog: Option<JoinHandle<()>>,
    callbacks: Option<JoinHandle<()>>,
    result: Option<Result<(), ElectionError>>,
}

/// State shared by the elector handle, the renewal thread and the watchdog.
/// The lock is never held across a store call.
struct Shared {
    origin: Instant,
    name: String,
    identity: String,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    term: Option<Arc<TermShared>>,
    observed: Option<Observed>,
    last_error: Option<ElectionError>,
    held_back: bool,
    stopped: bool,
    figures: Figures,
}

/// Why [`Elector::start`] refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    Config(ConfigError),
    /// No identity was set and none could be generated.
    Identity(IdentityError),
    /// A thread could not be spawned.
    Spawn(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "cannot start elector: {e}"),
            StartError::Identity(e) => write!(f, "cannot start elector: {e}"),
            StartError::Spawn(e) => write!(f, "cannot start elector: spawning a thread failed: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::Identity(e) => Some(e),
            StartError::Spawn(e) => Some(e),
        }
    }
}

impl From<ConfigError> for StartError {
    fn from(e: ConfigError) -> StartError {
        StartError::Config(e)
    }
}

/// Why a wait for leadership returned without a guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitLeaderError {
    /// The time ran out.
    Timeout,
    /// The elector has shut down.
    Stopped,
}

impl fmt::Display for WaitLeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitLeaderError::Timeout => "timed out waiting for leadership",
            WaitLeaderError::Stopped => "elector stopped while waiting for leadership",
        })
    }
}

impl std::error::Error for WaitLeaderError {}

impl Elector {
    /// Validates `config`, then spawns the renewal and watchdog threads (and
    /// a callback thread when callbacks are set). Returns at once; leadership
    /// comes later.
    ///
    /// # Errors
    ///
    /// [`StartError::Config`] for an invalid configuration,
    /// [`StartError::Identity`] when an identity must be generated and the
    /// system's randomness fails, [`StartError::Spawn`] when a thread cannot
    /// be started.
    pub fn start(config: Config) -> Result<Elector, StartError> {
        config.validate()?;
        // The instance tag makes this elector a participant of its own,
        // whatever name it was given: two electors with one name never both
        // hold the lease (the row's holder is this whole string).
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| StartError::Identity(IdentityError::from_getrandom(e)))?;
        let (instance, seed) = random.split_at(8);
        let instance = u64::from_le_bytes(instance.try_into().expect("8 bytes"));
        let identity = with_instance(config.identity.as_deref().unwrap_or(&default_identity()), instance);
        let seed: [u8; 8] = seed.try_into().expect("8 bytes");
        let mut mcfg = MachineConfig::new(identity.clone(), config.timing, u64::from_le_bytes(seed));
        mcfg.release_on_shutdown = config.release_on_shutdown;
        let machine = Machine::new(mcfg);

        let shared = Arc::new(Shared {
            origin: Instant::now(),
            name: config.name.clone(),
            identity,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let (dog_tx, dog_rx) = crossbeam_channel::unbounded();
        let mut threads = Threads::default();

        let dog_shared = Arc::clone(&shared);
        threads.watchdog = Some(spawn("leaderelection-watchdog", move || watchdog(dog_shared, dog_rx))?);

        let has_callbacks = config.on_started_leading.is_some()
            || config.on_stopped_leading.is_some()
            || config.on_new_leader.is_some();
        let events = if has_callbacks {
            let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
            let (started, stopped, new_leader) =
                (config.on_started_leading.clone(), config.on_stopped_leading.clone(), config.on_new_leader.clone());
            match spawn("leaderelection-callbacks", move || callbacks(ev_rx, started, stopped, new_leader)) {
                Ok(h) => threads.callbacks = Some(h),
                Err(e) => {
                    drop(dog_tx);
                    return Err(e);
                }
            }
            Some(ev_tx)
        } else {
            None
        };

        let driver = Driver {
            machine,
            shared: Arc::clone(&shared),
            callers: Callers::new(&config, shared.identity.clone()),
            counters: Counters::new(&config.name),
            cmd_tx: cmd_tx.clone(),
            dog_tx,
            events,
            started_callback: config.on_started_leading.is_some(),
            held_back: None,
            lease_duration: config.timing.lease_duration,
            resigners: Vec::new(),
            last_release: None,
            shutdown_result: Ok(()),
        };
        threads.renewal = Some(spawn("leaderelection-renewal", move || driver.run(cmd_rx))?);
        Ok(Elector { shared, cmd_tx, threads: Mutex::new(threads) })
    }

    /// This participant's identity as the lease row shows it: the
    /// configured identity, `#` and this elector's instance tag
    /// (`web#3f9c2b4e8a1d7c05`). Compare it with
    /// [`Status::leader`](crate::Status::leader)'s identity; see
    /// [`Config::identity`](crate::Config::identity).
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Whether this participant leads right now: re-checks the current term's
    /// deadline against the monotonic clock on every call.
    pub fn is_leader(&self) -> bool {
        self.shared.state.lock().term.as_ref().is_some_and(|t| t.is_valid())
    }

    /// The current term's fence, when leading.
    pub fn fence(&self) -> Option<u64> {
        let st = self.shared.state.lock();
        st.term.as_ref().filter(|t| t.is_valid()).map(|t| t.fence)
    }

    /// A guard on the current term, without waiting; `None` when not leading.
    /// Remember that dropping the last guard of a live term resigns it, and
    /// that while a guard of an ended term is alive this participant starts
    /// no new term (see [`Elector::wait_leader`]).
    pub fn guard(&self) -> Option<LeaderGuard> {
        let st = self.shared.state.lock();
        st.term.as_ref().filter(|t| t.is_valid()).map(TermShared::guard)
    }

    /// Blocks until this participant leads and returns a guard on the term.
    ///
    /// **Drop the old guard before waiting again.** While any guard of an
    /// ended term is alive, the elector does not campaign, so two terms of
    /// one process never overlap in user code. An assignment such as
    /// `guard = elector.wait_leader()?` evaluates the right side while the
    /// old guard still lives, and so waits forever. [`Status::held_back`]
    /// shows this state, and a warning is logged once it has lasted a lease
    /// duration.
    ///
    /// ```
    /// # use leaderelection::{Config, Elector, MemStore};
    /// # use std::time::Duration;
    /// # let config = Config::new(MemStore::new(), "jobs").retry_period(Duration::from_millis(50));
    /// # let elector = Elector::start(config)?;
    /// let mut guard = elector.wait_leader()?;
    /// # let mut rounds = 0;
    /// loop {
    ///     while guard.is_valid() {
    ///         // ... work, stamped with guard.fence() ...
    /// #       break;
    ///     }
    /// #   rounds += 1; if rounds == 2 { break; }
    ///     drop(guard); // first: an ended term's guard holds the next one back
    ///     guard = elector.wait_leader()?;
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`WaitLeaderError::Stopped`] once the elector has shut down.
    pub fn wait_leader(&self) -> Result<LeaderGuard, WaitLeaderError> {
        self.wait_leader_inner(None)
    }

    /// Like [`Elector::wait_leader`], giving up after `timeout`.
    ///
    /// # Errors
    ///
    /// [`WaitLeaderError::Timeout`] or [`WaitLeaderError::Stopped`].
    pub fn wait_leader_timeout(&self, timeout: Duration) -> Result<LeaderGuard, WaitLeaderError> {
        self.wait_leader_inner(Instant::now().checked_add(timeout))
    }

    /// Like [`Elector::wait_leader`], giving up at `deadline`.
    ///
    /// # Errors
    ///
    /// [`WaitLeaderError::Timeout`] or [`WaitLeaderError::Stopped`].
    pub fn wait_leader_deadline(&self, deadline: Instant) -> Result<LeaderGuard, WaitLeaderError> {
        self.wait_leader_inner(Some(deadline))
    }

    fn wait_leader_inner(&self, deadline: Option<Instant>) -> Result<LeaderGuard, WaitLeaderError> {
        let mut st = self.shared.state.lock();
        loop {
            if let Some(term) = st.term.as_ref().filter(|t| t.is_valid()) {
                return Ok(term.guard());
            }
            if st.stopped {
                return Err(WaitLeaderError::Stopped);
            }
            match deadline {
                Some(d) => {
                    if self.shared.changed.wait_until(&mut st, d).timed_out() {
                        if let Some(term) = st.term.as_ref().filter(|t| t.is_valid()) {
                            return Ok(term.guard());
                        }
                        return Err(if st.stopped { WaitLeaderError::Stopped } else { WaitLeaderError::Timeout });
                    }
                }
                None => self.shared.changed.wait(&mut st),
            }
        }
    }

    /// A snapshot of the election as this participant sees it, with its
    /// counters (terms, renewals, abandoned calls). Takes the state lock once
    /// and copies; cheap enough to call on every scrape or health check.
    pub fn status(&self) -> Status {
        let (name, identity) = (self.shared.name.clone(), self.shared.identity.clone());
        let st = self.shared.state.lock();
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
                seen_at: self.shared.origin.checked_add(o.at.as_duration()).unwrap_or(self.shared.origin),
            }),
            last_error: st.last_error.clone(),
            held_back: st.held_back,
            stopped: st.stopped,
        }
    }

    /// Ends the term (every guard turns invalid first), releases the lease
    /// unless release was disabled, and joins the elector's threads, including
    /// the `on_started_leading` thread. Calling it again does nothing.
    ///
    /// Blocks for at most about two operation timeouts plus however long
    /// `on_started_leading` takes to return once its guard is invalid: a
    /// renewal in flight is waited for (up to the operation timeout) before
    /// the release, since one that landed after the release would extend the
    /// lease again and keep the successor waiting a whole lease. Store calls
    /// still hung after that are left to finish on their own threads.
    ///
    /// # Errors
    ///
    /// The release failed or timed out; the lease then runs out on its own.
    pub fn shutdown(&self) -> Result<(), ElectionError> {
        self.stop(true)
    }

    /// Stops like [`Elector::shutdown`] but leaves the lease in place, so it
    /// runs out on its own after at most the lease duration, exactly as if
    /// the process had crashed. Guards still turn invalid first. For programs
    /// that must exit without one more round trip, and for failover tests.
    pub fn shutdown_without_release(&self) {
        let _ = self.stop(false);
    }

    fn stop(&self, release: bool) -> Result<(), ElectionError> {
        let mut threads = self.threads.lock();
        if let Some(result) = &threads.result {
            return result.clone();
        }
        let _ = self.cmd_tx.send(Command::Shutdown { release });
        let result = match threads.renewal.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(ElectionError::Stopped),
        };
        for handle in [threads.watchdog.take(), threads.callbacks.take()].into_iter().flatten() {
            let _ = handle.join();
        }
        threads.result = Some(result.clone());
        result
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl fmt::Debug for Elector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.shared.name)
            .field("identity", &self.shared.identity)
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>, StartError> {
    thread::Builder::new().name(name.to_owned()).spawn(f).map_err(StartError::Spawn)
}

/// An ended term whose guards are still alive, since when, and whether the
/// warning about it was logged.
struct HeldBack {
    term: Arc<TermShared>,
    since: Instant,
    warned: bool,
}

/// Events for the callback thread, in the order they happened.
enum Event {
    Started(LeaderGuard),
    Stopped,
    NewLeader(String, u64),
}

struct Driver {
    machine: Machine,
    shared: Arc<Shared>,
    callers: Callers,
    counters: Counters,
    cmd_tx: Sender<Command>,
    dog_tx: Sender<Arc<TermShared>>,
    events: Option<Sender<Event>>,
    /// `on_started_leading` is set.
    started_callback: bool,
    /// An ended term whose guards are still alive.
    held_back: Option<HeldBack>,
    lease_duration: Duration,
    /// `resign()` calls waiting for their release.
    resigners: Vec<(u64, Sender<Result<(), ElectionError>>)>,
    /// The last release's fence and result.
    last_release: Option<(u64, Result<(), ElectionError>)>,
    shutdown_result: Result<(), ElectionError>,
}

impl Driver {
    fn now(&self) -> LocalTime {
        LocalTime::from_duration(self.shared.origin.elapsed())
    }

    fn run(mut self, cmd_rx: Receiver<Command>) -> Result<(), ElectionError> {
        let now = self.now();
        self.machine.handle_timeout(now);
        loop {
            if self.drain() {
                break;
            }
            let wake = self.machine.poll_timeout().and_then(|t| self.shared.origin.checked_add(t.as_duration()));
            let wake = [wake, self.check_hold()].into_iter().flatten().min();
            let timeout = wake.map_or(crossbeam_channel::never(), crossbeam_channel::at);
            select! {
                recv(self.callers.reply_rx) -> msg => {
                    let now = self.now();
                    if let Ok(reply) = msg {
                        self.counters.call_returned(&mut self.shared.state.lock().figures, reply.op, reply.took);
                        self.machine.handle_reply(now, reply.id, reply.outcome);
                    }
                }
                recv(cmd_rx) -> cmd => {
                    let now = self.now();
                    match cmd {
                        Ok(Command::Shutdown { release: true }) | Err(_) => self.machine.shutdown(now),
                        Ok(Command::Shutdown { release: false }) => self.machine.shutdown_without_release(now),
                        Ok(Command::Resign(term, fence, reply)) => self.resign(now, term, fence, reply),
                        Ok(Command::GuardsGone(term)) => self.guards_gone(now, term),
                        Ok(Command::Expired(term)) => self.settle(now, term, EndReason::ExpiredLocally),
                    }
                }
                recv(timeout) -> _ => {
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
            }
        }
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

    /// Carries out the machine's outputs. Returns true once it has stopped.
    fn drain(&mut self) -> bool {
        // Status first, so whoever a term start wakes sees the lease behind it.
        self.publish();
        while let Some(out) = self.machine.poll_output() {
            match out {
                Output::Call(call) => {
                    let now = self.now();
                    if let Err(e) = self.callers.start(call) {
                        self.machine.handle_reply(now, call.id, e);
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
                    if let Some(reason) = ended {
                        let now = self.now();
                        self.settle(now, term, reason);
                    }
                }
                Output::TermEnded { term, reason, .. } => self.term_ended(term, reason),
                Output::NewLeader { identity, fence } => {
                    // Its own term's start has a line of its own.
                    let level = if identity == self.shared.identity { log::Level::Debug } else { log::Level::Info };
                    log::log!(
                        level,
                        "leaderelection: {:?}: leader is {identity:?} with fence {fence}",
                        self.shared.name
                    );
                    self.event(Event::NewLeader(identity, fence));
                }
                Output::Released { fence, result } => {
                    self.last_release = Some((fence, result.clone()));
                    if self.machine.is_stopping() {
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
                    self.publish();
                    return true;
                }
            }
        }
        self.publish();
        false
    }

    fn publish(&self) {
        let mut st = self.shared.state.lock();
        st.observed = self.machine.observed().cloned();
        st.last_error = self.machine.last_error().cloned();
        st.held_back = self.held_back.is_some();
    }

    fn event(&self, ev: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(ev);
        }
    }

    fn term_started(&mut self, id: TermId, fence: u64, deadline: LocalTime) {
        let term = Arc::new(
            TermShared::new(id, fence, self.shared.origin, deadline.as_duration(), Some(self.cmd_tx.clone()))
                .with_store(self.callers.term_store()),
        );
        log::info!("leaderelection: {:?}: {:?} leads with fence {fence}", self.shared.name, self.shared.identity);
        {
            let mut st = self.shared.state.lock();
            st.term = Some(Arc::clone(&term));
            self.counters.term_started(&mut st.figures);
            self.shared.changed.notify_all();
        }
        let _ = self.dog_tx.send(Arc::clone(&term));
        if self.started_callback {
            // Only a callback that will hold it gets a guard: a guard nobody
            // holds would be dropped at once and resign the term.
            let guard = term.guard();
            self.event(Event::Started(guard));
        }
    }

    fn term_ended(&mut self, id: TermId, reason: EndReason) {
        let (ended, first) = {
            let mut st = self.shared.state.lock();
            let Some(term) = st.term.take_if(|t| t.id == id) else { return };
            let first = term.end(reason);
            // Counted and logged for the reason that won, once per term.
            self.counters.term_ended(&mut st.figures, first.err().unwrap_or(reason));
            self.shared.changed.notify_all();
            (term, first)
        };
        self.log_end(ended.fence, first.err().unwrap_or(reason));
        self.event(Event::Stopped);
        if first == Err(EndReason::Resigned) {
            // The program let go of the term before the machine's own end
            // reached it: the term was resigned, and the back-off applies.
            let now = self.now();
            self.machine.resign(now, id);
        }
        if ended.guards() > 0 {
            self.held_back = Some(HeldBack { term: ended, since: Instant::now(), warned: false });
            let now = self.now();
            self.machine.set_hold_back(now, true);
        }
    }

    /// One line per term's end: `info` when the program or a shutdown ended
    /// it, `warn` with the cause when it ended early.
    fn log_end(&self, fence: u64, reason: EndReason) {
        let (name, id, why) = (&self.shared.name, &self.shared.identity, reason_name(reason));
        if matches!(reason, EndReason::Resigned | EndReason::Shutdown) {
            log::info!("leaderelection: {name:?}: {id:?} term with fence {fence} ended: {why}");
            return;
        }
        let cause = match self.machine.last_error() {
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

    /// Tells the machine how term `id` ended, as its shared state decided:
    /// once, whoever got there first.
    fn settle(&mut self, now: LocalTime, id: TermId, reason: EndReason) {
        // Only the program resigns and only a deadline expires a term behind
        // the machine's back; the other reasons come from the machine itself,
        // which has then ended the term already, so `expire` finds nothing.
        match reason {
            EndReason::Resigned => self.machine.resign(now, id),
            _ => self.machine.expire(now, id),
        }
    }

    fn guards_gone(&mut self, now: LocalTime, id: TermId) {
        let resigned = {
            let st = self.shared.state.lock();
            st.term.as_ref().is_some_and(|t| t.id == id && t.was_resigned())
        };
        if resigned {
            // The program let go of a live term (its last guard ended it):
            // hand it over.
            self.settle(now, id, EndReason::Resigned);
        }
        if self.held_back.as_ref().is_some_and(|h| h.term.id == id && h.term.guards() == 0) {
            self.held_back = None;
            self.machine.set_hold_back(now, false);
        }
    }

    fn resign(&mut self, now: LocalTime, id: TermId, fence: u64, reply: Sender<Result<(), ElectionError>>) {
        self.machine.resign(now, id);
        if self.machine.releasing() == Some(fence) {
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
    fn check_hold(&mut self) -> Option<Instant> {
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
            crate::error::Human::about(held.since.elapsed()),
        );
        None
    }
}

/// The watchdog: ends each term at its deadline, whatever the renewal thread
/// is doing. It takes only the state lock, which no thread holds across I/O.
fn watchdog(shared: Arc<Shared>, terms: Receiver<Arc<TermShared>>) {
    let mut current: Option<Arc<TermShared>> = None;
    loop {
        let wake = match current.as_ref().filter(|t| !t.is_ended()) {
            Some(t) => crossbeam_channel::at(t.deadline()),
            None => crossbeam_channel::never(),
        };
        select! {
            recv(terms) -> msg => match msg {
                Ok(term) => current = Some(term),
                Err(_) => return,
            },
            recv(wake) -> _ => {
                // Re-read: a renewal may have moved the deadline meanwhile.
                let Some(term) = current.take() else { continue };
                if Instant::now() < term.deadline() {
                    current = Some(term);
                    continue;
                }
                if term.expire() {
                    // The renewal thread logs the term's end when it hears.
                    log::debug!(
                        "leaderelection: {:?}: {:?} stepped down at its local deadline (fence {})",
                        shared.name, shared.identity, term.fence
                    );
                    let mut st = shared.state.lock();
                    if st.term.as_ref().is_some_and(|t| Arc::ptr_eq(t, &term)) {
                        let cause = st.last_error.take().map(Box::new);
                        st.last_error = Some(ElectionError::LeaseExpiredLocally { cause });
                    }
                    shared.changed.notify_all();
                }
            }
        }
    }
}

/// Runs the callbacks in the order events happened.
fn callbacks(
    events: Receiver<Event>,
    started: Option<Arc<StartedFn>>,
    stopped: Option<Arc<StoppedFn>>,
    new_leader: Option<Arc<NewLeaderFn>>,
) {
    let mut leading: Option<JoinHandle<()>> = None;
    for ev in events {
        match ev {
            Event::Started(guard) => {
                let Some(f) = started.clone() else { continue };
                let h = thread::Builder::new().name("leaderelection-leading".into()).spawn(move || f(guard));
                match h {
                    Ok(h) => leading = Some(h),
                    Err(e) => log::warn!("leaderelection: cannot spawn the on_started_leading thread: {e}"),
                }
            }
            Event::Stopped => {
                if let Some(h) = leading.take() {
                    if h.join().is_err() {
                        log::warn!("leaderelection: on_started_leading panicked");
                    }
                }
                if let Some(f) = &stopped {
                    if catch_unwind(AssertUnwindSafe(|| f())).is_err() {
                        log::warn!("leaderelection: on_stopped_leading panicked");
                    }
                }
            }
            Event::NewLeader(id, fence) => {
                if let Some(f) = &new_leader {
                    if catch_unwind(AssertUnwindSafe(|| f(&id, fence))).is_err() {
                        log::warn!("leaderelection: on_new_leader panicked");
                    }
                }
            }
        }
    }
    if let Some(h) = leading.take() {
        let _ = h.join();
    }
}

/// Worker threads that run store calls, so the renewal thread never blocks on
/// the database. A call abandoned at the operation timeout keeps its thread
/// until the store returns; at most [`MAX_CALL_THREADS`] threads exist.
struct Callers {
    store: Arc<dyn Store>,
    name: Arc<str>,
    identity: Arc<str>,
    payload: Arc<[u8]>,
    timeout: Duration,
    job_tx: Sender<Job>,
    job_rx: Receiver<Job>,
    reply_tx: Sender<Reply>,
    reply_rx: Receiver<Reply>,
    idle: Arc<AtomicUsize>,
    alive: Arc<AtomicUsize>,
}

struct Job {
    call: Call,
    store: Arc<dyn Store>,
    name: Arc<str>,
    identity: Arc<str>,
    payload: Arc<[u8]>,
    timeout: Duration,
}

impl Callers {
    /// What a term's guards need for calls of their own.
    fn term_store(&self) -> Arc<TermStore> {
        Arc::new(TermStore {
            store: Arc::clone(&self.store),
            name: Arc::clone(&self.name),
            identity: Arc::clone(&self.identity),
            timeout: self.timeout,
        })
    }

    fn new(config: &Config, identity: String) -> Callers {
        let (job_tx, job_rx) = crossbeam_channel::unbounded();
        let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
        Callers {
            store: Arc::clone(&config.store),
            name: config.name.as_str().into(),
            identity: identity.into(),
            payload: config.payload.as_slice().into(),
            timeout: config.timing.operation_timeout,
            job_tx,
            job_rx,
            reply_tx,
            reply_rx,
            idle: Arc::new(AtomicUsize::new(0)),
            alive: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Hands `call` to an idle worker, spawning one if none is idle.
    fn start(&mut self, call: Call) -> Result<(), Outcome> {
        if self.idle.load(Ordering::Acquire) == 0 {
            let alive = self.alive.load(Ordering::Acquire);
            if alive >= MAX_CALL_THREADS {
                return Err(failed(call.op, ElectionError::TooManyHungCalls { hung: alive }));
            }
            let (jobs, replies, idle, count) =
                (self.job_rx.clone(), self.reply_tx.clone(), Arc::clone(&self.idle), Arc::clone(&self.alive));
            count.fetch_add(1, Ordering::AcqRel);
            idle.fetch_add(1, Ordering::AcqRel);
            let spawned = thread::Builder::new().name("leaderelection-call".into()).spawn(move || {
                for job in jobs {
                    idle.fetch_sub(1, Ordering::AcqRel);
                    let (id, op, sent) = (job.call.id, job.call.op.kind(), Instant::now());
                    let outcome = run_call(&job);
                    let took = sent.elapsed();
                    idle.fetch_add(1, Ordering::AcqRel);
                    if replies.send(Reply { id, op, took, outcome }).is_err() {
                        break;
                    }
                }
                idle.fetch_sub(1, Ordering::AcqRel);
                count.fetch_sub(1, Ordering::AcqRel);
            });
            if let Err(e) = spawned {
                self.alive.fetch_sub(1, Ordering::AcqRel);
                self.idle.fetch_sub(1, Ordering::AcqRel);
                let err = StoreError::retryable("cannot spawn a store-call thread").with_source(e);
                return Err(failed(call.op, ElectionError::store(call.op.kind(), err)));
            }
        }
        let job = Job {
            call,
            store: Arc::clone(&self.store),
            name: Arc::clone(&self.name),
            identity: Arc::clone(&self.identity),
            payload: Arc::clone(&self.payload),
            timeout: self.timeout,
        };
        self.job_tx.send(job).map_err(|_| failed(call.op, ElectionError::Stopped))
    }
}

/// A store call's answer, and how long the store took to give it.
struct Reply {
    id: CallId,
    op: OpKind,
    took: Duration,
    outcome: Outcome,
}

fn failed(op: Op, e: ElectionError) -> Outcome {
    let err = match e {
        ElectionError::Store { error, .. } => error,
        other => StoreError::retryable(other.to_string()),
    };
    match op {
        Op::Release { .. } => Outcome::Released(Err(err)),
        _ => Outcome::Lease(Err(err)),
    }
}

fn run_call(job: &Job) -> Outcome {
    let result = catch_unwind(AssertUnwindSafe(|| {
        job.call.op.run(&*job.store, &job.name, &job.identity, &job.payload, job.timeout)
    }));
    result.unwrap_or_else(|_| {
        failed(job.call.op, ElectionError::store(job.call.op.kind(), StoreError::fatal("store call panicked")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_failed_identity_says_why_and_keeps_its_cause() {
        let e = StartError::Identity(IdentityError::from_getrandom(getrandom::Error::UNSUPPORTED));
        let text = e.to_string();
        assert!(text.starts_with("cannot start elector: cannot generate an identity"), "{text}");
        assert!(e.source().is_some_and(|s| s.to_string().contains("system randomness failed")));
    }
}
