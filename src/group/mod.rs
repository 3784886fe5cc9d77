//! Many elections in one process, on a handful of threads: [`Group`].
//!
//! Sharded work needs one leader per shard, tenant, queue or partition, and
//! so thousands of elections per process. An [`Elector`](crate::Elector) per
//! election would cost three threads and its own store calls each. A
//! [`Group`] runs them all on one driver thread, one watchdog, at most
//! [`MAX_GROUP_CALL_THREADS`] (two) store-call workers (and one callback
//! thread when callbacks are set), whatever the number of elections, and sends
//! their store calls in batches: every renewal due in the same tick as one
//! call ([`Store::renew_many`](crate::Store::renew_many)), every follower's
//! look as one call, claims and releases likewise. Each election is still
//! decided by its own row on the database's clock, and each keeps every
//! guarantee of a single elector: its own [`Machine`](crate::machine::Machine),
//! deadline anchored at the batch's send, watchdog, guards, fences.
//!
//! ```
//! use leaderelection::{Config, Group, GroupConfig, MemStore};
//! use std::time::Duration;
//!
//! let store = MemStore::new();
//! let group = Group::start(GroupConfig::new(Config::new(store, "shards").identity("web-1")))?;
//! let shards: Vec<_> = (0..8).map(|i| group.join(&format!("shard-{i}"))).collect::<Result<_, _>>()?;
//! let guard = shards[3].wait_leader_timeout(Duration::from_secs(5))?;
//! assert!(guard.is_valid());                 // as with an Elector: ask before every write
//! drop(guard);                               // resigns shard-3's term
//! group.shutdown()?;                         // every term ends, every lease is released
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # A fair share
//!
//! Run the same group in several processes with
//! [`GroupConfig::fair_share`] and each leads at most about its share of the
//! elections: their number divided by the live members, rounded up. Members
//! count each other through a heartbeat on the database
//! ([`Store::heartbeat`](crate::Store::heartbeat)); a member that joins
//! makes the others resign their surplus, and a member that dies has its
//! elections taken over once its leases and its heartbeat expire. The
//! mechanics, the convergence time and the bound on hand-overs are in
//! [`core`]'s docs and the repository's `docs/design.md` (Many elections).
//!
//! # Callbacks
//!
//! A group's callbacks name the election and all run on one thread, in the
//! order things happened: [`GroupConfig::on_started_leading`] gets the
//! term's guard and must return promptly. Keep the guard (hand it to a
//! worker of yours) to keep the term: dropping the last guard resigns, as
//! everywhere.

pub mod core;
mod driver;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::config::{check_text, Config, ConfigError, Problem, Timing, MAX_DURATION, MAX_NAME_LEN, MAX_PAYLOAD_LEN};
use crate::elector::StartError;
use crate::error::ElectionError;
use crate::guard::LeaderGuard;
use crate::handoff::Shared;
use crate::store::StoreError;
use crate::sync::Mutex;

use self::core::ElectionKey;
use self::driver::{Command, GroupShared};

/// The most store-call worker threads a group runs: the renewal batch and
/// the heartbeat may go out on one grid instant, the followers' looks go on
/// another (see [`core`]), and a call that finds both workers busy waits
/// for one. Two, so that a process with a group stays within eight threads
/// with a store that uses a thread of its own per call in flight (the
/// MySQL store does) or a pool's (the PostgreSQL store's r2d2 has two). A
/// call abandoned at the operation timeout keeps its worker until the store
/// returns; when both are stuck past it, new calls fail at once.
pub const MAX_GROUP_CALL_THREADS: usize = 2;

/// Runs for each term on the group's callback thread: the election's name
/// and the term's guard.
pub(crate) type GroupStartedFn = dyn Fn(&str, LeaderGuard) + Send + Sync;
/// Runs after each term ends: the election's name.
pub(crate) type GroupStoppedFn = dyn Fn(&str) + Send + Sync;
/// Runs when a new term is seen: the election, the holder, its fence.
pub(crate) type GroupNewLeaderFn = dyn Fn(&str, &str, u64) + Send + Sync;

