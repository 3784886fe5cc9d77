//! Configuration, its defaults, and the timing invariant.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Human;
use crate::guard::LeaderGuard;
use crate::store::Store;

/// Default [`Config::lease_duration`]: 15 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default [`Config::renew_interval`]: 5 s.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// Default [`Config::retry_period`]: 3 s, jittered.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(3);
/// Default [`Config::operation_timeout`]: 3 s.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);
/// Floor of the defaulted safety margin, which is otherwise a tenth of the lease.
pub const MIN_DEFAULT_SAFETY_MARGIN: Duration = Duration::from_secs(1);
/// Longest election name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest identity a lease row holds, in bytes: what
/// [`Config::identity`] is given, then `#` and the elector's instance tag
/// (16 hex digits), so a configured identity has at most
/// `MAX_IDENTITY_LEN - 17` bytes.
pub const MAX_IDENTITY_LEN: usize = 255;
/// Bytes an elector adds to the identity it is configured with: `#` and
/// 16 hex digits.
pub(crate) const INSTANCE_TAG_LEN: usize = 17;
/// Largest payload, in bytes.
pub const MAX_PAYLOAD_LEN: usize = 64 * 1024;
/// Longest any configured duration may be: 7 days.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 86_400);

/// The durations that drive an election, validated together.
///
/// [`Config`] carries one; the state machine and the simulation take one
/// directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease stays valid after a successful acquire or renew.
    pub lease_duration: Duration,
    /// How often the leader extends its lease.
    pub renew_interval: Duration,
    /// How often a follower polls; jittered.
    pub retry_period: Duration,
    /// How long one store call may take before it counts as failed.
    pub operation_timeout: Duration,
    /// How long before the lease's local expiry the leader steps down.
    pub safety_margin: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing::from_lease(DEFAULT_LEASE_DURATION)
    }
}

impl Timing {
    /// The default timings, with the safety margin derived from `lease`.
    pub fn from_lease(lease: Duration) -> Timing {
        Timing {
            lease_duration: lease,
            renew_interval: DEFAULT_RENEW_INTERVAL,
            retry_period: DEFAULT_RETRY_PERIOD,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            safety_margin: default_safety_margin(lease),
        }
    }

    /// How long a leader waits before retrying a failed renewal:
    /// `max(renew_interval / 4, 50 ms)`.
    pub fn retry_delay(&self) -> Duration {
        (self.renew_interval / 4).max(Duration::from_millis(50))
    }

    /// Checks every duration and the timing invariant
    /// `renew_interval + 2*operation_timeout + retry_delay <= lease_duration - safety_margin`:
    /// a leader must be able to lose one renewal outright (sent, timed out)
    /// and still complete a second before it has to step down.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field and the numbers on both sides.
    ///
    /// # Examples
    ///
    /// ```
    /// use leaderelection::Timing;
    /// use std::time::Duration;
    ///
    /// let mut t = Timing::default();
    /// assert!(t.validate().is_ok());
    /// t.lease_duration = Duration::from_secs(10);
    /// t.safety_margin = Duration::from_secs(1);
    /// let err = t.validate().unwrap_err();
    /// assert_eq!(err.field(), "renew_interval");
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid config: renew_interval: renew_interval + 2*operation_timeout + retry_delay \
    ///      (5s + 2*3s + 1.25s = 12.25s) must not exceed lease_duration - safety_margin \
    ///      (10s - 1s = 9s)"
    /// );
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("lease_duration", self.lease_duration),
            ("renew_interval", self.renew_interval),
            ("retry_period", self.retry_period),
            ("operation_timeout", self.operation_timeout),
            ("safety_margin", self.safety_margin),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(field, Problem::Zero));
            }
            if value > MAX_DURATION {
                return Err(ConfigError::new(field, Problem::TooLongDuration { value, max: MAX_DURATION }));
            }
        }
        if self.safety_margin >= self.lease_duration {
            return Err(ConfigError::new(
                "safety_margin",
                Problem::MarginNotBelowLease { margin: self.safety_margin, lease: self.lease_duration },
            ));
        }
        let needed = self
            .renew_interval
            .saturating_add(self.operation_timeout.saturating_mul(2))
            .saturating_add(self.retry_delay());
        let available = self.lease_duration - self.safety_margin;
        if needed > available {
            return Err(ConfigError::new(
                "renew_interval",
                Problem::TimingInvariant { timing: *self, needed, available },
            ));
        }
        Ok(())
    }
}

