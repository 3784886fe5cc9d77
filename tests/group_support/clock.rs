//! The clock every process of the machine shares (CLOCK_MONOTONIC, what
//! `Instant` reads on Linux), read directly so that instants reported by
//! different processes compare: the group chaos suite's workers and the
//! group benchmark's (`examples/bench/groups.rs`, which includes this file).

use std::time::Instant;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Linux's clock ids.
const CLOCK_MONOTONIC: i32 = 1;
pub const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
pub const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// `clock`'s reading in nanoseconds.
pub fn clock_ns(clock: i32) -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime(2) writes one timespec (two 64-bit fields on
    // x86-64 and arm64 Linux) into the struct it is given.
    let rc = unsafe { clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock})");
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the
/// machine (it is what `Instant` reads on Linux), so instants reported by
/// different workers compare directly.
pub fn mono_ns() -> u64 {
    clock_ns(CLOCK_MONOTONIC)
}

/// Turns `Instant`s (which hide their CLOCK_MONOTONIC reading) into
/// nanoseconds, with bounds on each side: an anchor `Instant` was read
/// between two readings `lo <= hi` of the clock, so an instant `i` lies in
/// `[lo + (i - anchor), hi + (i - anchor)]`. Starts take the lower end,
/// ends and deadlines the upper (tens of nanoseconds apart).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    anchor: Instant,
    lo: u64,
    hi: u64,
}

impl Clock {
    pub fn new() -> Clock {
        let mut best: Option<Clock> = None;
        for _ in 0..50 {
            let lo = mono_ns();
            let anchor = Instant::now();
            let hi = mono_ns();
            if best.is_none_or(|b| hi - lo < b.hi - b.lo) {
                best = Some(Clock { anchor, lo, hi });
            }
        }
        best.unwrap()
    }

    fn offset(&self, base: u64, i: Instant) -> u64 {
        if i >= self.anchor {
            base + (i - self.anchor).as_nanos() as u64
        } else {
            base.saturating_sub((self.anchor - i).as_nanos() as u64)
        }
    }

    /// At or before `i`.
    pub fn lower(&self, i: Instant) -> u64 {
        self.offset(self.lo, i)
    }

    /// At or after `i`.
    pub fn upper(&self, i: Instant) -> u64 {
        self.offset(self.hi, i)
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}
