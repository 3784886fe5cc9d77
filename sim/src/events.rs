//! What both simulations (one election per host in `world.rs`, groups in
//! `group.rs`) stand on: a queue of timed events on virtual time, the
//! conversions between its nanoseconds and `Duration`s, a host's local
//! clock, which runs at its own rate from its own offset, and the lease a
//! store answers with (the fuzz targets' checks build them too).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

use leaderelection::machine::LocalTime;
use leaderelection::ErrorKind;

use crate::schedule::PPM;

/// Virtual nanoseconds from a duration (saturating).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration from virtual nanoseconds.
pub(crate) fn dur(t: u64) -> Duration {
    Duration::from_nanos(t)
}

/// Notes an event of a run at virtual instant `t`: folds `t`, its `code`
/// and its numbers `a`, `b` into `hash` (FNV-1a over 64-bit words, so two
/// runs that took the same steps hash the same) and, when `trace` is given,
/// adds the event's line to it.
pub(crate) fn note(
    hash: &mut u64, trace: Option<&mut Vec<String>>, (t, code, a, b): (u64, u64, u64, u64),
    text: impl FnOnce() -> String,
) {
    for x in [t, code, a, b] {
        *hash = (*hash ^ x).wrapping_mul(0x0100_0000_01b3);
    }
    if let Some(trace) = trace {
        trace.push(format!("{:>16?} {}", dur(t), text()));
    }
}

/// What the database fails every statement with while the active
/// `DbFailing` faults last (`fatal`: each one's flag): fatal if any is,
/// retryable otherwise, nothing while none is active.
pub(crate) fn failing_kind(fatal: impl IntoIterator<Item = bool>) -> Option<ErrorKind> {
    fatal.into_iter().fold(None, |kind, fatal| {
        Some(if fatal || kind == Some(ErrorKind::Fatal) { ErrorKind::Fatal } else { ErrorKind::Retryable })
    })
}

/// Events by virtual instant, ties in the order they were pushed, so a run
/// is deterministic.
pub(crate) struct Events<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

struct Entry<E> {
    t: u64,
    seq: u64,
    ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Entry<E>) -> bool {
        (self.t, self.seq) == (other.t, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Entry<E>) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // Reversed: the heap pops the earliest event, ties in scheduling order.
    fn cmp(&self, other: &Entry<E>) -> Ordering {
        (other.t, other.seq).cmp(&(self.t, self.seq))
    }
}

impl<E> Events<E> {
    pub(crate) fn new() -> Events<E> {
        Events { heap: BinaryHeap::new(), seq: 0 }
    }

    /// Schedules `ev` at virtual instant `t`.
    pub(crate) fn push(&mut self, t: u64, ev: E) {
        self.seq += 1;
        self.heap.push(Entry { t, seq: self.seq, ev });
    }

    /// The earliest event and its instant.
    pub(crate) fn pop(&mut self) -> Option<(u64, E)> {
        self.heap.pop().map(|e| (e.t, e.ev))
    }
}

/// A host's local clock: it reads `offset` at real instant 0 and runs at
/// `rate_ppm` parts per million of real time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostClock {
    pub(crate) offset: Duration,
    pub(crate) rate_ppm: u64,
}

impl HostClock {
    /// What the clock reads at real instant `t`.
    pub(crate) fn local(self, t: u64) -> LocalTime {
        let ns = self.offset.as_nanos() + u128::from(t) * u128::from(self.rate_ppm) / u128::from(PPM);
        LocalTime::from_duration(Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }

    /// The first real instant at which the clock reads `l` or later.
    pub(crate) fn real_at(self, l: LocalTime) -> u64 {
        let (l, off) = (l.as_duration().as_nanos(), self.offset.as_nanos());
        if l <= off {
            return 0;
        }
        let num = (l - off) * u128::from(PPM);
        u64::try_from(num.div_ceil(u128::from(self.rate_ppm))).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_earliest_first_and_ties_in_order() {
        let mut q = Events::new();
        q.push(5, "b");
        q.push(3, "a");
        q.push(5, "c");
        assert_eq!([q.pop(), q.pop(), q.pop(), q.pop()], [Some((3, "a")), Some((5, "b")), Some((5, "c")), None]);
    }

    #[test]
    fn the_database_fails_fatally_if_any_active_fault_is_fatal() {
        assert_eq!(failing_kind([]), None);
        assert_eq!(failing_kind([false, false]), Some(ErrorKind::Retryable));
        assert_eq!(failing_kind([false, true, false]), Some(ErrorKind::Fatal));
        assert_eq!(failing_kind([true, false]), Some(ErrorKind::Fatal));
    }

    #[test]
    fn a_slow_clock_reads_less_and_real_at_inverts_local() {
        let c = HostClock { offset: Duration::from_secs(86_400), rate_ppm: PPM / 2 };
        assert_eq!(c.local(2_000), LocalTime::from_duration(Duration::from_secs(86_400) + Duration::from_nanos(1_000)));
        for t in [0, 1, 999, 123_456_789] {
            assert!(c.real_at(c.local(t)) <= t && c.local(c.real_at(c.local(t))) == c.local(t));
        }
        assert_eq!(c.real_at(LocalTime::ZERO), 0);
    }
}