/// How a [`Group`] runs: a template [`Config`] for every election, and the
/// group's own settings.
///
/// The template gives the store, the group's name (its `name`: what the
/// members count themselves under), this participant's identity, the
/// payload each election publishes unless [`Group::join_with_payload`]
/// says otherwise, the timings and the release setting. Its callbacks are
/// not used (a group's take the election's name): setting one is refused.
///
/// # Examples
///
/// ```
/// use leaderelection::{Config, GroupConfig, MemStore};
/// use std::time::Duration;
///
/// let template = Config::new(MemStore::new(), "shards")
///     .lease_duration(Duration::from_secs(5))
///     .renew_interval(Duration::from_secs(1))
///     .retry_period(Duration::from_secs(1))
///     .operation_timeout(Duration::from_secs(1));
/// let config = GroupConfig::new(template).fair_share(true);
/// assert!(config.validate().is_ok());
/// assert_eq!(config.get_tick(), Duration::from_millis(250));
/// ```
#[derive(Clone)]
pub struct GroupConfig {
    pub(crate) template: Config,
    pub(crate) fair_share: bool,
    pub(crate) tick: Option<Duration>,
    pub(crate) on_started_leading: Option<Arc<GroupStartedFn>>,
    pub(crate) on_stopped_leading: Option<Arc<GroupStoppedFn>>,
    pub(crate) on_new_leader: Option<Arc<GroupNewLeaderFn>>,
}

impl GroupConfig {
    /// A group run by `template` (see the type's docs), without a fair
    /// share, on the default grid.
    pub fn new(template: Config) -> GroupConfig {
        GroupConfig {
            template,
            fair_share: false,
            tick: None,
            on_started_leading: None,
            on_stopped_leading: None,
            on_new_leader: None,
        }
    }

    crate::setters::setters!(GroupConfig {
        /// Lead at most about a fair share of the elections: the number of
        /// elections divided by the number of live members of the group,
        /// rounded up. Needs a store that keeps members
        /// ([`Store::heartbeat`](crate::Store::heartbeat); the built-in stores
        /// do). Defaults to off: every participant claims whatever it finds
        /// free.
        fair_share(on: bool) => fair_share = on;

        /// The grid step on which the group's timers fire (see
        /// [`core`]). Defaults to the largest step that divides both the
        /// renew interval and the retry period and is at most a quarter of the
        /// shorter ([`core::default_tick`]).
        tick(tick: Duration) => tick = Some(tick);
    });

    /// Runs `f(election, guard)` on the group's callback thread for each
    /// term. Return promptly: every callback of the group waits for it.
    /// Keep the guard (send it to a thread of yours) for as long as you
    /// work under the term; dropping it resigns the term.
    pub fn on_started_leading(mut self, f: impl Fn(&str, LeaderGuard) + Send + Sync + 'static) -> GroupConfig {
        self.on_started_leading = Some(Arc::new(f));
        self
    }

    /// Runs `f(election)` on the callback thread after each term ends.
    pub fn on_stopped_leading(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> GroupConfig {
        self.on_stopped_leading = Some(Arc::new(f));
        self
    }

    /// Runs `f(election, identity, fence)` on the callback thread whenever
    /// a new term of an election is seen, this participant's own included.
    /// Advisory.
    pub fn on_new_leader(mut self, f: impl Fn(&str, &str, u64) + Send + Sync + 'static) -> GroupConfig {
        self.on_new_leader = Some(Arc::new(f));
        self
    }

    /// The grid step in force (set, or the default for the timings).
    pub fn get_tick(&self) -> Duration {
        self.tick.unwrap_or_else(|| core::default_tick(&self.template.timing))
    }

    /// Checks the template as [`Config::validate`] does, and what a group
    /// needs beyond it: no callbacks on the template; a tick no longer
    /// than the renew interval or the retry period; and the timing
    /// invariant with the tick added (a group notices a timed-out call at
    /// its next grid instant):
    /// `renew_interval + 2*operation_timeout + retry_delay + tick <= lease_duration - safety_margin`.
    ///
    /// # Errors
    ///
    /// The first problem found, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.template.validate()?;
        let t = &self.template;
        for (field, set) in [
            ("on_started_leading", t.on_started_leading.is_some()),
            ("on_stopped_leading", t.on_stopped_leading.is_some()),
            ("on_new_leader", t.on_new_leader.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(field, Problem::NotForGroups));
            }
        }
        let timing: Timing = t.timing;
        let tick = self.get_tick();
        if tick.is_zero() {
            return Err(ConfigError::new("tick", Problem::Zero));
        }
        if tick > MAX_DURATION {
            return Err(ConfigError::new("tick", Problem::TooLongDuration { value: tick, max: MAX_DURATION }));
        }
        let limit = timing.renew_interval.min(timing.retry_period);
        if tick > limit {
            return Err(ConfigError::new("tick", Problem::TickTooLong { tick, limit }));
        }
        let needed = timing
            .renew_interval
            .saturating_add(timing.operation_timeout.saturating_mul(2))
            .saturating_add(timing.retry_delay())
            .saturating_add(tick);
        let available = timing.lease_duration - timing.safety_margin;
        if needed > available {
            return Err(ConfigError::new("tick", Problem::GroupTimingInvariant { timing, tick, needed, available }));
        }
        Ok(())
    }
}