/// The safety margin used when none is set: a tenth of the lease, at least 1 s.
pub fn default_safety_margin(lease: Duration) -> Duration {
    (lease / 10).max(MIN_DEFAULT_SAFETY_MARGIN)
}

/// Runs for a whole term on its own thread; the guard ends with the term.
pub(crate) type StartedFn = dyn Fn(LeaderGuard) + Send + Sync;
/// Runs after a term ends and `on_started_leading` has returned.
pub(crate) type StoppedFn = dyn Fn() + Send + Sync;
/// Runs when a new (holder, fence) pair is observed.
pub(crate) type NewLeaderFn = dyn Fn(&str, u64) + Send + Sync;

/// One participant in one election.
///
/// Built with [`Config::new`] and the setters below, checked by
/// [`Elector::start`](crate::Elector::start).
///
/// # Examples
///
/// ```
/// use leaderelection::{Config, MemStore};
/// use std::time::Duration;
///
/// let config = Config::new(MemStore::new(), "invoice-reconciler")
///     .lease_duration(Duration::from_secs(30))
///     .payload(b"https://eu-west.internal:8443".to_vec());
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone)]
pub struct Config {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) name: String,
    pub(crate) identity: Option<String>,
    pub(crate) payload: Vec<u8>,
    pub(crate) timing: Timing,
    pub(crate) margin_set: bool,
    pub(crate) release_on_shutdown: bool,
    pub(crate) on_started_leading: Option<Arc<StartedFn>>,
    pub(crate) on_stopped_leading: Option<Arc<StoppedFn>>,
    pub(crate) on_new_leader: Option<Arc<NewLeaderFn>>,
}

impl Config {
    /// A participant in election `name`, keeping its lease in `store`, with
    /// every default.
    pub fn new(store: impl Store + 'static, name: impl Into<String>) -> Config {
        Config {
            store: Arc::new(store),
            name: name.into(),
            identity: None,
            payload: Vec::new(),
            timing: Timing::default(),
            margin_set: false,
            release_on_shutdown: true,
            on_started_leading: None,
            on_stopped_leading: None,
            on_new_leader: None,
        }
    }

    /// A readable name for this participant, such as the host or pod name,
    /// shown in the lease row, in [`Status`](crate::Status) and in logs.
    /// Defaults to `hostname-pid`.
    ///
    /// It need not be unique. Each elector adds an instance tag of its own,
    /// `#` and 16 random hex digits, and that whole string is the
    /// participant's identity on the database
    /// ([`Elector::identity`](crate::Elector::identity), [`Lease::holder`](crate::Lease::holder)):
    /// `web#3f9c2b4e8a1d7c05`. So two electors given the same name (two
    /// processes started with one `--identity`, a cron job overlapping its
    /// own previous run, a restarted process whose stalled predecessor
    /// still believes it leads) are two participants, and never both hold
    /// the lease. [`base_identity`](crate::base_identity) gives the name
    /// back from an identity.
    ///
    /// At most [`MAX_IDENTITY_LEN`]` - 17` bytes, no control characters.
    pub fn identity(mut self, identity: impl Into<String>) -> Config {
        self.identity = Some(identity.into());
        self
    }

