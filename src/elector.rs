//! The threaded driver: a renewal thread that runs the state machine, a
//! watchdog that ends terms at their deadline, worker threads for store calls,
//! and a thread for callbacks.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};

use crate::config::{Config, NewLeaderFn, StartedFn, StoppedFn};
use crate::error::{ElectionError, OpKind};
use crate::guard::{Command, TermShared, TermStore};
use crate::handoff::{watchdog_fired, Event, Handoff, Outside, Shared, State};
use crate::identity::{default_identity, with_instance, IdentityError};
use crate::machine::{Call, CallId, LocalTime, Machine, MachineConfig, Op, Outcome};
use crate::status::Counters;
use crate::store::{Released, Store, StoreError};
use crate::sync::{Condvar, Mutex};
use crate::workers::{catching, NotStarted, Workers};
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

use crate::threads::Threads;

/// Why [`Elector::start`] or [`Group::start`](crate::Group::start) refused.
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
            StartError::Config(e) => write!(f, "cannot start: {e}"),
            StartError::Identity(e) => write!(f, "cannot start: {e}"),
            StartError::Spawn(e) => write!(f, "cannot start: spawning a thread failed: {e}"),
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

pub use crate::error::WaitLeaderError;

impl Elector {
    crate::handoff::one_election_calls!(
        "Elector",
        /// This participant's identity as the lease row shows it: the
        /// configured identity, `#` and this elector's instance tag
        /// (`web#3f9c2b4e8a1d7c05`). Compare it with
        /// [`Status::leader`](crate::Status::leader)'s identity; see
        /// [`Config::identity`](crate::Config::identity).
        identity;
        /// Blocks until this participant leads and returns a guard on the term.
        ///
        /// **Drop the old guard before waiting again.** While any guard of an
        /// ended term is alive, the elector does not campaign, so two terms of
        /// one process never overlap in user code. An assignment such as
        /// `guard = elector.wait_leader()?` evaluates the right side while the
        /// old guard still lives, and so waits forever. [`Status::held_back`](crate::Status::held_back)
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
        wait_leader;
    );

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
            #[cfg(loom)]
            mutant: None,
        });
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let (dog_tx, dog_rx) = crossbeam_channel::unbounded();
        let mut threads = Threads::default();

        let dog_shared = Arc::clone(&shared);
        threads.others.push(spawn("leaderelection-watchdog", move || watchdog(dog_shared, dog_rx))?);

        let has_callbacks = config.on_started_leading.is_some()
            || config.on_stopped_leading.is_some()
            || config.on_new_leader.is_some();
        let events = if has_callbacks {
            let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
            let (started, stopped, new_leader) =
                (config.on_started_leading.clone(), config.on_stopped_leading.clone(), config.on_new_leader.clone());
            match spawn("leaderelection-callbacks", move || callbacks(ev_rx, started, stopped, new_leader)) {
                Ok(h) => threads.others.push(h),
                Err(e) => {
                    drop(dog_tx);
                    return Err(e);
                }
            }
            Some(ev_tx)
        } else {
            None
        };

        let outside =
            Threaded { origin: shared.origin, callers: Callers::new(&config, shared.identity.clone()), dog_tx, events };
        let handoff = Handoff::new(
            outside,
            Arc::clone(&shared),
            Counters::new(&config.name),
            cmd_tx.clone(),
            config.on_started_leading.is_some(),
            config.timing.lease_duration,
        );
        let releases = config.store.releases().unwrap_or_else(crossbeam_channel::never);
        let driver = Driver { machine, handoff, name: config.name.clone(), releases };
        threads.driver = Some(spawn("leaderelection-renewal", move || driver.run(cmd_rx))?);
        Ok(Elector { shared, cmd_tx, threads: Mutex::new(threads) })
    }

    crate::handoff::stop_calls!(
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
        shutdown;
        /// Stops like [`Elector::shutdown`] but leaves the lease in place, so it
        /// runs out on its own after at most the lease duration, exactly as if
        /// the process had crashed. Guards still turn invalid first. For programs
        /// that must exit without one more round trip, and for failover tests.
        shutdown_without_release;
        by stop
    );

    fn stop(&self, release: bool) -> Result<(), ElectionError> {
        self.threads.lock().join(|| {
            let _ = self.cmd_tx.send(Command::Shutdown { release });
        })
    }
}

