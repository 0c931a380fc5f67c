//! Any body sent to `/convert`: the answer is a ConversionReview in JSON, never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let reviewed = capo_api::conversion::review_bytes(body);
    let answer: serde_json::Value =
        serde_json::from_slice(&reviewed.answer).expect("the answer is JSON");
    assert_eq!(answer["kind"], "ConversionReview");
    assert_eq!(
        reviewed.outcome.is_ok(),
        answer["response"]["result"]["status"] == "Success"
    );
});