impl fmt::Debug for GroupConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupConfig")
            .field("template", &self.template)
            .field("fair_share", &self.fair_share)
            .field("tick", &self.get_tick())
            .finish_non_exhaustive()
    }
}

/// Why [`Group::join`] refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum JoinError {
    /// The name or payload is invalid.
    Config(ConfigError),
    /// The group already runs an election of that name.
    Duplicate(String),
    /// The group has shut down (or is shutting down).
    Stopped,
    /// This run of the group has joined 2³² − 1 elections, the most it
    /// numbers; it keeps running those it has. Start a new [`Group`] for more.
    OutOfKeys,
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Config(e) => write!(f, "cannot join the election: {e}"),
            JoinError::Duplicate(name) => write!(f, "cannot join the election {name:?}: the group already runs it"),
            JoinError::Stopped => f.write_str("cannot join the election: the group has stopped"),
            JoinError::OutOfKeys => f.write_str(
                "cannot join the election: this group has joined 4294967295 elections, the most one run numbers; \
                 start a new Group",
            ),
        }
    }
}

impl std::error::Error for JoinError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JoinError::Config(e) => Some(e),
            _ => None,
        }
    }
}

/// A snapshot of a group as this participant sees it. Cheap: one lock.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group's name.
    pub name: String,
    /// This participant's identity in every election of the group.
    pub identity: String,
    /// Elections the group runs (leaving ones included).
    pub elections: usize,
    /// Elections this participant leads (terms live by its state machines;
    /// each election's [`Election::is_leader`] is the exact answer).
    pub leading: usize,
    /// Elections with a claim in flight.
    pub claiming: usize,
    /// With a fair share: live members by the last heartbeat.
    pub live_members: Option<u32>,
    /// With a fair share: the most elections this participant may lead now
    /// (0 before the first heartbeat answer, or when it is too old).
    pub share: Option<usize>,
    /// Terms resigned to come down to the share.
    pub shed: u64,
    /// Store calls sent: batches, heartbeats, leaves.
    pub calls: u64,
    /// Calls that failed as a whole (every item with the same error).
    pub calls_failed: u64,
    /// How long the last call took.
    pub last_call_rtt: Option<Duration>,
    /// The slowest call so far.
    pub slowest_call: Option<Duration>,
    /// The last whole-call failure (or heartbeat failure), cleared by the
    /// next call that succeeds.
    pub last_error: Option<StoreError>,
    /// Worker threads for store calls that exist now.
    pub call_threads: usize,
    /// Whether the group has shut down.
    pub stopped: bool,
}

/// Many elections of one participant on a handful of threads. See the
/// [module docs](self).
///
/// [`Group::start`] spawns the threads; [`Group::join`] adds an election
/// and returns its [`Election`] handle; [`Group::shutdown`] (or `Drop`)
/// ends every term, releases every lease in one batch, leaves the members
/// and joins the threads.
pub struct Group {
    shared: Arc<GroupShared>,
    threads: Mutex<driver::Threads>,
}

impl Group {
    /// Validates `config` and spawns the group's driver and watchdog
    /// threads (and a callback thread when callbacks are set). Returns at
    /// once, with no election yet.
    ///
    /// # Errors
    ///
    /// [`StartError::Config`] for an invalid configuration,
    /// [`StartError::Identity`] when an identity must be generated and the
    /// system's randomness fails, [`StartError::Spawn`] when a thread
    /// cannot be started.
    pub fn start(config: GroupConfig) -> Result<Group, StartError> {
        config.validate()?;
        let (shared, threads) = driver::start(config)?;
        Ok(Group { shared, threads: Mutex::new(threads) })
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// This participant's identity in every election of the group (the
    /// configured identity, `#` and the group's instance tag).
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }

    /// Adds election `name`, publishing the template's payload; returns its
    /// handle. The election starts as a follower and looks at its lease at
    /// the group's next grid instant. Dropping the handle leaves the
    /// election (see [`Election::leave`]).
    ///
    /// # Errors
    ///
    /// [`JoinError::Config`] for a name that is empty, longer than
    /// [`MAX_NAME_LEN`] bytes or holds a control character;
    /// [`JoinError::Duplicate`] when the group runs that election already;
    /// [`JoinError::Stopped`] once the group is shutting down.
    pub fn join(&self, name: &str) -> Result<Election, JoinError> {
        self.join_inner(name, None)
    }

