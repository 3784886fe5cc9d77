#![no_main]
//! Fuzz target: see `leaderelection_sim::checks::timing_invariant`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection_sim::checks::timing_invariant(data) {
        panic!("timing_invariant: {e}");
    }
});
