//! Any body sent to `/validate/<resource>`: an AdmissionReview answer, never a panic, for
//! every resource capo-rs validates.
#![no_main]

#[path = "../checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::admission_review(data));
