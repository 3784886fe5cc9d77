//! Configuration, its defaults, and the timing invariant.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::guard::LeaderGuard;
use crate::store::Store;

// What the configuration is checked against lives below it, with the
// timings the state machine takes; the drivers find it here too.
pub(crate) use crate::timing::{
    check_text, default_safety_margin, ConfigError, Problem, Timing, INSTANCE_TAG_LEN, MAX_DURATION, MAX_IDENTITY_LEN,
    MAX_NAME_LEN, MAX_PAYLOAD_LEN,
};

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

    crate::setters::setters!(Config {
        /// How often the leader renews. Defaults to 5 s.
        renew_interval(d: Duration) => timing.renew_interval = d;

        /// How often a follower polls the lease (jittered ±20 %). Defaults to 3 s.
        retry_period(d: Duration) => timing.retry_period = d;

        /// How long one store call may take before it counts as failed with an
        /// unknown outcome. Defaults to 3 s.
        operation_timeout(d: Duration) => timing.operation_timeout = d;
    });

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
