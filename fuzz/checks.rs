//! What each fuzz target holds true of any input, as plain functions: libFuzzer's targets
//! (`fuzz_targets/`, nightly) call them, and so does the bounded pass on the stable toolchain
//! in the integration tests (`tests/it/fuzz_pass.rs`), which CI runs. A broken property panics.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use capo_api::conversion::{CONVERTIBLE_KINDS, HUB, SPOKE, convert};
use capo_provider::cloud::{CloudCredentials, Service, classify_response, retry_after};
use capo_provider::cloud::{cinder, glance, neutron, nova, octavia, server_message};
use capo_provider::manager::webhook::Validators;
use capo_provider::manager::webhook::admission::review;
use capo_provider::manager::webhook::capo_rules::capo_validators;

/// Any body sent to `/convert`: the answer is a ConversionReview in JSON, never a panic.
pub fn conversion_review(body: &[u8]) {
    let reviewed = capo_api::conversion::review_bytes(body);
    let answer: serde_json::Value =
        serde_json::from_slice(&reviewed.answer).expect("the answer is JSON");
    assert_eq!(answer["kind"], "ConversionReview");
    assert_eq!(
        reviewed.outcome.is_ok(),
        answer["response"]["result"]["status"] == "Success"
    );
}

/// Any JSON object, as each convertible kind in each version (the first byte picks): converting
/// it never panics, and what converts one way converts back.
pub fn conversion_round_trip(body: &[u8]) {
    let Some((&pick, json)) = body.split_first() else {
        return;
    };
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(json) else {
        return;
    };
    let kind = CONVERTIBLE_KINDS[usize::from(pick) % CONVERTIBLE_KINDS.len()];
    let (from, to) = if pick & 0x80 == 0 {
        (SPOKE, HUB)
    } else {
        (HUB, SPOKE)
    };
    let group = capo_api::GROUP;
    object.insert("kind".into(), kind.into());
    object.insert("apiVersion".into(), format!("{group}/{from}").into());
    let object = serde_json::Value::Object(object);
    if let Ok(there) = convert(&object, &format!("{group}/{to}")) {
        convert(&there, &format!("{group}/{from}")).expect("what converts one way converts back");
    }
}

static VALIDATORS: LazyLock<Validators> = LazyLock::new(capo_validators);

/// Any body sent to `/validate/<resource>`: an AdmissionReview answer, never a panic, for
/// every resource capo-rs validates.
pub fn admission_review(body: &[u8]) {
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
}

/// Any `clouds.yaml` in a credentials Secret: resolved or refused with a reason, never a
/// panic, and the credentials' `Debug` says nothing of the file: it reads the same whatever
/// the file holds. (Asking only that it not contain the file was wrong: libFuzzer found a
/// file that is a prefix of the `Debug` text itself, `fuzz/seeds/clouds_yaml/regression-*`.)
pub fn clouds_yaml(body: &[u8]) {
    let clouds_yaml = String::from_utf8_lossy(body).into_owned();
    for cloud_name in ["openstack", "capo"] {
        let credentials = CloudCredentials {
            clouds_yaml: clouds_yaml.clone(),
            cacert: None,
            cloud_name: cloud_name.into(),
            region: None,
        };
        if let Err(error) = credentials.resolve() {
            assert!(!error.to_string().is_empty());
        }
        let without_file = CloudCredentials {
            clouds_yaml: String::new(),
            ..credentials.clone()
        };
        assert_eq!(format!("{credentials:?}"), format!("{without_file:?}"));
    }
}

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) {
    let _ = serde_json::from_slice::<T>(body);
}

/// Any answer from a cloud endpoint (a status and a Retry-After from the first 34 bytes, the
/// rest the body): classified and decoded into every type the cloud layer reads, never a
/// panic; a Retry-After is never past the longest pause.
pub fn cloud_answers(data: &[u8]) {
    let (head, body) = data.split_at(data.len().min(34));
    let status = u16::from_le_bytes([
        head.first().copied().unwrap_or(0),
        head.get(1).copied().unwrap_or(0),
    ]);
    let status = http::StatusCode::from_u16(100 + status % 500).unwrap_or(http::StatusCode::OK);
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_bytes(head.get(2..).unwrap_or_default()) {
        headers.insert(http::header::RETRY_AFTER, value);
    }
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    if let Some(wait) = retry_after(&headers, now) {
        assert!(wait <= capo_provider::cloud::MAX_RETRY_AFTER);
    }
    let _ = classify_response(status, &headers, body, Service::LoadBalancer, "fuzz", now);
    let _ = server_message(status, body);
    decode::<nova::Server>(body);
    decode::<nova::Flavor>(body);
    decode::<octavia::LoadBalancer>(body);
    decode::<octavia::Member>(body);
    decode::<octavia::StatusTree>(body);
    decode::<octavia::LoadBalancerRow>(body);
    decode::<neutron::Port>(body);
    decode::<neutron::Network>(body);
    decode::<neutron::Subnet>(body);
    decode::<neutron::FloatingIp>(body);
    decode::<neutron::SecurityGroup>(body);
    decode::<cinder::Volume>(body);
    decode::<glance::Image>(body);
}
