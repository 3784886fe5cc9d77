#![no_main]
//! Fuzz target: see `leaderelection_sim::checks::lease_maths`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection_sim::checks::lease_maths(data) {
        panic!("lease_maths: {e}");
    }
});
