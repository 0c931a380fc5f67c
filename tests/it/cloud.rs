//! The OpenStack access layer against wiremock (Keystone, Octavia with the recorded real
//! responses) and, for virtual-time measurements, against an in-process session.

use std::collections::VecDeque;
use std::io::Write;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use capo_provider::cloud::octavia::{MemberSpec, ProvisioningStatus};
use capo_provider::cloud::{
    CloudClient, CloudCredentials, CloudError, CloudOptions, Clouds, NoAuthSession, RateLimit,
    RetryPolicy, SendError, Service, Session, SessionScope,
};
use http::{Request, Response};
use prometheus::{Encoder, Registry, TextEncoder};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use url::Url;
use wiremock::matchers::{body_partial_json, header, method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

const POOL: &str = "96c8a8b6-8923-4c1f-bbf4-0b44750cb5e6";
const MEMBER: &str = "6e628d0e-e5fe-49e0-badc-595cc6f9036c";
const PASSWORD: &str = "hunter2-very-secret-password";
const TOKEN_A: &str = "gAAAAA-token-A-secret";
const TOKEN_B: &str = "gAAAAA-token-B-secret";

fn sample(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/octavia")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn options() -> CloudOptions {
    let mut options = CloudOptions::default();
    options.path.retry = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(20),
        max_elapsed: Duration::from_secs(10),
    };
    options
}

fn clouds(options: CloudOptions) -> (Arc<Clouds>, Registry) {
    let registry = Registry::new();
    let clouds = Clouds::new(options, &registry, CancellationToken::new()).unwrap();
    (clouds, registry)
}

fn metrics_text(registry: &Registry) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// A client straight at wiremock, without Keystone.
fn noauth_client(server: &MockServer, options: CloudOptions) -> (CloudClient, Registry) {
    let (clouds, registry) = clouds(options);
    let url = Url::parse(&format!("{}/load-balancer", server.uri())).unwrap();
    let session = NoAuthSession::new([(Service::LoadBalancer, url)], Some("p1".into())).unwrap();
    (clouds.client(Arc::new(session)), registry)
}

fn json_response(status: u16, body: &Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(body)
}

// ---------------------------------------------------------------- Keystone

fn clouds_yaml(auth_url: &str) -> String {
    format!(
        "clouds:\n  test:\n    auth:\n      auth_url: {auth_url}\n      username: demo\n      \
         password: {PASSWORD}\n      project_name: demo\n      user_domain_name: Default\n      \
         project_domain_name: Default\n    region_name: RegionOne\n    interface: public\n"
    )
}

fn token_body(server: &MockServer, lifetime: chrono::TimeDelta) -> Value {
    token_body_with_octavia_at(server, lifetime, None)
}

/// A token whose catalog sends load-balancer calls to `octavia` (public interface only), or
/// to `server` like every other service's.
fn token_body_with_octavia_at(
    server: &MockServer,
    lifetime: chrono::TimeDelta,
    octavia: Option<&str>,
) -> Value {
    let expires =
        (chrono::Utc::now() + lifetime).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let endpoint = |kind: &str, prefix: &str| {
        json!({"type": kind, "id": kind, "name": kind, "endpoints": [
            {"id": format!("{kind}-public"), "interface": "public", "region": "RegionOne",
             "region_id": "RegionOne", "url": format!("{}/{prefix}", server.uri())},
            {"id": format!("{kind}-internal"), "interface": "internal", "region": "RegionOne",
             "region_id": "RegionOne", "url": format!("{}/internal/{prefix}", server.uri())}]})
    };
    let octavia_entry = match octavia {
        None => endpoint("load-balancer", "load-balancer"),
        Some(url) => json!({"type": "load-balancer", "id": "lb", "name": "octavia", "endpoints": [
            {"id": "lb-public", "interface": "public", "region": "RegionOne",
             "region_id": "RegionOne", "url": url}]}),
    };
    json!({"token": {
        "methods": ["password"],
        "expires_at": expires,
        "issued_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "user": {"id": "u1", "name": "demo", "domain": {"id": "default", "name": "Default"}},
        "project": {"id": "p1", "name": "demo", "domain": {"id": "default", "name": "Default"}},
        "roles": [{"id": "r1", "name": "member"}],
        "catalog": [endpoint("identity", "identity"), octavia_entry,
                    endpoint("network", "network"), endpoint("compute", "compute/v2.1")]
    }})
}

fn token_response(
    server: &MockServer,
    token: &str,
    lifetime: chrono::TimeDelta,
) -> ResponseTemplate {
    ResponseTemplate::new(201)
        .insert_header("x-subject-token", token)
        .set_body_json(token_body(server, lifetime))
}

