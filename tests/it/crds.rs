//! The generated CRDs: checked in, structural, carrying the v1beta2 contract's metadata and
//! status default, and enforcing the immutability rules CAPO has in webhooks.

use crate::common;

use capo_api::conditions::{KStatus, kstatus};
use capo_api::{OpenStackCluster, OpenStackClusterSpec, crds};
use capo_sim::structural::{apply_defaults, check_structural, prune, validate};
use common::{our_crd, our_schema};
use kube::core::cel::Validator;
use serde_json::{Value, json};

const KINDS_WITH_STATUS: [&str; 5] = [
    "OpenStackCluster",
    "OpenStackMachine",
    "OpenStackMachineTemplate",
    "OpenStackServer",
    "OpenStackFloatingIPPool",
];

#[test]
fn checked_in_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let generated = crds::all();
    let mut stale = Vec::new();
    for crd in &generated {
        let path = dir.join(crds::file_name(crd));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != crds::to_yaml(crd).expect("serialises") {
            stale.push(path.display().to_string());
        }
    }
    let kustomization = std::fs::read_to_string(dir.join(crds::KUSTOMIZATION)).unwrap_or_default();
    if kustomization != crds::kustomization(&generated) {
        stale.push(crds::KUSTOMIZATION.to_owned());
    }
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert!(
        stale.is_empty() && files == generated.len() + 1,
        "crds/ is stale ({stale:?}, {files} files): run `cargo run -- crds --out crds`"
    );
}

#[test]
fn every_crd_is_a_structural_schema_with_compiling_rules() {
    for crd in crds::all() {
        for version in &crd.spec.versions {
            let schema =
                serde_json::to_value(&version.schema.as_ref().expect("schema").open_api_v3_schema)
                    .expect("json");
            let errors = check_structural(&schema);
            assert!(
                errors.is_empty(),
                "{} {}: {errors:#?}",
                crd.spec.names.kind,
                version.name
            );
        }
    }
}

#[test]
fn crd_metadata_follows_the_contract() {
    for crd in crds::all() {
        let kind = crd.spec.names.kind.clone();
        let version = &crd.spec.versions[0];
        let expected_label = if version.name == "v1alpha1" {
            "v1alpha1"
        } else {
            "v1beta2"
        };
        let labels = crd.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
            Some(expected_label),
            "{kind}"
        );
        assert_eq!(
            crd.spec.names.categories.clone().unwrap_or_default(),
            vec!["cluster-api".to_owned()],
            "{kind}"
        );
        assert_eq!(
            crd.spec.scope,
            if kind == "OpenStackClusterIdentity" {
                "Cluster"
            } else {
                "Namespaced"
            }
        );
        let columns: Vec<String> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(columns.last().map(String::as_str), Some("Age"), "{kind}");
        let has_status_subresource = version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some());
        assert_eq!(
            has_status_subresource,
            KINDS_WITH_STATUS.contains(&kind.as_str()),
            "{kind} status subresource"
        );
    }
    let short = |kind: &str| our_crd(kind)["spec"]["names"]["shortNames"].clone();
    assert_eq!(short("OpenStackCluster"), json!(["osc"]));
    assert_eq!(short("OpenStackMachine"), json!(["osm"]));
    assert_eq!(short("OpenStackServer"), json!(["oss"]));
    // CAPO's short names for the templates and the identity too: `kubectl get osmt` works.
    assert_eq!(short("OpenStackClusterTemplate"), json!(["osct"]));
    assert_eq!(short("OpenStackMachineTemplate"), json!(["osmt"]));
    assert_eq!(short("OpenStackClusterIdentity"), json!(["osci"]));
    let columns = |kind: &str| -> Vec<String> {
        our_crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    for (kind, expected) in [
        (
            "OpenStackCluster",
            &["Cluster", "Ready", "Provisioned", "LoadBalancer"][..],
        ),
        (
            "OpenStackMachine",
            &[
                "Cluster",
                "Ready",
                "Provisioned",
                "InstanceState",
                "LBMember",
            ][..],
        ),
        (
            "OpenStackServer",
            &["Ready", "Provisioned", "InstanceState"][..],
        ),
    ] {
        let have = columns(kind);
        assert!(
            expected.iter().all(|c| have.iter().any(|h| h == c)),
            "{kind}: {have:?}"
        );
    }
}

