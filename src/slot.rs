//! Slots: work that must run once per schedule slot (a day's report, an
//! hour's cleanup), whoever leads when the slot comes round.
//!
//! Leading is not enough for that. Cron fires the same line on every host,
//! and a host whose cron fires late, or that waited for the lease while the
//! first host ran the job, becomes leader after the first has finished and
//! released: it would run the job again. A slot is recorded in the store
//! with the term that claimed it, by the same statement that checks the
//! term still holds the lease, so exactly one term ever gets to run it
//! ([`LeaderGuard::claim_slot`](crate::LeaderGuard::claim_slot)).
//!
//! What a run that never finished means for its slot: by default nothing
//! more happens (at most once). A run that did not record success (it
//! failed, or was killed and recorded nothing) may be claimed again by a
//! later term when the claim asks for it
//! ([`LeaderGuard::claim_slot_retrying_failed`](crate::LeaderGuard::claim_slot_retrying_failed)):
//! a later term exists only once the earlier one has ended on the
//! database, so the earlier run is no longer leading.

/// Longest slot name, in bytes.
pub const MAX_SLOT_LEN: usize = 255;

/// What [`Store::claim_slot`](crate::Store::claim_slot) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotClaim {
    /// This call claimed the slot for the term: run its work.
    Claimed,
    /// The slot was claimed before, by the term with this fence (this very
    /// term, if it claimed it earlier), and is not claimed again.
    Taken {
        /// The fence of the term that claimed it.
        fence: u64,
        /// The status that run recorded (0 for success); `None` while it
        /// runs, or when it was killed or lost its term before recording.
        outcome: Option<i32>,
    },
}

impl SlotClaim {
    /// Whether this call claimed the slot.
    pub fn is_claimed(&self) -> bool {
        matches!(self, SlotClaim::Claimed)
    }
}

/// Checks a slot name: not empty, at most [`MAX_SLOT_LEN`] bytes, no
/// control characters.
pub(crate) fn check(slot: &str) -> Result<(), crate::StoreError> {
    let bad = |why: &str| crate::StoreError::fatal(format!("invalid slot name: {why}"));
    if slot.is_empty() {
        return Err(bad("must not be empty"));
    }
    if slot.len() > MAX_SLOT_LEN {
        return Err(bad(&format!("is {} bytes long, more than the limit of {MAX_SLOT_LEN}", slot.len())));
    }
    if slot.contains(|c: char| c.is_control()) {
        return Err(bad("holds a control character"));
    }
    Ok(())
}

/// The name of a period's slot: the UTC start of the `period`-long slot
/// that holds the instant `micros` (microseconds since the Unix epoch),
/// counted from the epoch, as `YYYY-MM-DDTHH:MM:SSZ` (a day's slots start
/// at midnight UTC). Periods shorter than a second count as a second.
///
/// ```
/// use leaderelection::period_slot;
/// use std::time::Duration;
/// let t = 1_796_083_200_000_000 + 3_600_000_000 + 5; // 2026-12-01T01:00:00.000005Z
/// assert_eq!(period_slot(t, Duration::from_secs(86_400)), "2026-12-01T00:00:00Z");
/// assert_eq!(period_slot(t, Duration::from_secs(3_600)), "2026-12-01T01:00:00Z");
/// assert_eq!(period_slot(t, Duration::from_secs(900)), "2026-12-01T01:00:00Z");
/// assert_eq!(period_slot(t - 6, Duration::from_secs(3_600)), "2026-12-01T00:00:00Z");
/// ```
pub fn period_slot(micros: i64, period: std::time::Duration) -> String {
    let p = i64::try_from(period.as_secs().max(1)).unwrap_or(i64::MAX);
    let secs = micros.div_euclid(1_000_000);
    let start = secs.div_euclid(p).saturating_mul(p);
    let (days, rem) = (start.div_euclid(86_400), start.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Year, month and day of `days` since 1970-01-01 (proleptic Gregorian;
/// Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn names_are_checked() {
        assert!(check("2026-12-01").is_ok());
        assert!(check(&"s".repeat(MAX_SLOT_LEN)).is_ok());
        for bad in [String::new(), "s".repeat(MAX_SLOT_LEN + 1), "a\nb".into()] {
            let e = check(&bad).unwrap_err();
            assert!(e.is_fatal() && e.to_string().starts_with("invalid slot name: "), "{e}");
        }
    }

    #[test]
    fn period_slots_are_utc_calendar_starts() {
        let day = Duration::from_secs(86_400);
        assert_eq!(period_slot(0, day), "1970-01-01T00:00:00Z");
        assert_eq!(period_slot(-1, day), "1969-12-31T00:00:00Z");
        assert_eq!(period_slot(951_782_400_000_000, day), "2000-02-29T00:00:00Z");
        assert_eq!(period_slot(4_107_542_399_000_000, day), "2100-02-28T00:00:00Z");
        assert_eq!(period_slot(1_796_083_199_999_999, day), "2026-11-30T00:00:00Z");
        assert_eq!(period_slot(1_796_083_200_000_000, day), "2026-12-01T00:00:00Z");
        assert_eq!(period_slot(1_796_083_200_000_000 + 59_000_000, Duration::from_millis(10)), "2026-12-01T00:00:59Z");
        // Total: the ends of the range give a name, not a panic.
        assert!(period_slot(i64::MAX, day).ends_with("T00:00:00Z"));
        assert!(period_slot(i64::MIN, Duration::MAX).ends_with('Z'));
    }
}