async fn mount_identity_discovery(server: &MockServer) {
    let version = json!({"version": {"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
        "links": [{"rel": "self", "href": format!("{}/identity/v3/", server.uri())}],
        "media-types": [{"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}]}});
    Mock::given(method("GET"))
        .and(path_regex(r"^/identity(/v3)?/?$"))
        .respond_with(json_response(200, &version))
        .mount(server)
        .await;
}

/// Keystone on `server`: version discovery, and tokens named `token` for every request.
async fn mount_keystone(server: &MockServer, token: &str, lifetime: chrono::TimeDelta) {
    mount_identity_discovery(server).await;
    Mock::given(method("POST"))
        .and(path("/identity/v3/auth/tokens"))
        .respond_with(token_response(server, token, lifetime))
        .mount(server)
        .await;
}

/// Keystone issuing TOKEN_A (valid for `first_lifetime`) once, then TOKEN_B.
async fn mount_keystone_rotating(server: &MockServer, first_lifetime: chrono::TimeDelta) {
    mount_identity_discovery(server).await;
    Mock::given(method("POST"))
        .and(path("/identity/v3/auth/tokens"))
        .respond_with(token_response(server, TOKEN_A, first_lifetime))
        .up_to_n_times(1)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path("/identity/v3/auth/tokens"))
        .respond_with(token_response(server, TOKEN_B, chrono::TimeDelta::hours(1)))
        .mount(server)
        .await;
}

fn credentials(server: &MockServer) -> CloudCredentials {
    CloudCredentials {
        clouds_yaml: clouds_yaml(&format!("{}/identity/v3", server.uri())),
        cacert: None,
        cloud_name: "test".into(),
        region: None,
    }
}

async fn token_requests(server: &MockServer) -> usize {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            r.method == wiremock::http::Method::POST && r.url.path().ends_with("/auth/tokens")
        })
        .count()
}

#[tokio::test]
async fn keystone_token_and_catalog_route_calls_with_the_token() {
    let server = MockServer::start().await;
    mount_identity_discovery(&server).await;
    Mock::given(method("POST"))
        .and(path("/identity/v3/auth/tokens"))
        .and(body_partial_json(
            json!({"auth": {"identity": {"methods": ["password"]}}}),
        ))
        .respond_with(token_response(
            &server,
            TOKEN_A,
            chrono::TimeDelta::hours(1),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{POOL}/members/{MEMBER}"
        )))
        .and(header("x-auth-token", TOKEN_A))
        .respond_with(json_response(200, &sample("member_active.json")))
        .mount(&server)
        .await;

    let (clouds, registry) = clouds(options());
    let connected = clouds.connect(&credentials(&server)).await;
    let client = connected.unwrap();
    let member = client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert_eq!(member.provisioning_status, ProvisioningStatus::Active);

    // A second client with the same credential reuses the token: still one token request.
    let again = clouds.connect(&credentials(&server)).await.unwrap();
    again.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert_eq!(token_requests(&server).await, 1);
    let text = metrics_text(&registry);
    assert!(
        text.contains(r#"capo_openstack_api_requests_total{request="loadbalancer_member_get"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"capo_openstack_api_requests_total{request="token_create"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn idle_sessions_are_dropped_after_their_ttl() {
    let server = MockServer::start().await;
    mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
    let mut opts = options();
    opts.session_idle_ttl = Duration::ZERO;
    let (clouds, _) = clouds(opts);
    clouds.connect(&credentials(&server)).await.unwrap();
    clouds.connect(&credentials(&server)).await.unwrap();
    assert_eq!(token_requests(&server).await, 2);
}

/// `--scope-cache-max-size`, as CAPO's: a session (one token) per credential, at most N kept;
/// past N the one used longest ago goes and authenticates again when next used; 0 keeps none.
#[tokio::test]
async fn the_session_cache_keeps_at_most_its_size_and_none_at_zero() {
    for (max, tokens) in [(10, 2), (1, 3), (0, 4)] {
        let server = MockServer::start().await;
        mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
        let mut opts = options();
        opts.session_cache_max = max;
        let (clouds, _) = clouds(opts);
        let one = credentials(&server);
        let mut other = credentials(&server);
        other.region = Some("OtherRegion".into());
        for credential in [&one, &other, &one, &one] {
            clouds.connect(credential).await.unwrap();
        }
        assert_eq!(
            token_requests(&server).await,
            tokens,
            "four connections of two credentials, {max} sessions kept"
        );
    }
}

#[tokio::test]
async fn region_and_interface_choose_the_endpoint() {
    let server = MockServer::start().await;
    mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
    Mock::given(method("GET"))
        .and(path(format!(
            "/internal/load-balancer/v2/lbaas/pools/{POOL}/members/{MEMBER}"
        )))
        .respond_with(json_response(200, &sample("member_active.json")))
        .expect(1)
        .mount(&server)
        .await;
    let mut creds = credentials(&server);
    creds.clouds_yaml = creds
        .clouds_yaml
        .replace("interface: public", "interface: internal");
    let (clouds, _) = clouds(options());
    let client = clouds.connect(&creds).await.unwrap();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();

    // A region the catalog does not have is a clear error, not a panic.
    creds.region = Some("Nowhere".into());
    let client = clouds.connect(&creds).await.unwrap();
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::Config(_)), "{error:?}");
}

#[tokio::test]
async fn cacert_from_the_secret_is_loaded_and_garbage_is_refused() {
    let server = MockServer::start().await;
    mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
    let (clouds, _) = clouds(options());
    let mut creds = credentials(&server);
    creds.cacert = Some(include_str!("../fixtures/test-ca.pem").into());
    clouds.connect(&creds).await.unwrap();

    creds.cacert = Some("not a certificate".into());
    creds.region = Some("OtherRegion".into()); // a different credential: no cached session
    let error = clouds.connect(&creds).await.unwrap_err();
    assert!(matches!(error, CloudError::Config(_)), "{error:?}");
}

/// Member GETs the server received carrying `token`.
async fn gets_with_token(server: &MockServer, token: &str) -> usize {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            r.method == wiremock::http::Method::GET
                && r.headers
                    .get("x-auth-token")
                    .is_some_and(|t| t.as_bytes() == token.as_bytes())
        })
        .count()
}

#[tokio::test]
async fn token_is_renewed_before_it_expires() {
    let server = MockServer::start().await;
    mount_keystone_rotating(&server, chrono::TimeDelta::seconds(3)).await;
    // Token A stays valid until it expires: a call made while the renewal is in flight uses it.
    for token in [TOKEN_A, TOKEN_B] {
        Mock::given(method("GET"))
            .and(path(format!(
                "/load-balancer/v2/lbaas/pools/{POOL}/members/{MEMBER}"
            )))
            .and(header("x-auth-token", token))
            .respond_with(json_response(200, &sample("member_active.json")))
            .mount(&server)
            .await;
    }

    let (clouds, _) = clouds(options());
    let client = clouds.connect(&credentials(&server)).await.unwrap();
    // The margin is a fifth of the 3 s lifetime: renewal ~2.4 s after issue, before expiry.
    // Calls go on until one carries the renewed token, which must happen without a 401.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gets_with_token(&server, TOKEN_B).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "token was not renewed ({} token requests)",
            token_requests(&server).await
        );
        client.octavia().get_member(POOL, MEMBER).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(token_requests(&server).await, 2, "one renewal");
}