crate::handoff::one_election_handle!(Elector, dropped: shutdown);

fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>, StartError> {
    thread::Builder::new().name(name.to_owned()).spawn(f).map_err(StartError::Spawn)
}

/// The renewal thread: the state machine, and the hand-off around it with
/// the real threads outside.
struct Driver {
    machine: Machine,
    handoff: Handoff<Threaded>,
    /// The election's name, to pick its own out of `releases`.
    name: String,
    /// The store's feed of released elections ([`Store::releases`]), or
    /// a channel that never delivers.
    releases: Receiver<Released>,
}

/// What the hand-off reaches outside itself: the clock, the store-call
/// workers, the watchdog, the callback thread.
struct Threaded {
    origin: Instant,
    callers: Callers,
    dog_tx: Sender<Arc<TermShared>>,
    events: Option<Sender<Event>>,
}

impl Outside for Threaded {
    fn now(&self) -> LocalTime {
        LocalTime::from_duration(self.origin.elapsed())
    }

    fn start_call(&mut self, call: Call) -> Result<(), Outcome> {
        self.callers.start(call)
    }

    fn term_store(&self) -> Option<Arc<TermStore>> {
        Some(self.callers.term_store())
    }

    fn watch(&mut self, term: &Arc<TermShared>) {
        let _ = self.dog_tx.send(Arc::clone(term));
    }

    fn event(&mut self, ev: Event) {
        if let Some(tx) = &self.events {
            let _ = tx.send(ev);
        }
    }
}

impl Driver {
    fn now(&self) -> LocalTime {
        self.handoff.outside.now()
    }

    fn run(mut self, cmd_rx: Receiver<Command>) -> Result<(), ElectionError> {
        let now = self.now();
        self.machine.handle_timeout(now);
        loop {
            if self.handoff.drain(&mut self.machine) {
                break;
            }
            let origin = self.handoff.outside.origin;
            let wake = self.machine.poll_timeout().and_then(|t| origin.checked_add(t.as_duration()));
            let wake = [wake, self.handoff.check_hold()].into_iter().flatten().min();
            let timeout = wake.map_or(crossbeam_channel::never(), crossbeam_channel::at);
            select! {
                recv(self.handoff.outside.callers.workers.replies) -> msg => {
                    let now = self.now();
                    if let Ok(reply) = msg {
                        self.handoff.call_returned(reply.op, reply.took);
                        self.machine.handle_reply(now, reply.id, reply.outcome);
                    }
                }
                recv(cmd_rx) -> cmd => {
                    let now = self.now();
                    match cmd {
                        Ok(cmd) => self.handoff.command(&mut self.machine, now, cmd),
                        Err(_) => self.machine.shutdown(now),
                    }
                }
                recv(self.releases) -> released => match released {
                    Ok(r) if r.name == self.name => {
                        let now = self.now();
                        self.machine.handle_wake(now, r.fence);
                    }
                    Ok(_) => {}
                    // The feed ended: learn of releases by polling alone.
                    Err(_) => self.releases = crossbeam_channel::never(),
                },
                recv(timeout) -> _ => {
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
            }
        }
        self.handoff.finish()
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
                current = watchdog_fired(&shared, term, Instant::now());
            }
        }
    }
}

