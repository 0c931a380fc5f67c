//! Any answer from a cloud endpoint: a status, a Retry-After and a body, classified and
//! decoded into every type the cloud layer reads, never a panic.
#![no_main]

use std::time::{Duration, SystemTime};

use capo_provider::cloud::{Service, classify_response, retry_after, server_message};
use capo_provider::cloud::{cinder, glance, neutron, nova, octavia};

fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) {
    let _ = serde_json::from_slice::<T>(body);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((head, body)) = data.split_at_checked(data.len().min(34)) else {
        return;
    };
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
});