#[tokio::test]
async fn a_401_triggers_one_reauthentication() {
    let server = MockServer::start().await;
    mount_keystone_rotating(&server, chrono::TimeDelta::hours(1)).await;
    let member_path = format!("/load-balancer/v2/lbaas/pools/{POOL}/members/{MEMBER}");
    Mock::given(method("GET"))
        .and(path(member_path.clone()))
        .and(header("x-auth-token", TOKEN_A))
        .respond_with(json_response(401, &json!({"error": {"code": 401, "message": "The request you have made requires authentication.", "title": "Unauthorized"}})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(member_path))
        .and(header("x-auth-token", TOKEN_B))
        .respond_with(json_response(200, &sample("member_active.json")))
        .expect(1)
        .mount(&server)
        .await;

    let (clouds, _) = clouds(options());
    let client = clouds.connect(&credentials(&server)).await.unwrap();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert!(token_requests(&server).await >= 2);
}

#[tokio::test]
async fn wrong_password_is_unauthorized_and_logs_no_secret() {
    let server = MockServer::start().await;
    mount_identity_discovery(&server).await;
    Mock::given(method("POST"))
        .and(path("/identity/v3/auth/tokens"))
        .respond_with(json_response(401, &json!({"error": {"code": 401, "message": "The request you have made requires authentication.", "title": "Unauthorized"}})))
        .mount(&server)
        .await;
    let (clouds, _) = clouds(options());
    let error = clouds.connect(&credentials(&server)).await.unwrap_err();
    assert!(matches!(error, CloudError::Unauthorized(_)), "{error:?}");
    assert!(!error.is_retryable());
    assert!(!error.to_string().contains(PASSWORD));
}

#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the process-wide subscriber (once): every test's logs land in one buffer, so the
/// secret check below covers them all.
fn captured_logs() -> CapturedLogs {
    static LOGS: std::sync::OnceLock<CapturedLogs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = CapturedLogs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
    .clone()
}

#[tokio::test]
async fn logs_have_one_event_per_request_and_no_secrets() {
    const LOGGED_POOL: &str = "0f0f0f0f-1111-2222-3333-444444444444";
    let logs = captured_logs();

    let server = MockServer::start().await;
    mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{LOGGED_POOL}/members"
        )))
        .respond_with(json_response(200, &sample("member_list_active.json")))
        .mount(&server)
        .await;
    let (clouds, _) = clouds(options());
    let creds = credentials(&server);
    let client = clouds.connect(&creds).await.unwrap();
    client.octavia().list_members(LOGGED_POOL).await.unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for secret in [PASSWORD, TOKEN_A, TOKEN_B, creds.clouds_yaml.as_str()] {
        assert!(!text.contains(secret), "a secret reached the logs:\n{text}");
    }
    let events: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("openstack request") && l.contains(LOGGED_POOL))
        .collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    for field in [
        "service=\"load-balancer\"",
        "operation=\"loadbalancer_member_list\"",
        "status=\"200\"",
        "duration_ms=",
    ] {
        assert!(events[0].contains(field), "{field} missing: {}", events[0]);
    }
}

// ---------------------------------------------------------------- errors from real bodies

async fn answer_once(status: u16, body: &Value) -> CloudError {
    let server = MockServer::start().await;
    Mock::given(path_regex("^/load-balancer/v2/"))
        .respond_with(json_response(status, body))
        .mount(&server)
        .await;
    let (client, _) = noauth_client(&server, options());
    let spec = MemberSpec::new("m", "192.0.2.10", 8080);
    client
        .octavia()
        .create_member(POOL, &spec)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn recorded_409s_map_to_busy_and_conflict() {
    for (name, case) in sample("conflict_409_samples.json").as_object().unwrap() {
        let error = answer_once(409, &case["body"]).await;
        assert!(matches!(error, CloudError::Busy(_)), "{name}: {error:?}");
        assert!(error.is_retryable(), "{name}");
        assert!(error.message().contains("is immutable"), "{name}");
    }
    let duplicate = &sample("error_samples.json")["member_duplicate"]["body"];
    let error = answer_once(409, duplicate).await;
    assert!(matches!(error, CloudError::Conflict(_)), "{error:?}");
    assert!(!error.is_retryable());
    assert_eq!(
        error.message(),
        "Another member on this pool is already using ip 192.0.2.10 on protocol_port 8080"
    );
    let context = error.context().unwrap();
    assert_eq!(context.service, Service::LoadBalancer);
    assert_eq!(context.operation, "loadbalancer_member_create");
}

#[tokio::test]
async fn recorded_400_404_and_both_404_shapes() {
    let samples = sample("error_samples.json");
    for (name, case) in samples.as_object().unwrap() {
        let status = case["status"].as_u64().unwrap() as u16;
        let error = answer_once(status, &case["body"]).await;
        let expected = match status {
            400 => matches!(error, CloudError::BadRequest(_)),
            404 => error.is_not_found(),
            409 => matches!(error, CloudError::Conflict(_)),
            _ => false,
        };
        assert!(expected, "{name}: {error:?}");
        assert!(!error.message().is_empty(), "{name}");
    }
    let pecan = answer_once(404, &samples["member_list_unknown_pool"]["body"]).await;
    assert_eq!(
        pecan.message(),
        "Pool 00000000-0000-0000-0000-000000000000 not found."
    );
    let fault = answer_once(404, &sample("member_get_404.json")["body"]).await;
    assert!(fault.message().starts_with("Member 75993e8c"));
}

#[tokio::test]
async fn error_objects_decode_as_answers_not_failures() {
    let server = MockServer::start().await;
    let member = sample("member_error_via_fault_injection.json");
    let member_body = if member.get("member").is_some() {
        member.clone()
    } else {
        json!({"member": member})
    };
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{POOL}/members/{MEMBER}"
        )))
        .respond_with(json_response(200, &member_body))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(
            "^/load-balancer/v2/lbaas/loadbalancers/[^/]+/status$",
        ))
        .respond_with(json_response(
            200,
            &sample("status_tree_with_error_member.json"),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{POOL}/members/garbled"
        )))
        .respond_with(json_response(200, &json!({"member": {"id": 5}})))
        .mount(&server)
        .await;
    let (client, _) = noauth_client(&server, options());
    let member = client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert_eq!(member.provisioning_status, ProvisioningStatus::Error);
    let garbled = client
        .octavia()
        .get_member(POOL, "garbled")
        .await
        .unwrap_err();
    assert!(matches!(garbled, CloudError::Decode(_)), "{garbled:?}");
    assert!(!garbled.is_retryable());
    let tree = client.octavia().status_tree("lb").await.unwrap();
    let members = &tree.listeners[0].pools[0].members;
    assert!(
        members
            .iter()
            .any(|m| m.provisioning_status == ProvisioningStatus::Error)
    );
}