#[test]
fn status_follows_the_v1beta2_contract() {
    for kind in KINDS_WITH_STATUS {
        let status = &our_schema(kind)["properties"]["status"];
        assert_eq!(
            status["default"],
            json!({"observedGeneration": -1}),
            "{kind}"
        );
        let observed = &status["properties"]["observedGeneration"];
        assert_eq!(observed["type"], "integer", "{kind}");
        assert!(
            observed.get("minimum").is_none(),
            "{kind}: observedGeneration must allow -1"
        );
        let conditions = &status["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            json!(["type"]),
            "{kind}"
        );
        for gone in ["ready", "failureReason", "failureMessage"] {
            assert!(
                status["properties"].get(gone).is_none(),
                "{kind} must not have status.{gone}"
            );
        }
        // Templates and pools are not provisioned: Cluster API's contract has no
        // `initialization` for them.
        if !matches!(kind, "OpenStackMachineTemplate" | "OpenStackFloatingIPPool") {
            assert_eq!(
                status["properties"]["initialization"]["properties"]["provisioned"]["type"],
                "boolean",
                "{kind}"
            );
        }
    }
    let member = &our_schema("OpenStackCluster")["properties"]["status"]["properties"]["apiServerManagedLoadBalancer"]
        ["properties"]["members"]["items"]["properties"];
    for field in [
        "name",
        "address",
        "port",
        "pool",
        "provisioningStatus",
        "operatingStatus",
        "since",
    ] {
        assert!(member.get(field).is_some(), "member status lacks {field}");
    }
}

/// What the API server stores for a freshly created object: defaults applied, generation 1.
fn as_created(mut object: Value, kind: &str) -> Value {
    let schema = our_schema(kind);
    object["metadata"]["generation"] = json!(1);
    apply_defaults(&mut object, &schema);
    object
}

fn minimal_cluster() -> OpenStackCluster {
    let mut spec = OpenStackClusterSpec::default();
    spec.identity_ref.name = "cloud-config".into();
    spec.identity_ref.cloud_name = "openstack".into();
    OpenStackCluster::new("c1", spec)
}

#[test]
fn a_fresh_object_reads_as_not_yet_observed_and_kstatus_in_progress() {
    let fresh = serde_json::to_value(minimal_cluster()).expect("serialises");
    assert!(
        fresh.get("status").is_none_or(Value::is_null),
        "created without status"
    );
    let stored = as_created(fresh, "OpenStackCluster");
    assert_eq!(stored["status"], json!({"observedGeneration": -1}));
    assert!(
        matches!(kstatus(&stored), KStatus::InProgress(_)),
        "{:?}",
        kstatus(&stored)
    );
    let typed: OpenStackCluster = serde_json::from_value(stored).expect("reads back");
    assert_eq!(typed.status.and_then(|s| s.observed_generation), Some(-1));
    // Defaults inside the spec are applied as the server would.
    assert_eq!(
        as_created(
            json!({"spec": {"identityRef": {"name": "a", "cloudName": "b"}}}),
            "OpenStackCluster"
        )["spec"]["identityRef"]["type"],
        "Secret"
    );
}

#[test]
fn an_existing_empty_status_is_not_redefaulted() {
    let stored = as_created(
        json!({"spec": {"identityRef": {"name": "a", "cloudName": "b"}}, "status": {}}),
        "OpenStackCluster",
    );
    assert_eq!(stored["status"], json!({}));
}

#[test]
fn invalid_values_are_reported_with_their_paths() {
    let schema = our_schema("OpenStackMachine");
    let object = json!({"spec": {"flavor": {"id": "f", "filter": {"name": "x"}}, "image": {"id": "not-a-uuid"},
        "additionalBlockDevices": [{"name": "d", "sizeGiB": 0, "storage": {"type": "Tape"}}]}});
    let errors: Vec<String> = validate(&object, &schema)
        .iter()
        .map(ToString::to_string)
        .collect();
    for expected in [
        "spec.flavor: must have at most 1",
        "spec.image.id: must be a valid uuid",
        "spec.additionalBlockDevices[0].sizeGiB",
        "spec.additionalBlockDevices[0].storage.type: unsupported value",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{expected} not in {errors:#?}"
        );
    }
    let mut with_unknown =
        json!({"spec": {"flavor": {"id": "f"}, "image": {"id": "x"}, "imageUUID": "old-field"}});
    assert_eq!(
        prune(&mut with_unknown, &schema),
        vec!["spec.imageUUID".to_owned()]
    );
}

fn cel_errors(kind: &str, new: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&our_schema(kind), new, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect(),
    }
}

