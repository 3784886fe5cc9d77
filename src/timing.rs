//! The durations that drive an election and the limits on what a lease
//! row holds, validated: the state machine's input, below the
//! configuration that carries them ([`Config`](crate::Config)).

use std::fmt;
use std::time::Duration;

use crate::error::Human;

/// Default [`Config::lease_duration`](crate::Config::lease_duration): 15 s.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default [`Config::renew_interval`](crate::Config::renew_interval): 5 s.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// Default [`Config::retry_period`](crate::Config::retry_period): 3 s, jittered.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(3);
/// Default [`Config::operation_timeout`](crate::Config::operation_timeout): 3 s.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);
/// Floor of the defaulted safety margin, which is otherwise a tenth of the lease.
pub const MIN_DEFAULT_SAFETY_MARGIN: Duration = Duration::from_secs(1);
/// Longest election name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest identity a lease row holds, in bytes: what
/// [`Config::identity`](crate::Config::identity) is given, then `#` and the elector's instance tag
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
/// [`Config`](crate::Config) carries one; the state machine and the simulation take one
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
        write!(f, "invalid config: {}: {}", self.field, self.problem.named(&|field| field))
    }
}

impl Problem {
    /// What is wrong, in words, naming the settings it relates with
    /// `name` applied to each setter's name (`"renew_interval"`, and
    /// `"retry_delay"` for the renewal retry delay). A front end with its
    /// own names for the settings, such as a command line's flags, says
    /// the same as [`ConfigError`]'s `Display` in its own words.
    pub fn named<'a>(&'a self, name: &'a dyn Fn(&'static str) -> &'static str) -> impl fmt::Display + 'a {
        Named { problem: self, name }
    }
}

struct Named<'a> {
    problem: &'a Problem,
    name: &'a dyn Fn(&'static str) -> &'static str,
}

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.name;
        let sum = |f: &mut fmt::Formatter<'_>, timing: &Timing, tick: Option<Duration>| {
            write!(f, "{} + 2*{} + {}", n("renew_interval"), n("operation_timeout"), n("retry_delay"))?;
            if tick.is_some() {
                write!(f, " + tick")?;
            }
            write!(
                f,
                " ({} + 2*{} + {}",
                Human(timing.renew_interval),
                Human(timing.operation_timeout),
                Human(timing.retry_delay())
            )?;
            match tick {
                Some(t) => write!(f, " + {}", Human(t)),
                None => Ok(()),
            }
        };
        let room = |f: &mut fmt::Formatter<'_>, timing: &Timing, needed: Duration, available: Duration| {
            write!(
                f,
                " = {}) must not exceed {} - {} ({} - {} = {})",
                Human(needed),
                n("lease_duration"),
                n("safety_margin"),
                Human(timing.lease_duration),
                Human(timing.safety_margin),
                Human(available)
            )
        };
        match self.problem {
            Problem::Empty => write!(f, "must not be empty"),
            Problem::TooLong { len, max } => write!(f, "is {len} bytes, more than the limit of {max}"),
            Problem::ControlCharacter { at } => write!(f, "holds a control character at byte {at}"),
            Problem::Zero => write!(f, "must be greater than zero"),
            Problem::TooLongDuration { value, max } => {
                write!(f, "{} is longer than the limit of {}", Human(*value), Human(*max))
            }
            Problem::MarginNotBelowLease { margin, lease } => write!(
                f,
                "{} ({}) must be shorter than {} ({})",
                n("safety_margin"),
                Human(*margin),
                n("lease_duration"),
                Human(*lease)
            ),
            Problem::TimingInvariant { timing, needed, available } => {
                sum(f, timing, None)?;
                room(f, timing, *needed, *available)
            }
            Problem::TickTooLong { tick, limit } => write!(
                f,
                "tick ({}) must not exceed the shorter of {} and {} ({})",
                Human(*tick),
                n("renew_interval"),
                n("retry_period"),
                Human(*limit)
            ),
            Problem::GroupTimingInvariant { timing, tick, needed, available } => {
                write!(f, "in a group, ")?;
                sum(f, timing, Some(*tick))?;
                room(f, timing, *needed, *available)
            }
            Problem::NotForGroups => write!(
                f,
                "is set on the template configuration, which a group does not use; set it on the GroupConfig, \
                 whose callbacks also take the election's name"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