// ---------------------------------------------------------------- retries

#[tokio::test]
async fn retries_stop_at_their_bound() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(json_response(
            500,
            &json!({"faultcode": "Server", "faultstring": "boom"}),
        ))
        .expect(3)
        .mount(&server)
        .await;
    let (client, registry) = noauth_client(&server, options());
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    assert_eq!(error.message(), "boom");
    let text = metrics_text(&registry);
    assert!(text.contains(r#"capo_openstack_api_retries_total{reason="transient",request="loadbalancer_member_get"} 2"#), "{text}");
    assert!(text.contains(r#"capo_openstack_api_request_errors_total{error="transient",request="loadbalancer_member_get"} 1"#), "{text}");
}

#[tokio::test]
async fn post_is_not_retried_on_5xx_but_get_recovers() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(json_response(502, &json!({})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(json_response(503, &json!({})))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(json_response(200, &sample("member_active.json")))
        .mount(&server)
        .await;
    let (client, _) = noauth_client(&server, options());
    let spec = MemberSpec::new("m", "192.0.2.10", 8080);
    let error = client
        .octavia()
        .create_member(POOL, &spec)
        .await
        .unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let (clouds, _) = clouds(options());
    let session = NoAuthSession::new([(Service::LoadBalancer, url)], None).unwrap();
    let client = clouds.client(Arc::new(session));
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
}

#[tokio::test]
async fn slow_answers_time_out_and_cancellation_stops_a_call() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            json_response(200, &sample("member_active.json")).set_delay(Duration::from_secs(30)),
        )
        .mount(&server)
        .await;
    let mut opts = options();
    opts.path.request_timeout = Duration::from_millis(200);
    opts.path.retry.max_attempts = 1;
    let (client, _) = noauth_client(&server, opts);
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    assert!(error.message().contains("no answer within"), "{error}");

    let (client, _) = noauth_client(&server, options());
    let cancel = CancellationToken::new();
    let client = client.with_cancel(&cancel);
    let call = tokio::spawn(async move { client.octavia().get_member(POOL, MEMBER).await });
    cancel.cancel();
    let error = call.await.unwrap().unwrap_err();
    assert!(matches!(error, CloudError::Cancelled(_)), "{error:?}");
}

#[tokio::test]
async fn lists_follow_pagination_links() {
    let server = MockServer::start().await;
    let members = sample("member_list_active.json")["members"].clone();
    let next = format!(
        "{}/load-balancer/v2/lbaas/pools/{POOL}/members?marker={MEMBER}",
        server.uri()
    );
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{POOL}/members"
        )))
        .and(wiremock::matchers::query_param("marker", MEMBER))
        .respond_with(json_response(
            200,
            &json!({"members": members, "members_links": []}),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path(format!(
            "/load-balancer/v2/lbaas/pools/{POOL}/members"
        )))
        .respond_with(json_response(
            200,
            &json!({"members": members,
            "members_links": [{"rel": "next", "href": next}]}),
        ))
        .mount(&server)
        .await;
    let (client, _) = noauth_client(&server, options());
    let listed = client.octavia().list_members(POOL).await.unwrap();
    assert_eq!(listed.len(), 2);
}

/// A cloud that sends `next` links forever gets its listing refused after
/// `MAX_LISTED` objects: no endless loop, no unbounded memory, and no list cut short.
#[tokio::test]
async fn endless_pagination_is_refused_not_followed_forever() {
    let server = MockServer::start().await;
    let member = sample("member_list_active.json")["members"][0].clone();
    let page: Vec<Value> = std::iter::repeat_n(member, 1000).collect();
    let next = format!(
        "{}/load-balancer/v2/lbaas/pools/{POOL}/members?marker={MEMBER}",
        server.uri()
    );
    Mock::given(method("GET"))
        .respond_with(json_response(
            200,
            &json!({"members": page, "members_links": [{"rel": "next", "href": next}]}),
        ))
        .mount(&server)
        .await;
    let mut opts = options();
    opts.rate_limit = RateLimit {
        qps: std::num::NonZeroU32::new(10_000).unwrap(),
        burst: std::num::NonZeroU32::new(10_000).unwrap(),
    };
    let (client, _) = noauth_client(&server, opts);
    let error = client.octavia().list_members(POOL).await.unwrap_err();
    assert!(matches!(error, CloudError::Decode(_)), "{error:?}");
    assert!(error.message().contains("50000"), "{error}");
    let pages = server.received_requests().await.unwrap_or_default().len();
    assert_eq!(
        pages,
        capo_provider::cloud::MAX_LISTED / 1000 + 1,
        "requests made"
    );
}

/// An endpoint that answers every request with a body of 1 GiB, declared in Content-Length
/// or streamed without one until the client hangs up; it counts the bytes it got out.
struct GiantBody {
    url: String,
    sent: tokio::task::JoinHandle<u64>,
}

impl GiantBody {
    const SIZE: u64 = 1 << 30;

    async fn start(declared: bool) -> Self {
        Self::answering("200 OK", declared).await
    }

    /// `status` is the status line's end, and any headers of its own (`201 Created\r\nx: y`).
    async fn answering(status: &'static str, declared: bool) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/load-balancer", listener.local_addr().unwrap());
        let sent = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let length = match declared {
                true => format!("content-length: {}\r\n", Self::SIZE),
                false => "connection: close\r\n".to_owned(),
            };
            let answer =
                format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{length}\r\n");
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return 0;
            }
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0;
            while sent < Self::SIZE && stream.write_all(&chunk).await.is_ok() {
                sent += chunk.len() as u64;
            }
            sent
        });
        GiantBody { url, sent }
    }
}