fn machine() -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackMachine",
           "metadata": {"name": "m"},
           "spec": {"flavor": {"filter": {"name": "m1.medium"}}, "image": {"filter": {"name": "ubuntu"}},
                    "identityRef": {"name": "cloud", "cloudName": "openstack", "region": "RegionOne"}}})
}

#[test]
fn machine_spec_is_immutable_except_identity_and_provider_id() {
    let old = machine();
    assert_eq!(
        cel_errors("OpenStackMachine", &old, None),
        Vec::<String>::new()
    );

    let mut changed = old.clone();
    changed["spec"]["flavor"]["filter"]["name"] = json!("m1.large");
    assert!(
        cel_errors("OpenStackMachine", &changed, Some(&old))
            .iter()
            .any(|e| e.contains("spec cannot be modified"))
    );

    let mut added = old.clone();
    added["spec"]["sshKeyName"] = json!("key");
    assert!(
        !cel_errors("OpenStackMachine", &added, Some(&old)).is_empty(),
        "adding a field is a change"
    );

    let mut with_id = old.clone();
    with_id["spec"]["providerID"] = json!("openstack:///abc");
    assert_eq!(
        cel_errors("OpenStackMachine", &with_id, Some(&old)),
        Vec::<String>::new(),
        "providerID may be set once"
    );

    // CAPO #3265: a controller's retry that writes the providerID again is never refused.
    let mut moved = with_id.clone();
    moved["spec"]["providerID"] = json!("openstack:///def");
    assert_eq!(
        cel_errors("OpenStackMachine", &moved, Some(&with_id)),
        Vec::<String>::new(),
        "providerID may change, as CAPO allows"
    );

    let mut new_cloud = old.clone();
    new_cloud["spec"]["identityRef"]["cloudName"] = json!("other");
    assert_eq!(
        cel_errors("OpenStackMachine", &new_cloud, Some(&old)),
        Vec::<String>::new()
    );
    let mut new_region = old.clone();
    new_region["spec"]["identityRef"]["region"] = json!("RegionTwo");
    assert!(
        cel_errors("OpenStackMachine", &new_region, Some(&old))
            .iter()
            .any(|e| e.contains("region"))
    );
}

#[test]
fn machine_creation_rules_hold() {
    let mut root_clash = machine();
    root_clash["spec"]["rootVolume"] = json!({"sizeGiB": 20});
    root_clash["spec"]["additionalBlockDevices"] =
        json!([{"name": "root", "sizeGiB": 5, "storage": {"type": "Local"}}]);
    assert!(
        cel_errors("OpenStackMachine", &root_clash, None)
            .iter()
            .any(|e| e.contains("named root"))
    );

    let mut bad_hint = machine();
    bad_hint["spec"]["schedulerHintAdditionalProperties"] =
        json!([{"name": "h", "value": {"type": "Bool", "string": "x"}}]);
    let errors = cel_errors("OpenStackMachine", &bad_hint, None);
    assert!(
        errors.iter().any(|e| e.contains("bool must be set"))
            && errors.iter().any(|e| e.contains("string must be set")),
        "{errors:?}"
    );
}

#[test]
fn port_security_off_refuses_security_groups_exactly_as_before() {
    // The rule was rewritten to fit the API server's cost budget; it must accept and refuse
    // the same ports as the form it replaced.
    let before = "!has(self.enablePortSecurity) || self.enablePortSecurity || !has(self.securityGroups) || size(self.securityGroups) == 0";
    let port_schema =
        our_schema("OpenStackServer")["properties"]["spec"]["properties"]["ports"]["items"].clone();
    let mut old_form = port_schema.clone();
    old_form["x-kubernetes-validations"][0]["rule"] = json!(before);
    let groups = json!([{"id": "5a1b7c2e-0d3f-4e6a-8b9c-1d2e3f4a5b6c"}]);
    let ports = [
        json!({}),
        json!({"enablePortSecurity": false}),
        json!({"enablePortSecurity": true, "securityGroups": groups}),
        json!({"securityGroups": groups}),
        json!({"enablePortSecurity": false, "securityGroups": []}),
        json!({"enablePortSecurity": false, "securityGroups": groups}),
    ];
    let verdict =
        |schema: &Value, port: &Value| Validator::new().validate(schema, port, None).is_ok();
    for port in &ports {
        assert_eq!(
            verdict(&port_schema, port),
            verdict(&old_form, port),
            "{port}"
        );
    }
    assert!(
        !verdict(&port_schema, &ports[5]),
        "port security off with groups is refused"
    );
}