/// Runs the callbacks in the order events happened.
fn callbacks(
    events: Receiver<Event>, started: Option<Arc<StartedFn>>, stopped: Option<Arc<StoppedFn>>,
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

/// The elector's store calls on [`Workers`], so the renewal thread never
/// blocks on the database. A call abandoned at the operation timeout keeps
/// its thread until the store returns; at most [`MAX_CALL_THREADS`] threads
/// exist.
struct Callers {
    store: Arc<dyn Store>,
    name: Arc<str>,
    identity: Arc<str>,
    payload: Arc<[u8]>,
    timeout: Duration,
    workers: Workers<Job, Reply>,
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
        Callers {
            store: Arc::clone(&config.store),
            name: config.name.as_str().into(),
            identity: identity.into(),
            payload: config.payload.as_slice().into(),
            timeout: config.timing.operation_timeout,
            workers: Workers::new(
                "leaderelection-call",
                MAX_CALL_THREADS,
                config.timing.operation_timeout,
                |job: Job| {
                    let (id, op, sent) = (job.call.id, job.call.op.kind(), Instant::now());
                    let outcome = run_call(&job);
                    Reply { id, op, took: sent.elapsed(), outcome }
                },
                // It waited out the operation timeout for a worker: the
                // machine has abandoned it already.
                |job: Job| {
                    let (id, op) = (job.call.id, job.call.op.kind());
                    let outcome = failed(job.call.op, ElectionError::Timeout { op, after: job.timeout });
                    Reply { id, op, took: Duration::ZERO, outcome }
                },
            ),
        }
    }

    /// Hands `call` to an idle worker, spawning one if none is idle.
    fn start(&mut self, call: Call) -> Result<(), Outcome> {
        let job = Job {
            call,
            store: Arc::clone(&self.store),
            name: Arc::clone(&self.name),
            identity: Arc::clone(&self.identity),
            payload: Arc::clone(&self.payload),
            timeout: self.timeout,
        };
        self.workers.start(job).map_err(|(_, why)| failed(call.op, not_started(why)))
    }
}

