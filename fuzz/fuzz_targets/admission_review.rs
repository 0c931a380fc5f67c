//! Any body sent to `/validate/<resource>`: an AdmissionReview answer, never a panic, for
//! every resource capo-rs validates.
#![no_main]

use std::sync::LazyLock;

use capo_provider::manager::webhook::Validators;
use capo_provider::manager::webhook::admission::review;
use capo_provider::manager::webhook::capo_rules::capo_validators;

static VALIDATORS: LazyLock<Validators> = LazyLock::new(capo_validators);

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    for resource in [
        "openstackclusters",
        "openstackmachines",
        "openstackclustertemplates",
        "openstackmachinetemplates",
    ] {
        let answer = review(&VALIDATORS, resource, body);
        assert_eq!(answer["kind"], "AdmissionReview");
        assert!(answer["response"]["allowed"].is_boolean());
    }
});
