//! Unit tests of the conversion; the property test is in `tests/it`.

use serde_json::{Value, json};

use super::*;

fn v1beta1(kind: &str, spec: Value, status: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": kind,
           "metadata": {"name": "a", "namespace": "ns", "generation": 3}, "spec": spec, "status": status})
}

fn round_trip(object: &Value, via: &str) -> Value {
    let there = convert(object, &format!("{}/{via}", crate::GROUP)).expect("converts");
    convert(&there, object["apiVersion"].as_str().unwrap()).expect("converts back")
}

#[test]
fn a_cluster_converts_as_capo_does() {
    let spoke = v1beta1(
        "OpenStackCluster",
        json!({"identityRef": {"name": "c", "cloudName": "o"}, "networkMTU": 1400, "disablePortSecurity": true,
               "disableAPIServerFloatingIP": false, "apiServerLoadBalancer": {"enabled": true},
               "managedSecurityGroups": {"allNodesSecurityGroupRules": [{"name": "x", "direction": "ingress"}]},
               "bastion": {"spec": {"flavor": "m1.small", "image": {"id": "i"}}}}),
        json!({"ready": true, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
               "failureDomains": {"b": {"controlPlane": true}, "a": {}},
               "apiServerLoadBalancer": {"id": "lb"}}),
    );
    let hub = convert(&spoke, "infrastructure.cluster.x-k8s.io/v1beta2").unwrap();
    assert_eq!(hub["apiVersion"], "infrastructure.cluster.x-k8s.io/v1beta2");
    assert_eq!(
        hub["spec"]["managedNetwork"],
        json!({"mtu": 1400, "enablePortSecurity": false})
    );
    assert_eq!(
        hub["spec"]["apiServer"],
        json!({"enableFloatingIP": true, "managedLoadBalancer": {"enabled": true}})
    );
    assert_eq!(
        hub["spec"]["managedSecurityGroups"]["clusterNodesSecurityGroupRules"][0]["name"],
        "x"
    );
    assert_eq!(
        hub["spec"]["bastion"]["spec"]["flavor"],
        json!({"filter": {"name": "m1.small"}})
    );
    assert_eq!(
        hub["status"]["conditions"][0],
        json!({"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
               "observedGeneration": 3, "reason": "NoReasonReported", "message": ""})
    );
    assert_eq!(
        hub["status"]["failureDomains"],
        json!([{"name": "a", "controlPlane": false}, {"name": "b", "controlPlane": true}])
    );
    assert_eq!(
        hub["status"]["apiServerManagedLoadBalancer"],
        json!({"id": "lb"})
    );
    assert!(hub["status"].get("ready").is_none());
    assert_eq!(round_trip(&spoke, HUB), spoke);
}

#[test]
fn flavor_id_wins_and_both_come_back() {
    let spoke = v1beta1(
        "OpenStackMachine",
        json!({"flavor": "small", "flavorID": "f-1", "image": {"id": "i"}}),
        json!({"ready": false}),
    );
    let hub = convert(&spoke, "infrastructure.cluster.x-k8s.io/v1beta2").unwrap();
    assert_eq!(hub["spec"]["flavor"], json!({"id": "f-1"}));
    assert!(
        hub["metadata"]["annotations"][DATA_ANNOTATION].is_string(),
        "the name is kept aside"
    );
    assert_eq!(round_trip(&spoke, HUB), spoke);
}

#[test]
fn an_edit_in_the_other_version_wins_over_the_kept_copy() {
    let spoke = v1beta1(
        "OpenStackMachine",
        json!({"flavor": "small", "flavorID": "f-1", "image": {"id": "i"}}),
        json!({"ready": false}),
    );
    let mut hub = convert(&spoke, "infrastructure.cluster.x-k8s.io/v1beta2").unwrap();
    hub["spec"]["flavor"] = json!({"id": "f-2"});
    let back = convert(&hub, "infrastructure.cluster.x-k8s.io/v1beta1").unwrap();
    assert_eq!(back["spec"]["flavorID"], "f-2");
    assert!(
        back["spec"].get("flavor").is_none(),
        "the stale name is not restored"
    );
    assert_eq!(
        back["status"],
        json!({"ready": false}),
        "the unchanged status is restored"
    );
}

#[test]
fn hub_only_template_metadata_survives_a_trip_through_v1beta1() {
    let hub = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackClusterTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"identityRef": {"name": "c", "cloudName": "o"}}}}});
    let spoke = convert(&hub, "infrastructure.cluster.x-k8s.io/v1beta1").unwrap();
    assert!(spoke["spec"]["template"].get("metadata").is_none());
    assert_eq!(round_trip(&hub, SPOKE), hub);
}

#[test]
fn ready_is_derived_from_the_ready_condition() {
    let hub = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
        "metadata": {"name": "m", "namespace": "ns", "generation": 1},
        "spec": {"flavor": {"filter": {"name": "small"}}, "image": {"id": "i"}},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}});
    let spoke = convert(&hub, "infrastructure.cluster.x-k8s.io/v1beta1").unwrap();
    assert_eq!(spoke["status"]["ready"], true);
    assert_eq!(spoke["spec"]["flavor"], "small");
    assert!(spoke["status"]["conditions"][0].get("message").is_none());
    assert_eq!(round_trip(&hub, SPOKE), hub);
}

#[test]
fn a_review_converts_every_object_or_none() {
    let good = v1beta1(
        "OpenStackMachine",
        json!({"flavor": "s", "image": {"id": "i"}}),
        json!({}),
    );
    let bad = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "OpenStackMachine",
                     "metadata": {"name": "broken", "namespace": "ns"}, "spec": "oops"});
    let request = |objects: Vec<Value>| {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "objects": objects}})
    };
    let ok = review(&request(vec![good.clone()]));
    assert_eq!(ok["response"]["uid"], "u-1");
    assert_eq!(ok["response"]["result"]["status"], "Success");
    assert_eq!(
        ok["response"]["convertedObjects"][0]["spec"]["flavor"],
        json!({"filter": {"name": "s"}})
    );
    let failed = review(&request(vec![good, bad]));
    assert_eq!(failed["response"]["result"]["status"], "Failure");
    assert_eq!(failed["response"]["convertedObjects"], json!([]));
    let message = failed["response"]["result"]["message"].as_str().unwrap();
    assert!(
        message.contains("OpenStackMachine ns/broken") && message.contains("spec is not an object"),
        "{message}"
    );
}

#[test]
fn malformed_reviews_and_unknown_versions_fail_with_a_reason() {
    let answer = review(&json!({"kind": "AdmissionReview"}));
    assert_eq!(answer["response"]["result"]["status"], "Failure");
    let object = v1beta1("OpenStackMachine", json!({}), json!({}));
    let e = convert(&object, "infrastructure.cluster.x-k8s.io/v1alpha7").unwrap_err();
    assert!(
        e.to_string().contains("not served in version \"v1alpha7\""),
        "{e}"
    );
    let e = convert(&json!({"apiVersion": "v1", "kind": "Pod"}), "v1").unwrap_err();
    assert!(e.to_string().contains("not group/version"), "{e}");
}
