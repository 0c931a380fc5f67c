//! What the reconcilers share, against the simulated cloud: OpenStack clients per credentials.

use std::collections::BTreeMap;

use capo_provider::cloud::{CloudOptions, Clouds};
use capo_provider::controllers::credentials::CLOUDS_YAML_KEY;
use capo_provider::controllers::{
    Categorized, ClientCache, CredentialsError, CredentialsKey, ErrorCategory,
};
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

fn key(resource_version: &str, cloud_name: &str) -> CredentialsKey {
    CredentialsKey {
        secret: "default/cloud-config".into(),
        uid: "3f1c".into(),
        resource_version: resource_version.into(),
        cloud_name: cloud_name.into(),
        region: None,
    }
}

fn secret(clouds_yaml: &str) -> BTreeMap<String, Vec<u8>> {
    BTreeMap::from([(CLOUDS_YAML_KEY.to_owned(), clouds_yaml.as_bytes().to_vec())])
}

#[tokio::test]
async fn one_client_per_secret_version_and_a_changed_secret_replaces_it() {
    let sim = OpenStackSim::start(OpenStackSimConfig::default())
        .await
        .unwrap();
    let clouds = Clouds::new(
        CloudOptions::default(),
        &Registry::new(),
        CancellationToken::new(),
    )
    .unwrap();
    let cache = ClientCache::new(clouds);
    let data = secret(&sim.clouds_yaml());
    let client = cache.client(&key("1", "sim"), &data).await.unwrap();
    client.octavia().list_providers().await.unwrap();
    let again = cache.client(&key("1", "sim"), &data).await.unwrap();
    again.octavia().list_providers().await.unwrap();
    assert_eq!(sim.request_count("identity token_create"), 1, "one login");
    assert_eq!(cache.len(), 1);

    // The Secret changed (new resourceVersion): a new client, and the old one is dropped.
    cache.client(&key("2", "sim"), &data).await.unwrap();
    assert_eq!(cache.len(), 1);
    // Another cloud in the same Secret is another client.
    cache.client(&key("2", "sim-appcred"), &data).await.unwrap();
    assert_eq!(cache.len(), 2);
}

#[tokio::test]
async fn unknown_clouds_and_malformed_clouds_yaml_are_credentials_errors_that_say_why() {
    let sim = OpenStackSim::start(OpenStackSimConfig::default())
        .await
        .unwrap();
    let clouds = Clouds::new(
        CloudOptions::default(),
        &Registry::new(),
        CancellationToken::new(),
    )
    .unwrap();
    let cache = ClientCache::new(clouds);
    let unknown = cache
        .client(&key("1", "nope"), &secret(&sim.clouds_yaml()))
        .await
        .unwrap_err();
    assert_eq!(unknown.category(), ErrorCategory::Credentials);
    let message = unknown.to_string();
    assert!(message.contains("default/cloud-config"), "{message}");
    assert!(
        message.contains("\"nope\" is not in clouds.yaml"),
        "{message}"
    );
    assert!(
        message.contains("sim"),
        "names the clouds it has: {message}"
    );

    let malformed = cache
        .client(&key("1", "sim"), &secret("clouds: [password: hunter2"))
        .await
        .unwrap_err();
    assert!(matches!(malformed, CredentialsError::Cloud { .. }));
    assert_eq!(malformed.category(), ErrorCategory::Credentials);
    assert!(!malformed.to_string().contains("hunter2"), "{malformed}");
    assert!(cache.is_empty(), "failures are not cached");
}
