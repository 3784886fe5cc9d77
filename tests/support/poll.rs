//! Waiting for a condition with a deadline, never a fixed nap: the loop
//! behind every suite's `wait_for` (`support`, `cli/tests/common`) and
//! `eventually` (`threaded`), each at its own pace.

use std::thread;
use std::time::{Duration, Instant};

/// Polls `cond` every `step` until it holds (true) or `within` passes
/// (false); `cond` is asked once more at the deadline.
pub fn poll_until(within: Duration, step: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(step);
    }
}