    /// Opaque bytes published with the lease while this participant leads,
    /// readable by followers in [`Status::leader`](crate::Status). Defaults to
    /// empty; at most [`MAX_PAYLOAD_LEN`] bytes.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Config {
        self.payload = payload.into();
        self
    }

    /// How long a lease stays valid: the worst-case failover after a crash.
    /// Defaults to 15 s. Unless set explicitly, the safety margin follows it.
    pub fn lease_duration(mut self, d: Duration) -> Config {
        self.timing.lease_duration = d;
        if !self.margin_set {
            self.timing.safety_margin = default_safety_margin(d);
        }
        self
    }

    /// How often the leader renews. Defaults to 5 s.
    pub fn renew_interval(mut self, d: Duration) -> Config {
        self.timing.renew_interval = d;
        self
    }

    /// How often a follower polls the lease (jittered ±20 %). Defaults to 3 s.
    pub fn retry_period(mut self, d: Duration) -> Config {
        self.timing.retry_period = d;
        self
    }

    /// How long one store call may take before it counts as failed with an
    /// unknown outcome. Defaults to 3 s.
    pub fn operation_timeout(mut self, d: Duration) -> Config {
        self.timing.operation_timeout = d;
        self
    }

    /// How long before the lease's local expiry the leader steps down; it
    /// absorbs clock-rate differences between this host and the database.
    /// Defaults to a tenth of the lease, at least 1 s.
    pub fn safety_margin(mut self, d: Duration) -> Config {
        self.timing.safety_margin = d;
        self.margin_set = true;
        self
    }

    /// All five durations at once.
    pub fn timing(mut self, timing: Timing) -> Config {
        self.timing = timing;
        self.margin_set = true;
        self
    }

    /// Whether shutdown releases the lease so a successor can take over at
    /// once. Defaults to `true`.
    pub fn release_on_shutdown(mut self, release: bool) -> Config {
        self.release_on_shutdown = release;
        self
    }

    /// Runs `f` on a thread of its own for each term, with that term's guard.
    /// Return when [`LeaderGuard::is_valid`] turns false (or when
    /// [`LeaderGuard::lost`] fires); returning while the term is still live
    /// drops the guard and so resigns the term. Shutdown waits for `f` to
    /// return. Callbacks must not shut down the elector that runs them.
    ///
    /// Do not keep the guard (or a clone) past the end of its term, for
    /// instance by sending it to another thread: while a guard of an ended
    /// term is alive the elector starts no new term, so the next
    /// `on_started_leading` never comes ([`Status::held_back`](crate::Status)
    /// shows it, and a warning is logged once it has lasted a lease).
    pub fn on_started_leading(mut self, f: impl Fn(LeaderGuard) + Send + Sync + 'static) -> Config {
        self.on_started_leading = Some(Arc::new(f));
        self
    }

    /// Runs `f` after each term ends, once `on_started_leading` has returned.
    pub fn on_stopped_leading(mut self, f: impl Fn() + Send + Sync + 'static) -> Config {
        self.on_stopped_leading = Some(Arc::new(f));
        self
    }

    /// Runs `f(identity, fence)` whenever a new term is observed, this
    /// participant's own included. Advisory: for logs and routing, never to
    /// decide whether this process leads.
    pub fn on_new_leader(mut self, f: impl Fn(&str, u64) + Send + Sync + 'static) -> Config {
        self.on_new_leader = Some(Arc::new(f));
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The timings as set so far.
    pub fn get_timing(&self) -> Timing {
        self.timing
    }

    /// Checks every field as [`Elector::start`](crate::Elector::start) will.
    ///
    /// # Errors
    ///
    /// The first problem found, as a [`ConfigError`] naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_text("name", &self.name, MAX_NAME_LEN)?;
        if let Some(identity) = &self.identity {
            check_text("identity", identity, MAX_IDENTITY_LEN - INSTANCE_TAG_LEN)?;
        }
        if self.payload.len() > MAX_PAYLOAD_LEN {
            return Err(ConfigError::new(
                "payload",
                Problem::TooLong { len: self.payload.len(), max: MAX_PAYLOAD_LEN },
            ));
        }
        self.timing.validate()
    }
}

/// Checks a text value that goes into the lease row.
pub(crate) fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::new(field, Problem::Empty));
    }
    if value.len() > max {
        return Err(ConfigError::new(field, Problem::TooLong { len: value.len(), max }));
    }
    if let Some(at) = value.find(|c: char| c.is_control()) {
        return Err(ConfigError::new(field, Problem::ControlCharacter { at }));
    }
    Ok(())
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("payload_len", &self.payload.len())
            .field("timing", &self.timing)
            .field("release_on_shutdown", &self.release_on_shutdown)
            .finish_non_exhaustive()
    }
}

/// A configuration that [`Elector::start`](crate::Elector::start) refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: Box<Problem>,
}