/// A service answering 1 GiB (declared, or streamed without a length) is cut off at
/// `MAX_ANSWER_BODY`: the call fails as transient, and the endpoint gets no more than the cap
/// (and the sockets' buffers) out before the client hangs up.
#[tokio::test]
async fn a_1_gib_answer_is_cut_off_at_the_cap_not_held() {
    for declared in [true, false] {
        let giant = GiantBody::start(declared).await;
        let server = MockServer::start().await;
        mount_identity_discovery(&server).await;
        let token =
            token_body_with_octavia_at(&server, chrono::TimeDelta::hours(1), Some(&giant.url));
        Mock::given(method("POST"))
            .and(path("/identity/v3/auth/tokens"))
            .respond_with(
                ResponseTemplate::new(201)
                    .insert_header("x-subject-token", TOKEN_A)
                    .set_body_json(token),
            )
            .mount(&server)
            .await;
        let mut opts = options();
        opts.path.retry.max_attempts = 1;
        let (clouds, _) = clouds(opts);
        let client = clouds.connect(&credentials(&server)).await.unwrap();
        let started = std::time::Instant::now();
        let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
        let took = started.elapsed();
        drop(client);
        let how = if declared {
            "Content-Length"
        } else {
            "streamed"
        };
        cut_off_at_the_cap(&error, giant, took, &format!("1 GiB answer ({how})")).await;
    }
}

/// A 1 GiB answer failed the call as transient, and the endpoint got little more than
/// `MAX_ANSWER_BODY` out before the client stopped reading.
async fn cut_off_at_the_cap(
    error: &CloudError,
    giant: GiantBody,
    took: std::time::Duration,
    what: &str,
) {
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    assert!(error.message().contains("exceeds 64 MiB"), "{error}");
    let sent = giant.sent.await.unwrap();
    eprintln!(
        "{what}: refused after {:.0} ms; the endpoint got {:.1} MiB out",
        took.as_secs_f64() * 1000.0,
        sent as f64 / f64::from(1 << 20)
    );
    assert!(
        sent < (capo_provider::cloud::MAX_ANSWER_BODY as u64) * 2,
        "the client read on: {sent} bytes"
    );
}

/// Keystone answering the token request with 1 GiB (a token, or a refusal) is cut off at
/// `MAX_ANSWER_BODY` too: capo-rs asks for its tokens itself, through the bounded client.
#[tokio::test]
async fn a_1_gib_answer_from_keystone_is_cut_off_at_the_cap_not_held() {
    let answers = [
        ("201 Created\r\nx-subject-token: giant", true),
        ("201 Created\r\nx-subject-token: giant", false),
        ("401 Unauthorized", false),
    ];
    for (status, declared) in answers {
        let giant = GiantBody::answering(status, declared).await;
        let keystone = giant.url.replace("/load-balancer", "/identity/v3");
        let credentials = CloudCredentials {
            clouds_yaml: clouds_yaml(&keystone),
            cacert: None,
            cloud_name: "test".into(),
            region: None,
        };
        let (clouds, _) = clouds(options());
        let started = std::time::Instant::now();
        let error = clouds.connect(&credentials).await.unwrap_err();
        let took = started.elapsed();
        let what = format!("1 GiB from Keystone ({status:?}, declared {declared})");
        cut_off_at_the_cap(&error, giant, took, &what).await;
    }
}

/// An endpoint that sends its headers, then nothing more (the body's 1,000 bytes never come)
/// is given up at the request timeout, as one that sends nothing at all.
#[tokio::test]
async fn an_answer_that_hangs_after_its_headers_times_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
    let (hung_up_tx, hung_up) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buffer = [0u8; 4096];
        let _ = stream.read(&mut buffer).await;
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
        let _ = stream.write_all(head.as_bytes()).await;
        // Silence until the client hangs up.
        let _ = stream.read(&mut buffer).await;
        let _ = hung_up_tx.send(());
    });
    let mut opts = options();
    opts.path.request_timeout = Duration::from_millis(300);
    opts.path.retry.max_attempts = 1;
    let (clouds, _) = clouds(opts);
    let session = NoAuthSession::new([(Service::LoadBalancer, url)], None).unwrap();
    let client = clouds.client(Arc::new(session));
    let started = std::time::Instant::now();
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(client);
    hung_up.await.expect("the client hung up");
}

