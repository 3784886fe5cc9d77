//! The lease record as the database reports it, and the database clock.

use std::fmt;
use std::time::Duration;

/// An instant on the **database server's** clock.
///
/// Participants in different clusters have unrelated clocks, so a database
/// instant means nothing to a local clock. This type makes that a rule the
/// compiler checks: a `DbTime` cannot be turned into a [`std::time::SystemTime`]
/// or an [`std::time::Instant`], nor compared with one. The only thing two
/// `DbTime`s yield is the [`Duration`] between them, and the election only
/// ever uses durations whose two ends were read by the same statement
/// (see [`Lease::ttl`]).
///
/// Internally it counts microseconds since the Unix epoch on the server,
/// which is the resolution PostgreSQL and MariaDB keep.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DbTime(i64);

impl DbTime {
    /// Builds a database instant from microseconds since the Unix epoch as the
    /// server counts them. Stores call this with what the server returned;
    /// nothing else should.
    pub const fn from_unix_micros(micros: i64) -> DbTime {
        DbTime(micros)
    }

    /// Microseconds since the Unix epoch on the server's clock, for stores
    /// that write the value back (the in-memory store does).
    pub const fn as_unix_micros(self) -> i64 {
        self.0
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is not
    /// earlier.
    pub fn saturating_duration_since(self, earlier: DbTime) -> Duration {
        let micros = self.0.saturating_sub(earlier.0);
        if micros <= 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(micros as u64)
        }
    }

    /// This instant moved forward by `d` on the same clock, saturating at the
    /// end of the representable range. Stores that keep their own database
    /// clock (the in-memory store) use it to compute `expires_at`.
    pub fn saturating_add(self, d: Duration) -> DbTime {
        // In i128, where no u64-seconds duration in microseconds can
        // overflow, then clamped to the range.
        let sum = i128::from(self.0).saturating_add(i128::try_from(d.as_micros()).unwrap_or(i128::MAX));
        DbTime(i64::try_from(sum).unwrap_or(i64::MAX))
    }
}

impl fmt::Debug for DbTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DbTime({}us)", self.0)
    }
}

/// One election's record, exactly as one store statement read it.
///
/// Every instant in a `Lease` comes from the database server, and `now` was
/// read by the same statement as the others, so `expires_at - now` is a
/// duration free of any skew between this process and the server.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    /// The election this record belongs to.
    pub name: String,
    /// Identity of the participant that holds (or last held) the lease.
    pub holder: String,
    /// The fencing token of the holder's term. It grows each time an absent
    /// or expired lease is claimed, and never otherwise. The built-in stores
    /// make it `max(previous + 1, the database clock in microseconds)`, so it
    /// is a large number that keeps growing across a deleted row or a
    /// restored older one; compare fences, never expect particular values.
    pub fence: u64,
    /// When the current term began, on the database clock.
    pub acquired_at: DbTime,
    /// When the holder last extended the lease, on the database clock.
    pub renewed_at: DbTime,
    /// When the lease becomes claimable by others, on the database clock.
    pub expires_at: DbTime,
    /// The database clock at the instant the statement read this record.
    pub now: DbTime,
    /// Opaque data the holder published with the lease (for example an
    /// address where other clusters can reach the leader). May be empty.
    pub payload: Vec<u8>,
}

impl Lease {
    /// A lease of election `name` just granted (or renewed) to `holder`
    /// under `fence` at database instant `now`, for `ttl`: what a store
    /// answers a claim with. For tests and simulations of code that reads
    /// leases; a store builds its own from its row.
    pub fn granted(name: &str, holder: &str, fence: u64, now: DbTime, ttl: Duration, payload: &[u8]) -> Lease {
        Lease {
            name: name.to_owned(),
            holder: holder.to_owned(),
            fence,
            acquired_at: now,
            renewed_at: now,
            expires_at: now.saturating_add(ttl),
            now,
            payload: payload.to_vec(),
        }
    }

    /// How much longer the lease is valid on the database clock, as seen by
    /// the statement that read it; zero once it has expired.
    ///
    /// ```
    /// use leaderelection::{DbTime, Lease};
    /// use std::time::Duration;
    ///
    /// let now = DbTime::from_unix_micros(1_000_000);
    /// let lease = Lease {
    ///     name: "jobs".into(),
    ///     holder: "a".into(),
    ///     fence: 7,
    ///     acquired_at: now,
    ///     renewed_at: now,
    ///     expires_at: now.saturating_add(Duration::from_secs(15)),
    ///     now,
    ///     payload: Vec::new(),
    /// };
    /// assert_eq!(lease.ttl(), Duration::from_secs(15));
    /// assert!(lease.held_by("a") && !lease.held_by("b"));
    /// ```
    pub fn ttl(&self) -> Duration {
        self.expires_at.saturating_duration_since(self.now)
    }

    /// Whether the lease was already claimable when it was read.
    pub fn expired(&self) -> bool {
        self.expires_at <= self.now
    }

    /// Whether `identity` held a still-valid lease when it was read.
    pub fn held_by(&self, identity: &str) -> bool {
        self.holder == identity && !self.expired()
    }
}

impl fmt::Debug for Lease {
    // The payload is the user's data; show its size, not its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .field("fence", &self.fence)
            .field("acquired_at", &self.acquired_at)
            .field("renewed_at", &self.renewed_at)
            .field("expires_at", &self.expires_at)
            .field("now", &self.now)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Three days away from any plausible local clock reading.
    const BASE: i64 = 1_700_000_000_000_000 + 3 * 86_400_000_000;

    fn lease(now: i64, expires: i64) -> Lease {
        Lease {
            name: "n".into(),
            holder: "h".into(),
            fence: 1,
            acquired_at: DbTime(BASE),
            renewed_at: DbTime(BASE),
            expires_at: DbTime(expires),
            now: DbTime(now),
            payload: vec![],
        }
    }

    #[test]
    fn ttl_is_expiry_minus_statement_now() {
        let l = lease(BASE, BASE + 2_500_000);
        assert_eq!(l.ttl(), Duration::from_millis(2500));
        assert!(!l.expired());
        assert!(l.held_by("h"));
    }

    #[test]
    fn expired_lease_has_zero_ttl_and_no_holder() {
        for expires in [BASE - 1, BASE] {
            let l = lease(BASE, expires);
            assert_eq!(l.ttl(), Duration::ZERO);
            assert!(l.expired());
            assert!(!l.held_by("h"));
        }
    }

    #[test]
    fn extreme_values_saturate() {
        let l = lease(i64::MIN, i64::MAX);
        assert_eq!(l.ttl(), Duration::from_micros(i64::MAX as u64));
        assert!(DbTime(i64::MAX).saturating_add(Duration::MAX) == DbTime(i64::MAX));
        // Found by the lease_maths fuzz target: from before 1970 a huge
        // duration must still reach the end of the range.
        assert_eq!(DbTime(i64::MIN).saturating_add(Duration::MAX), DbTime(i64::MAX));
        assert_eq!(DbTime(-5).saturating_add(Duration::from_micros(3)), DbTime(-2));
        assert_eq!(DbTime(5).saturating_duration_since(DbTime(9)), Duration::ZERO);
    }

    #[test]
    fn debug_hides_payload_bytes() {
        let mut l = lease(BASE, BASE + 1);
        l.payload = b"secret-token".to_vec();
        let s = format!("{l:?}");
        assert!(!s.contains("secret"), "{s}");
        assert!(s.contains("payload_len: 12"), "{s}");
    }
}