/// What is wrong with a field, with the numbers involved.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The value is empty.
    Empty,
    /// The value is longer than allowed (bytes).
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The text holds a control character at byte `at`.
    ControlCharacter {
        /// Byte offset of the first control character.
        at: usize,
    },
    /// A duration is zero.
    Zero,
    /// A duration is longer than [`MAX_DURATION`].
    TooLongDuration {
        /// The value given.
        value: Duration,
        /// The limit.
        max: Duration,
    },
    /// The safety margin is not shorter than the lease.
    MarginNotBelowLease {
        /// The safety margin.
        margin: Duration,
        /// The lease duration.
        lease: Duration,
    },
    /// `renew_interval + 2*operation_timeout + retry_delay` exceeds
    /// `lease_duration - safety_margin`.
    TimingInvariant {
        /// The timings refused.
        timing: Timing,
        /// The left side.
        needed: Duration,
        /// The right side.
        available: Duration,
    },
    /// A group's grid step is longer than the renew interval or the retry
    /// period: renewals would go out late.
    TickTooLong {
        /// The step.
        tick: Duration,
        /// The shorter of the renew interval and the retry period.
        limit: Duration,
    },
    /// In a group, `renew_interval + 2*operation_timeout + retry_delay +
    /// tick` exceeds `lease_duration - safety_margin`: a group notices a
    /// timed-out call at its next grid instant, up to a tick late.
    GroupTimingInvariant {
        /// The timings refused.
        timing: Timing,
        /// The group's grid step.
        tick: Duration,
        /// The left side.
        needed: Duration,
        /// The right side.
        available: Duration,
    },
    /// Set on a group's template configuration, which the group does not
    /// use: the group's own setter takes callbacks that name the election.
    NotForGroups,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, problem: Problem) -> ConfigError {
        ConfigError { field, problem: Box::new(problem) }
    }

    /// The offending field, as its setter is named (`"lease_duration"`).
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: {}: ", self.field)?;
        match &*self.problem {
            Problem::Empty => write!(f, "must not be empty"),
            Problem::TooLong { len, max } => write!(f, "is {len} bytes, more than the limit of {max}"),
            Problem::ControlCharacter { at } => write!(f, "holds a control character at byte {at}"),
            Problem::Zero => write!(f, "must be greater than zero"),
            Problem::TooLongDuration { value, max } => {
                write!(f, "{} is longer than the limit of {}", Human(*value), Human(*max))
            }
            Problem::MarginNotBelowLease { margin, lease } => {
                write!(f, "safety_margin ({}) must be shorter than lease_duration ({})", Human(*margin), Human(*lease))
            }
            Problem::TimingInvariant { timing, needed, available } => write!(
                f,
                "renew_interval + 2*operation_timeout + retry_delay ({} + 2*{} + {} = {}) \
                 must not exceed lease_duration - safety_margin ({} - {} = {})",
                Human(timing.renew_interval),
                Human(timing.operation_timeout),
                Human(timing.retry_delay()),
                Human(*needed),
                Human(timing.lease_duration),
                Human(timing.safety_margin),
                Human(*available)
            ),
            Problem::TickTooLong { tick, limit } => write!(
                f,
                "tick ({}) must not exceed the shorter of renew_interval and retry_period ({})",
                Human(*tick),
                Human(*limit)
            ),
            Problem::GroupTimingInvariant { timing, tick, needed, available } => write!(
                f,
                "in a group, renew_interval + 2*operation_timeout + retry_delay + tick ({} + 2*{} + {} + {} = {}) \
                 must not exceed lease_duration - safety_margin ({} - {} = {})",
                Human(timing.renew_interval),
                Human(timing.operation_timeout),
                Human(timing.retry_delay()),
                Human(*tick),
                Human(*needed),
                Human(timing.lease_duration),
                Human(timing.safety_margin),
                Human(*available)
            ),
            Problem::NotForGroups => write!(
                f,
                "is set on the template configuration, which a group does not use; set it on the GroupConfig, \
                 whose callbacks also take the election's name"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemStore;

    fn cfg() -> Config {
        Config::new(MemStore::new(), "e").identity("me")
    }

    #[test]
    fn defaults_follow_the_design() {
        let t = Timing::default();
        assert_eq!(t.lease_duration, Duration::from_secs(15));
        assert_eq!(t.renew_interval, Duration::from_secs(5));
        assert_eq!(t.retry_period, Duration::from_secs(3));
        assert_eq!(t.operation_timeout, Duration::from_secs(3));
        assert_eq!(t.safety_margin, Duration::from_millis(1500));
        assert_eq!(t.retry_delay(), Duration::from_millis(1250));
        assert!(t.validate().is_ok());
        assert_eq!(default_safety_margin(Duration::from_secs(3)), Duration::from_secs(1));
        assert!(cfg().release_on_shutdown);
    }

    #[test]
    fn an_identity_leaves_room_for_the_instance_tag() {
        let fits = "i".repeat(MAX_IDENTITY_LEN - INSTANCE_TAG_LEN);
        assert!(cfg().identity(fits.clone()).validate().is_ok());
        let e = cfg().identity(format!("{fits}i")).validate().unwrap_err();
        assert_eq!(e.to_string(), "invalid config: identity: is 239 bytes, more than the limit of 238");
    }

    #[test]
    fn margin_follows_lease_unless_set() {
        let c = cfg().lease_duration(Duration::from_secs(60));
        assert_eq!(c.timing.safety_margin, Duration::from_secs(6));
        let c = cfg().safety_margin(Duration::from_secs(2)).lease_duration(Duration::from_secs(60));
        assert_eq!(c.timing.safety_margin, Duration::from_secs(2));
    }

    #[test]
    fn each_bad_field_is_named() {
        let long = "x".repeat(MAX_NAME_LEN + 1);
        let cases: Vec<(Config, &str)> = vec![
            (Config::new(MemStore::new(), ""), "name"),
            (Config::new(MemStore::new(), long.clone()), "name"),
            (Config::new(MemStore::new(), "a\0b"), "name"),
            (cfg().identity(""), "identity"),
            (cfg().identity(long), "identity"),
            (cfg().identity("a\nb"), "identity"),
            (cfg().payload(vec![0; MAX_PAYLOAD_LEN + 1]), "payload"),
            (cfg().lease_duration(Duration::ZERO), "lease_duration"),
            (cfg().renew_interval(Duration::ZERO), "renew_interval"),
            (cfg().retry_period(Duration::ZERO), "retry_period"),
            (cfg().operation_timeout(Duration::ZERO), "operation_timeout"),
            (cfg().safety_margin(Duration::ZERO), "safety_margin"),
            (cfg().safety_margin(Duration::from_secs(15)), "safety_margin"),
            (cfg().renew_interval(Duration::from_secs(9)), "renew_interval"),
        ];
        for (c, field) in cases {
            let err = c.validate().expect_err(field);
            assert_eq!(err.field(), field, "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(cfg().payload(vec![0; MAX_PAYLOAD_LEN]).validate().is_ok());
    }

    #[test]
    fn numbers_on_both_sides_are_reported() {
        let err = cfg().safety_margin(Duration::from_secs(20)).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: safety_margin: safety_margin (20s) must be shorter than lease_duration (15s)"
        );
        let err = cfg().payload(vec![1; 70_000]).validate().unwrap_err();
        assert_eq!(err.to_string(), "invalid config: payload: is 70000 bytes, more than the limit of 65536");
    }

    #[test]
    fn invariant_boundary_is_inclusive() {
        // 5 + 2*3 + 1.25 = 12.25 = 13.75 - 1.5
        let t = Timing { lease_duration: Duration::from_millis(13_750), ..Timing::default() };
        assert!(t.validate().is_ok());
        let t = Timing { lease_duration: Duration::from_millis(13_749), ..t };
        let err = t.validate().unwrap_err();
        assert_eq!(err.field(), "renew_interval");
        assert_eq!(
            err.to_string(),
            "invalid config: renew_interval: renew_interval + 2*operation_timeout + retry_delay \
             (5s + 2*3s + 1.25s = 12.25s) must not exceed lease_duration - safety_margin (13.749s - 1.5s = 12.249s)"
        );
    }

    #[test]
    fn huge_durations_are_refused_without_overflow() {
        for field in ["lease_duration", "renew_interval", "retry_period", "operation_timeout", "safety_margin"] {
            let mut t = Timing::default();
            let d = match field {
                "lease_duration" => &mut t.lease_duration,
                "renew_interval" => &mut t.renew_interval,
                "retry_period" => &mut t.retry_period,
                "operation_timeout" => &mut t.operation_timeout,
                _ => &mut t.safety_margin,
            };
            *d = Duration::MAX;
            let err = t.validate().unwrap_err();
            assert_eq!(err.field(), field, "{err}");
            assert!(err.to_string().contains("longer than the limit of 7d"), "{err}");
        }
        let t = Timing { lease_duration: MAX_DURATION, ..Timing::default() };
        assert!(t.validate().is_ok());
    }
}
