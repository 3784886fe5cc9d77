//! The simulation's only source of randomness: a seeded SplitMix64, and a
//! reader that turns any byte string into choices.

use std::time::Duration;

/// A small seeded generator. Every random choice the simulation makes comes
/// from one of these, seeded from the schedule; nothing reads a global source.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator that starts from `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is zero).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A duration in `[lo, hi]`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo).as_nanos().min(u64::MAX as u128 - 1) as u64;
        lo + Duration::from_nanos(self.below(span + 1))
    }

    /// True with probability `pct`/100.
    pub fn percent(&mut self, pct: u8) -> bool {
        self.below(100) < u64::from(pct)
    }
}

/// Reads a byte string front to back; past its end every read is zero, so
/// any input (a fuzzer's included) decodes to something.
#[derive(Clone, Debug)]
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, pos: 0 }
    }

    /// The next byte, or zero past the end.
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }
}

/// `d * num / den`, in nanoseconds, saturating.
pub(crate) fn scale(d: Duration, num: u64, den: u64) -> Duration {
    let n = d.as_nanos() * u128::from(num) / u128::from(den.max(1));
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}