/// Why a store call could not start, as the error its caller sees.
pub(crate) fn not_started(why: NotStarted) -> ElectionError {
    match why {
        NotStarted::Hung(hung) => ElectionError::TooManyHungCalls { hung },
        NotStarted::Spawn(e) => ElectionError::store(
            OpKind::Inspect,
            StoreError::retryable("cannot spawn a store-call thread").with_source(e),
        ),
        NotStarted::Stopped => ElectionError::Stopped,
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
    catching(
        || job.call.op.run(&*job.store, &job.name, &job.identity, &job.payload, job.timeout),
        || failed(job.call.op, ElectionError::store(job.call.op.kind(), StoreError::fatal("store call panicked"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;
    use crate::timing::Timing;
    use std::error::Error as _;

    #[test]
    fn a_failed_identity_says_why_and_keeps_its_cause() {
        let e = StartError::Identity(IdentityError::from_getrandom(getrandom::Error::UNSUPPORTED));
        let text = e.to_string();
        assert!(text.starts_with("cannot start: cannot generate an identity"), "{text}");
        assert!(e.source().is_some_and(|s| s.to_string().contains("system randomness failed")));
    }

    // What the caller of a call that could not start sees: a thread the
    // system would not give is a retryable store error keeping the system's
    // error as its source; workers shutting down is the elector stopping.
    #[test]
    fn a_call_that_cannot_start_fails_as_the_caller_can_act_on() {
        let spawn = not_started(NotStarted::Spawn(std::io::Error::other("Resource temporarily unavailable")));
        assert_eq!(
            spawn.to_string(),
            "inspect failed: cannot spawn a store-call thread: Resource temporarily unavailable"
        );
        let error = spawn.store_error().expect("a store error");
        assert!(error.is_retryable(), "{error}");
        assert!(error.source().is_some_and(|s| s.to_string() == "Resource temporarily unavailable"), "{error:?}");
        assert!(matches!(not_started(NotStarted::Stopped), ElectionError::Stopped));
        assert!(matches!(not_started(NotStarted::Hung(4)), ElectionError::TooManyHungCalls { hung: 4 }));
    }

    /// A store whose calls wait until the gate opens (at most 10 s), then
    /// find no lease. It counts the calls that reached it.
    #[derive(Clone, Default)]
    struct Gate(Arc<(parking_lot::Mutex<(usize, bool)>, parking_lot::Condvar)>);

    impl Gate {
        fn pass(&self, name: &str) -> StoreError {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut state = self.0 .0.lock();
            state.0 += 1;
            self.0 .1.notify_all();
            while !state.1 && Instant::now() < deadline {
                self.0 .1.wait_for(&mut state, Duration::from_millis(100));
            }
            StoreError::no_lease(name)
        }

        /// Waits (at most 10 s) until `n` calls have reached the store.
        fn reached(&self, n: usize) -> bool {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut state = self.0 .0.lock();
            while state.0 < n && Instant::now() < deadline {
                self.0 .1.wait_for(&mut state, Duration::from_millis(100));
            }
            state.0 >= n
        }

        fn open(&self) {
            self.0 .0.lock().1 = true;
            self.0 .1.notify_all();
        }
    }

    impl Store for Gate {
        fn acquire(&self, name: &str, _: &str, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
            Err(self.pass(name))
        }
        fn renew(&self, name: &str, _: &str, _: u64, _: Duration, _: &[u8], _: Duration) -> Result<Lease, StoreError> {
            Err(self.pass(name))
        }
        fn release(&self, name: &str, _: &str, _: u64, _: Duration) -> Result<(), StoreError> {
            Err(self.pass(name))
        }
        fn inspect(&self, name: &str, _: Duration) -> Result<Lease, StoreError> {
            Err(self.pass(name))
        }
    }

    fn error(outcome: &Outcome) -> Option<&StoreError> {
        match outcome {
            Outcome::Lease(r) => r.as_ref().err(),
            Outcome::Released(r) => r.as_ref().err(),
        }
    }

    // Every worker busy but none hung yet: the next call waits for one. If
    // none comes free within the operation timeout the machine has given it
    // up already, so it is not sent: its answer is the timeout.
    #[test]
    fn a_call_that_waited_out_the_operation_timeout_for_a_worker_is_not_sent() {
        let gate = Gate::default();
        let timeout = Duration::from_millis(50);
        let timing = Timing { operation_timeout: timeout, ..Timing::default() };
        let mut callers = Callers::new(&Config::new(gate.clone(), "jobs").timing(timing), "a#1".into());
        let ttl = Duration::from_secs(15);
        let ops = [Op::Acquire { ttl }, Op::Renew { fence: 7, ttl }, Op::Release { fence: 7 }, Op::Inspect];
        assert_eq!(ops.len(), MAX_CALL_THREADS);
        for (id, op) in (0..).zip(ops) {
            assert!(callers.start(Call { id: CallId(id), op }).is_ok(), "call {id} refused");
            assert!(gate.reached(id as usize + 1), "call {id} never reached the store");
        }
        let waits = Call { id: CallId(MAX_CALL_THREADS as u64), op: Op::Inspect };
        assert!(callers.start(waits).is_ok(), "refused, though no worker is hung yet");
        assert_eq!(callers.workers.alive(), MAX_CALL_THREADS);
        let queued = Instant::now();
        while queued.elapsed() <= timeout {
            thread::sleep(timeout); // the queued call's age, not a wait for an outcome
        }
        gate.open();
        let mut replies = Vec::new();
        for _ in 0..=MAX_CALL_THREADS {
            replies.push(callers.workers.replies.recv_timeout(Duration::from_secs(10)).expect("every call answered"));
        }
        let (sent, expired): (Vec<_>, Vec<_>) = replies.into_iter().partition(|r| r.took > Duration::ZERO);
        assert_eq!(sent.len(), MAX_CALL_THREADS, "the store answered the calls the workers took");
        assert!(sent.iter().all(|r| error(&r.outcome).is_some_and(StoreError::is_no_lease)));
        let [expired] = expired.as_slice() else { panic!("{} calls not sent", expired.len()) };
        assert_eq!((expired.id, expired.op), (CallId(MAX_CALL_THREADS as u64), OpKind::Inspect));
        let e = error(&expired.outcome).expect("the call that waited failed");
        assert!(e.is_retryable() && matches!(expired.outcome, Outcome::Lease(_)), "{e}");
        assert_eq!(e.message(), "inspect gave no answer within 50ms");
    }
}
