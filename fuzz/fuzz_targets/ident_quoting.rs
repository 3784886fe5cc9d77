#![no_main]
//! Fuzz target: see `leaderelection_sim::checks::ident_quoting`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = leaderelection_sim::checks::ident_quoting(data) {
        panic!("ident_quoting: {e}");
    }
});