    /// As [`Group::join`], publishing `payload` with this election's lease.
    ///
    /// # Errors
    ///
    /// As [`Group::join`]; [`JoinError::Config`] also for a payload over
    /// [`MAX_PAYLOAD_LEN`] bytes.
    pub fn join_with_payload(&self, name: &str, payload: impl Into<Vec<u8>>) -> Result<Election, JoinError> {
        self.join_inner(name, Some(payload.into()))
    }

    fn join_inner(&self, name: &str, payload: Option<Vec<u8>>) -> Result<Election, JoinError> {
        check_text("name", name, MAX_NAME_LEN).map_err(JoinError::Config)?;
        if let Some(p) = &payload {
            if p.len() > MAX_PAYLOAD_LEN {
                let problem = Problem::TooLong { len: p.len(), max: MAX_PAYLOAD_LEN };
                return Err(JoinError::Config(ConfigError::new("payload", problem)));
            }
        }
        let (reply, answer) = crossbeam_channel::bounded(1);
        let cmd = Command::Join { name: name.to_owned(), payload, reply };
        self.shared.cmd_tx.send(cmd).map_err(|_| JoinError::Stopped)?;
        let (key, election) = answer.recv().map_err(|_| JoinError::Stopped)??;
        Ok(Election { group: Arc::clone(&self.shared), key, shared: election, left: Mutex::new(None) })
    }

    /// A snapshot of the group: elections, how many it leads, the members
    /// and share, its store calls.
    pub fn status(&self) -> GroupStatus {
        self.shared.status()
    }

    crate::handoff::stop_calls!(
        /// Ends every term (each guard turns invalid first), releases every
        /// lease in one batch (unless release was disabled), leaves the
        /// members, and joins the group's threads. Calling it again does
        /// nothing. Blocks for at most about two operation timeouts plus the
        /// callbacks still running.
        ///
        /// # Errors
        ///
        /// The first release that failed or timed out (those leases then run
        /// out on their own).
        shutdown;
        /// Stops like [`Group::shutdown`] but leaves every lease to run out on
        /// its own, as a crash would (the member still leaves).
        shutdown_without_release;
        by stop
    );

    fn stop(&self, release: bool) -> Result<(), ElectionError> {
        driver::stop(&mut self.threads.lock(), &self.shared, release)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group").field("name", &self.shared.name).field("identity", &self.shared.identity).finish()
    }
}

/// One election of a [`Group`]: the same calls as an
/// [`Elector`](crate::Elector) offers for its one election, with the same
/// guarantees. Dropping it leaves the election (see [`Election::leave`]).
pub struct Election {
    group: Arc<GroupShared>,
    key: ElectionKey,
    shared: Arc<Shared>,
    /// How leaving went, once it has.
    left: Mutex<Option<Result<(), ElectionError>>>,
}

impl Election {
    crate::handoff::one_election_calls!(
        "Election",
        /// This participant's identity (the group's).
        identity;
        /// Blocks until this participant leads the election and returns a
        /// guard on the term (see [`Elector::wait_leader`](crate::Elector::wait_leader):
        /// drop the old guard before waiting again).
        ///
        /// # Errors
        ///
        /// [`WaitLeaderError::Stopped`](crate::WaitLeaderError::Stopped) once the election has left or the
        /// group has stopped.
        wait_leader;
    );

    crate::handoff::stop_calls!(
        /// Leaves the election: ends the term (every guard turns invalid
        /// first), releases the lease unless release was disabled, and removes
        /// the election from the group. Calling it again does nothing. Blocks
        /// for about one round trip (up to two operation timeouts when a
        /// renewal is in flight).
        ///
        /// # Errors
        ///
        /// The release failed or timed out; the lease then runs out on its own.
        leave;
        /// Leaves like [`Election::leave`] but lets the lease run out on its
        /// own.
        leave_without_release;
        by leave_inner
    );

    fn leave_inner(&self, release: bool) -> Result<(), ElectionError> {
        let mut left = self.left.lock();
        if let Some(result) = &*left {
            return result.clone();
        }
        let (reply, answer) = crossbeam_channel::bounded(1);
        let sent = self.group.cmd_tx.send(Command::Leave { key: self.key, release, reply });
        // A group that has stopped has already ended and released this
        // election with all the others.
        let result = match sent {
            Ok(()) => answer.recv().unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        *left = Some(result.clone());
        result
    }
}

crate::handoff::one_election_handle!(Election, dropped: leave);

/// The reply a join waits for.
pub(crate) type Joined = Result<(ElectionKey, Arc<Shared>), JoinError>;

/// The leave's answer channel.
pub(crate) type LeaveReply = Sender<Result<(), ElectionError>>;

#[cfg(test)]
mod tests;
