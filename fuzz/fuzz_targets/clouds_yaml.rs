//! Any `clouds.yaml` in a credentials Secret: resolved or refused with a reason, never a
//! panic, and the reason never repeats the file's secrets.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::clouds_yaml(data));
