//! Any answer from a cloud endpoint: a status, a Retry-After and a body, classified and
//! decoded into every type the cloud layer reads, never a panic.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::cloud_answers(data));
