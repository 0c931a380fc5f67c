//! Any body sent to `/convert`: the answer is a ConversionReview in JSON, never a panic.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::conversion_review(data));
