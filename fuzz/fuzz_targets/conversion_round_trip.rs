//! Any JSON object, as each convertible kind in each version: converting it never panics,
//! and what converts one way converts back.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::conversion_round_trip(data));