#[test]
fn the_lint_refuses_a_rule_over_the_budget_as_kubectl_would_show_it() {
    let mut crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == "OpenStackServer")
        .expect("OpenStackServer");
    let mut value = serde_json::to_value(&crd).expect("json");
    value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["ports"]["items"]["x-kubernetes-validations"][0]["rule"] = json!(
        "!has(self.enablePortSecurity) || self.enablePortSecurity || !has(self.securityGroups) || size(self.securityGroups) == 0"
    );
    crd = serde_json::from_value(value).expect("still a CRD");
    assert_eq!(
        crds::lint(&crd),
        vec!["The CustomResourceDefinition \"openstackservers.infrastructure.cluster.x-k8s.io\" is invalid: spec.validation.openAPIV3Schema.properties[spec].properties[ports].items.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of 1.048576x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)".to_owned()]
    );
}

#[test]
fn every_rule_fits_the_api_servers_cost_budget() {
    for crd in crds::all() {
        assert_eq!(crds::lint(&crd), Vec::<String>::new());
        let report = crds::cost_report(&crd);
        let kind = &crd.spec.names.kind;
        for rule in &report.rules {
            assert!(
                rule.cost <= capo_api::cel_cost::RULE_COST_LIMIT,
                "{kind} {}: {}",
                rule.field,
                rule.cost
            );
        }
        let total: u64 = report.rules.iter().map(|r| r.cost).sum();
        eprintln!(
            "{kind}: {} rules, {total} of {} for the whole schema",
            report.rules.len(),
            capo_api::cel_cost::SCHEMA_COST_LIMIT
        );
    }
}

/// The server's immutability is the webhook's (CAPO lets Cluster API's topology dry-run
/// change it, which a CRD rule cannot see): here only its create-time rules.
#[test]
fn server_spec_rules_hold_on_create() {
    let old = json!({"spec": {"flavor": "m1.small", "image": {"id": "0b8d6c5e-4f3a-4a8e-9a39-3f1b2c4d5e6f"}, "sshKeyName": "k",
        "ports": [], "identityRef": {"name": "cloud", "cloudName": "openstack"}}});
    assert_eq!(
        cel_errors("OpenStackServer", &old, None),
        Vec::<String>::new()
    );
    let mut no_flavor = old.clone();
    no_flavor["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("flavor");
    assert!(
        cel_errors("OpenStackServer", &no_flavor, None)
            .iter()
            .any(|e| e.contains("flavor or flavorID"))
    );
}

#[test]
fn cluster_load_balancer_is_immutable_except_allowed_cidrs_and_monitor() {
    let old = json!({"spec": {"identityRef": {"name": "cloud", "cloudName": "openstack"},
        "apiServer": {"managedLoadBalancer": {"enabled": true, "provider": "amphora", "allowedCIDRs": ["10.0.0.0/8"]}}}});
    assert_eq!(
        cel_errors("OpenStackCluster", &old, None),
        Vec::<String>::new()
    );

    let mut cidrs = old.clone();
    cidrs["spec"]["apiServer"]["managedLoadBalancer"]["allowedCIDRs"] = json!(["192.168.0.0/16"]);
    cidrs["spec"]["apiServer"]["managedLoadBalancer"]["monitor"] =
        json!({"delay": 5, "timeout": 3});
    assert_eq!(
        cel_errors("OpenStackCluster", &cidrs, Some(&old)),
        Vec::<String>::new()
    );

    let mut provider = old.clone();
    provider["spec"]["apiServer"]["managedLoadBalancer"]["provider"] = json!("ovn");
    assert!(
        cel_errors("OpenStackCluster", &provider, Some(&old))
            .iter()
            .any(|e| e.contains("except its allowedCIDRs and monitor"))
    );

    let mut removed = old.clone();
    removed["spec"]["apiServer"] = json!({});
    assert!(
        cel_errors("OpenStackCluster", &removed, Some(&old))
            .iter()
            .any(|e| e.contains("cannot be added, removed or changed"))
    );

    let mut tags = old.clone();
    tags["spec"]["tags"] = json!(["team-a"]);
    assert!(
        cel_errors("OpenStackCluster", &tags, Some(&old))
            .iter()
            .any(|e| e.contains("spec cannot be modified")),
        "other fields are frozen, as CAPO's webhook freezes them"
    );

    let mut no_external = old.clone();
    no_external["spec"]["enableExternalNetwork"] = json!(false);
    assert!(
        cel_errors("OpenStackCluster", &no_external, None)
            .iter()
            .any(|e| e.contains("enableFloatingIP"))
    );
}
