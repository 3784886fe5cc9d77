#![no_main]
//! Fuzz target: see `leaderelection_sim::checks::delays`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection_sim::checks::delays(data) {
        panic!("delays: {e}");
    }
});