#[tokio::test]
async fn retry_after_over_http_pauses_the_next_request() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(json_response(429, &json!({})).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(json_response(200, &sample("member_active.json")))
        .mount(&server)
        .await;
    let (client, registry) = noauth_client(&server, options());
    let started = std::time::Instant::now();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    let text = metrics_text(&registry);
    assert!(text.contains(r#"capo_openstack_api_retries_total{reason="rate_limited",request="loadbalancer_member_get"} 1"#), "{text}");
    assert!(
        text.contains("capo_openstack_api_ratelimit_wait_seconds_bucket"),
        "{text}"
    );
}

// ---------------------------------------------------------------- virtual time

/// A status and the headers to answer with.
type Answer = (u16, Vec<(&'static str, String)>);

/// An in-process session: answers from a script, records when each request arrived.
struct ScriptedSession {
    scope: SessionScope,
    answers: Mutex<VecDeque<Answer>>,
    arrivals: Mutex<Vec<(tokio::time::Instant, String)>>,
}

impl ScriptedSession {
    fn new(answers: Vec<Answer>) -> Arc<Self> {
        Arc::new(ScriptedSession {
            scope: SessionScope {
                auth_url: "scripted".into(),
                region: "r1".into(),
                identity: String::new(),
            },
            answers: Mutex::new(answers.into()),
            arrivals: Mutex::new(Vec::new()),
        })
    }

    fn arrivals(&self) -> Vec<(tokio::time::Instant, String)> {
        self.arrivals.lock().unwrap().clone()
    }
}

#[async_trait]
impl Session for ScriptedSession {
    fn scope(&self) -> &SessionScope {
        &self.scope
    }

    async fn service_url(&self, service: Service) -> Result<Url, SendError> {
        Ok(Url::parse(&format!("http://scripted/{service}/")).unwrap())
    }

    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError> {
        self.arrivals
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), request.uri().path().to_owned()));
        let (status, headers) = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or((200, vec![]));
        let mut response = Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(name, value);
        }
        let body = if status == 200 {
            serde_json::to_vec(&sample("member_active.json")).unwrap()
        } else {
            b"{}".to_vec()
        };
        Ok(response.body(Bytes::from(body)).unwrap())
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_seconds_and_date_are_obeyed_in_virtual_time() {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(8));
    let session = ScriptedSession::new(vec![
        (429, vec![("retry-after", "5".into())]),
        (200, vec![]),
        (503, vec![("retry-after", date)]),
        (200, vec![]),
    ]);
    let mut opts = options();
    opts.path.max_gate_wait = Duration::from_secs(60);
    let (clouds, _) = clouds(opts);
    let client = clouds.client(session.clone());
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    let at: Vec<_> = session.arrivals().into_iter().map(|(at, _)| at).collect();
    assert_eq!(at.len(), 4);
    assert!(
        at[1] - at[0] >= Duration::from_secs(5),
        "{:?}",
        at[1] - at[0]
    );
    // An HTTP date has one-second resolution.
    assert!(
        at[3] - at[2] >= Duration::from_secs(7),
        "{:?}",
        at[3] - at[2]
    );
}

/// A Retry-After no clock can add (`u64::MAX` seconds) is held to five minutes: the call is
/// refused as rate limited, the process does not panic, and the pause ends.
#[tokio::test(start_paused = true)]
async fn a_retry_after_too_long_for_any_clock_is_held_to_five_minutes() {
    let session = ScriptedSession::new(vec![(429, vec![("retry-after", u64::MAX.to_string())])]);
    let (clouds, _) = clouds(options());
    let client = clouds.client(session.clone());
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(
        matches!(error, CloudError::RateLimited { retry_after, .. } if retry_after == Duration::from_secs(300)),
        "{error:?}"
    );
    tokio::time::advance(Duration::from_secs(301)).await;
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert_eq!(session.arrivals().len(), 2);
}

/// Two projects on one endpoint share its rate limiter, but a 429 sent to one holds only that
/// one's requests: the other tenant's go straight through.
#[tokio::test(start_paused = true)]
async fn a_429_to_one_project_pauses_that_project_only() {
    let told = ScriptedSession::new(vec![(429, vec![("retry-after", "30".into())])]);
    let other = Arc::new(ScriptedSession {
        scope: SessionScope {
            identity: "another-project".into(),
            ..told.scope.clone()
        },
        answers: Mutex::new(VecDeque::new()),
        arrivals: Mutex::new(Vec::new()),
    });
    let (clouds, _) = clouds(options());
    let (told_client, other_client) = (clouds.client(told.clone()), clouds.client(other.clone()));
    let error = told_client
        .octavia()
        .get_member(POOL, MEMBER)
        .await
        .unwrap_err();
    assert!(matches!(error, CloudError::RateLimited { .. }), "{error:?}");
    let started = tokio::time::Instant::now();
    other_client
        .octavia()
        .get_member(POOL, MEMBER)
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "not held by the other's pause"
    );
    let error = told_client
        .octavia()
        .get_member(POOL, MEMBER)
        .await
        .unwrap_err();
    assert!(error.message().contains("not sent"), "{error}");
    assert_eq!((told.arrivals().len(), other.arrivals().len()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_pause_holds_one_endpoint_not_the_others() {
    let session = ScriptedSession::new(vec![(429, vec![("retry-after", "30".into())])]);
    let (clouds, _) = clouds(options());
    let client = clouds.client(session.clone());
    // The 30 s pause exceeds the 10 s a call may wait: the caller gets RateLimited at once.
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(
        matches!(error, CloudError::RateLimited { retry_after, .. } if retry_after == Duration::from_secs(30)),
        "{error:?}"
    );
    // Another load-balancer call is refused without being sent...
    let started = tokio::time::Instant::now();
    let error = client.octavia().get_member(POOL, MEMBER).await.unwrap_err();
    assert!(matches!(error, CloudError::RateLimited { .. }), "{error:?}");
    assert!(error.message().contains("not sent"));
    assert_eq!(session.arrivals().len(), 1);
    // ...while Neutron on the same cloud goes straight through.
    let _ = client.neutron().get_network("n1").await;
    assert_eq!(session.arrivals().len(), 2);
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn limiter_paces_200_requests_at_qps_20_and_never_exceeds_burst() {
    const QPS: u32 = 20;
    const BURST: u32 = 10;
    let session = ScriptedSession::new(vec![]);
    let mut opts = options();
    opts.rate_limit = RateLimit {
        qps: NonZeroU32::new(QPS).unwrap(),
        burst: NonZeroU32::new(BURST).unwrap(),
    };
    opts.path.max_gate_wait = Duration::from_secs(60);
    let (clouds, _) = clouds(opts);
    // Two clients of the same endpoint share its limiter.
    let clients = [
        clouds.client(session.clone()),
        clouds.client(session.clone()),
    ];
    let started = tokio::time::Instant::now();
    let calls = (0..200).map(|i| {
        let client = clients[i % 2].clone();
        tokio::spawn(async move { client.octavia().get_member(POOL, MEMBER).await.map(|_| ()) })
    });
    for call in futures::future::join_all(calls).await {
        call.unwrap().unwrap();
    }
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(9_500), "{elapsed:?}");
    let at: Vec<Duration> = session
        .arrivals()
        .into_iter()
        .map(|(t, _)| t - started)
        .collect();
    assert_eq!(at.len(), 200);
    // GCRA bound: n requests in a window of length w need n <= burst + qps * w.
    for i in 0..at.len() {
        for j in i..at.len() {
            let window = (at[j] - at[i]).as_secs_f64();
            let count = (j - i + 1) as f64;
            assert!(
                count <= f64::from(BURST) + f64::from(QPS) * window + 1e-9,
                "{count} requests within {window} s"
            );
        }
    }
    println!("200 requests at qps {QPS} burst {BURST}: {elapsed:?} of virtual time");
}

// ---------------------------------------------------------------- request shapes

/// A client with every service at `server`, without Keystone.
fn all_services_client(server: &MockServer) -> CloudClient {
    let (clouds, _) = clouds(options());
    let base = |prefix: &str| Url::parse(&format!("{}/{prefix}", server.uri())).unwrap();
    let session = NoAuthSession::new(
        [
            (Service::LoadBalancer, base("load-balancer")),
            (Service::Network, base("network")),
            (Service::Compute, base("compute/v2.1")),
            (Service::Image, base("image")),
        ],
        None,
    )
    .unwrap();
    clouds.client(Arc::new(session))
}

#[tokio::test]
async fn typed_calls_send_the_filters_bodies_and_headers_capo_uses() {
    use capo_provider::cloud::neutron::{Filter, PortSpec};
    use capo_provider::cloud::nova::{ServerNetwork, ServerSpec};
    use capo_provider::cloud::octavia::LoadBalancerFilter;
    use wiremock::matchers::{body_json, query_param};

    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/load-balancer/v2/lbaas/loadbalancers"))
        .and(query_param("name", "k8s-clusterapi-cluster-default-c1-kubeapi"))
        .and(query_param("tags", "a,b"))
        .respond_with(json_response(200, &json!({"loadbalancers": [sample("loadbalancer_active.json")["loadbalancer"]], "loadbalancers_links": []})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("DELETE"))
        .and(path("/load-balancer/v2/lbaas/loadbalancers/lb1"))
        .and(query_param("cascade", "true"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/network/v2.0/ports"))
        .and(query_param("network_id", "net1"))
        .and(query_param("tags", "t1,t2"))
        .and(query_param("not-tags-any", "x"))
        .respond_with(json_response(
            200,
            &json!({"ports": [{"id": "p1", "name": "port", "network_id": "net1",
            "fixed_ips": [{"subnet_id": "s1", "ip_address": "10.0.0.5"}]}]}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/network/v2.0/ports"))
        .and(body_json(
            json!({"port": {"name": "m1-0", "network_id": "net1",
            "fixed_ips": [{"subnet_id": "s1"}]}}),
        ))
        .respond_with(json_response(
            201,
            &json!({"port": {"id": "p2", "name": "m1-0", "network_id": "net1"}}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    // Asked once before the first tagged create, then remembered.
    Mock::given(method("GET"))
        .and(path("/network/v2.0/extensions/standard-attr-tag"))
        .respond_with(json_response(
            200,
            &json!({"extension": {"alias": "standard-attr-tag", "name": "Tag support"}}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/network/v2.0/ports/p2/tags"))
        .and(body_json(json!({"tags": ["cluster-c1"]})))
        .respond_with(json_response(200, &json!({"tags": ["cluster-c1"]})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/compute/v2.1/servers"))
        .and(header("openstack-api-version", "compute 2.53"))
        .and(body_partial_json(
            json!({"server": {"name": "m1", "flavorRef": "f1", "imageRef": "i1",
            "networks": [{"port": "p2"}], "tags": ["cluster-c1"]},
            "os:scheduler_hints": {"group": "g1"}}),
        ))
        .respond_with(json_response(202, &json!({"server": {"id": "srv1"}})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/compute/v2.1/servers/detail"))
        .and(query_param("name", "^m1\\.example$"))
        .respond_with(json_response(
            200,
            &json!({"servers": [
            {"id": "srv1", "name": "m1.example", "status": "ACTIVE"},
            {"id": "srv2", "name": "m1.example-2", "status": "ACTIVE"}]}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/image/v2/images"))
        .and(query_param("name", "ubuntu-2404-kube-v1.33"))
        .and(query_param("tag", "capi"))
        .respond_with(json_response(200, &json!({"images": [{"id": "i1", "name": "ubuntu-2404-kube-v1.33", "status": "active", "tags": ["capi"]}]})))
        .expect(1)
        .mount(&server)
        .await;

    let client = all_services_client(&server);
    let lbs = client
        .octavia()
        .list_load_balancers(&LoadBalancerFilter {
            name: Some("k8s-clusterapi-cluster-default-c1-kubeapi".into()),
            tags: vec!["a".into(), "b".into()],
        })
        .await
        .unwrap();
    assert_eq!(lbs.len(), 1);
    client
        .octavia()
        .delete_load_balancer("lb1", true)
        .await
        .unwrap();

    let filter = Filter {
        tags: vec!["t1".into(), "t2".into()],
        not_tags_any: vec!["x".into()],
        ..Filter::default()
    }
    .with("network_id", "net1");
    let ports = client.neutron().list_ports(&filter).await.unwrap();
    assert_eq!(
        ports[0].fixed_ips[0].ip_address.as_deref(),
        Some("10.0.0.5")
    );
    let port = client
        .neutron()
        .create_port(&PortSpec {
            name: "m1-0".into(),
            network_id: "net1".into(),
            fixed_ips: vec![capo_provider::cloud::neutron::FixedIp {
                subnet_id: Some("s1".into()),
                ip_address: None,
            }],
            tags: vec!["cluster-c1".into()],
            ..PortSpec::default()
        })
        .await
        .unwrap();
    assert_eq!(port.id, "p2");

    let server_spec = ServerSpec {
        name: "m1".into(),
        flavor_ref: "f1".into(),
        image_ref: "i1".into(),
        networks: vec![ServerNetwork {
            port: Some("p2".into()),
            uuid: None,
        }],
        tags: vec!["cluster-c1".into()],
        server_group_id: Some("g1".into()),
        ..ServerSpec::default()
    };
    assert_eq!(
        client.nova().create_server(&server_spec).await.unwrap().id,
        "srv1"
    );
    let found = client
        .nova()
        .list_servers_by_name("m1.example", &[])
        .await
        .unwrap();
    assert_eq!(
        found.len(),
        1,
        "the name filter is a regex: exact matches only"
    );

    let images = client
        .glance()
        .list_images(Some("ubuntu-2404-kube-v1.33"), &["capi".into()])
        .await
        .unwrap();
    assert_eq!(images[0].id, "i1");
}

/// A network made and tagged comes back with the tags Neutron now holds (its create answer
/// has none): its cluster records it once, not once untagged and again at the next read.
/// A tag write that fails hands it back untagged, as Neutron holds it.
#[tokio::test]
async fn a_network_made_and_tagged_comes_back_with_its_tags() {
    use capo_provider::cloud::neutron::NetworkSpec;

    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/network/v2.0/extensions/standard-attr-tag"))
        .respond_with(json_response(
            200,
            &json!({"extension": {"alias": "standard-attr-tag", "name": "Tag support"}}),
        ))
        .mount(&server)
        .await;
    for (id, name) in [("n1", "tagged"), ("n2", "refused")] {
        Mock::given(method("POST"))
            .and(path("/network/v2.0/networks"))
            .and(body_partial_json(json!({"network": {"name": name}})))
            .respond_with(json_response(
                201,
                &json!({"network": {"id": id, "name": name, "tags": []}}),
            ))
            .mount(&server)
            .await;
    }
    Mock::given(method("PUT"))
        .and(path("/network/v2.0/networks/n1/tags"))
        .respond_with(json_response(200, &json!({"tags": ["cluster-c1"]})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path("/network/v2.0/networks/n2/tags"))
        .respond_with(json_response(
            403,
            &json!({"NeutronError": {"type": "PolicyNotAuthorized", "message": "no", "detail": ""}}),
        ))
        .mount(&server)
        .await;
    let client = all_services_client(&server);
    let spec = |name: &str| NetworkSpec {
        name: name.into(),
        admin_state_up: true,
        mtu: None,
        port_security_enabled: None,
        description: String::new(),
        tags: vec!["cluster-c1".into()],
    };
    let tagged = client
        .neutron()
        .create_network(&spec("tagged"))
        .await
        .unwrap();
    assert_eq!(
        (tagged.id.as_str(), tagged.tags),
        ("n1", vec!["cluster-c1".to_owned()])
    );
    let refused = client
        .neutron()
        .create_network(&spec("refused"))
        .await
        .unwrap();
    assert_eq!(
        (refused.id.as_str(), refused.tags),
        ("n2", Vec::<String>::new())
    );
}

/// `backend` behind TLS at `https://localhost:<port>`, with a certificate for `localhost`
/// from a fresh CA (returned, PEM). Each connection is proxied until `stop`.
async fn tls_front(backend: std::net::SocketAddr, stop: CancellationToken) -> (u16, String) {
    let certs = capo_sim::certs::WebhookCerts::issue(&["localhost".to_owned()]).unwrap();
    let config = certs.server_config().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => return },
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, certs.ca_pem)
}

/// `--ca-certs` (CloudOptions::default_cacert): a cloud behind a private CA is trusted with
/// it, refused without it, and a Secret's own `cacert` comes first, as CAPO has it.
#[tokio::test]
async fn the_default_ca_bundle_is_trusted_when_the_secret_has_none() {
    let server = MockServer::start().await;
    mount_keystone(&server, TOKEN_A, chrono::TimeDelta::hours(1)).await;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (port, ca) = tls_front(*server.address(), stop).await;
    let credentials = |region: &str| CloudCredentials {
        clouds_yaml: clouds_yaml(&format!("https://localhost:{port}/identity/v3")),
        cacert: None,
        cloud_name: "test".into(),
        region: Some(region.into()),
    };
    let (plain, _) = clouds(options());
    let refused = plain.connect(&credentials("RegionOne")).await;
    assert!(refused.is_err(), "a private CA is not trusted by default");

    let other_ca = capo_sim::certs::WebhookCerts::issue(&["localhost".to_owned()]).unwrap();
    let (trusting, _) = clouds(CloudOptions {
        default_cacert: Some(ca.clone()),
        ..options()
    });
    trusting
        .connect(&credentials("RegionOne"))
        .await
        .expect("trusted with the default CA bundle");
    let (wrong_default, _) = clouds(CloudOptions {
        default_cacert: Some(other_ca.ca_pem),
        ..options()
    });
    let mut own = credentials("RegionOne");
    own.cacert = Some(ca);
    wrong_default
        .connect(&own)
        .await
        .expect("the Secret's cacert comes first");
    assert!(
        wrong_default
            .connect(&credentials("RegionTwo"))
            .await
            .is_err(),
        "the default applies when the Secret has none"
    );
}

/// An endpoint that answers each request with `body`, except that on its first connection it
/// reads the second request and closes without an answer, as a WSGI server closing a kept-alive
/// connection idle past its timeout does when a request crosses its FIN. It counts the requests
/// it read.
struct ClosesItsFirstConnection {
    url: Url,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClosesItsFirstConnection {
    async fn start(body: Value) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            let mut connections = 0;
            while let Ok((stream, _)) = listener.accept().await {
                connections += 1;
                let answers = if connections == 1 { 1 } else { usize::MAX };
                tokio::spawn(Self::serve(
                    stream,
                    answers,
                    body.to_string(),
                    counted.clone(),
                ));
            }
        });
        ClosesItsFirstConnection { url, requests }
    }

    /// Answers `answers` requests, then reads one more and hangs up.
    async fn serve(
        stream: tokio::net::TcpStream,
        answers: usize,
        body: String,
        requests: Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::io::BufReader::new(stream);
        for answered in 0.. {
            let mut length = 0;
            let mut line = String::new();
            loop {
                line.clear();
                if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut request_body = vec![0; length];
            let _ = stream.read_exact(&mut request_body).await;
            requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if answered == answers {
                return;
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A client with no retries of its own: what recovers, the transport recovered.
    fn client(&self) -> CloudClient {
        let mut opts = options();
        opts.path.retry.max_attempts = 1;
        let (clouds, _) = clouds(opts);
        let session =
            NoAuthSession::new([(Service::LoadBalancer, self.url.clone())], None).unwrap();
        clouds.client(Arc::new(session))
    }
}

/// The endpoint closes a kept-alive connection as a GET goes out on it (CI at `0db54c6`: a
/// GET to the real Octavia, whose gunicorn closes connections idle for 2 s, failed with
/// "error sending request"): the GET is sent again on a new connection and answered, with no
/// retry of the caller's spent.
#[tokio::test]
async fn a_get_on_a_kept_alive_connection_the_endpoint_closes_is_sent_again() {
    let endpoint = ClosesItsFirstConnection::start(sample("member_active.json")).await;
    let client = endpoint.client();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    let member = client.octavia().get_member(POOL, MEMBER).await.unwrap();
    assert_eq!(member.provisioning_status, ProvisioningStatus::Active);
    assert_eq!(
        endpoint.requests(),
        3,
        "the GET read twice, once unanswered"
    );
}

/// The same close under a POST: the POST is not sent again (the endpoint may have acted on it),
/// and the failure says why there was no answer.
#[tokio::test]
async fn a_post_on_a_kept_alive_connection_the_endpoint_closes_is_not_sent_again() {
    let endpoint = ClosesItsFirstConnection::start(sample("member_active.json")).await;
    let client = endpoint.client();
    client.octavia().get_member(POOL, MEMBER).await.unwrap();
    let spec = MemberSpec::new("m", "192.0.2.10", 8080);
    let error = client
        .octavia()
        .create_member(POOL, &spec)
        .await
        .unwrap_err();
    assert!(matches!(error, CloudError::Transient(_)), "{error:?}");
    assert!(
        error.message().contains("closed before message completed"),
        "the cause is said: {error}"
    );
    assert_eq!(endpoint.requests(), 2, "the POST was sent once");
}
