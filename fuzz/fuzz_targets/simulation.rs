#![no_main]
//! Fuzz target: see `leaderelection_sim::checks::simulation`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection_sim::checks::simulation(data) {
        panic!("simulation: {e}");
    }
});
