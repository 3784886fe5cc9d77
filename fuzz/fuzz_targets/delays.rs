#![no_main]
//! Fuzz target: see `leaderelection::sim::checks::delays`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection::sim::checks::delays(data) {
        panic!("delays: {e}");
    }
});
