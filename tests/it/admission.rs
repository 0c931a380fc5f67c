//! CAPO's admission decisions, case by case. Every case of CAPO's webhook unit tests
//! (`tests/fixtures/capo-webhook-cases.yaml`, transcribed from CAPO main's
//! `pkg/webhooks/*_test.go`: old object, new object, CAPO's verdict) is replayed against the
//! simulated API server with our CRDs (their CEL rules) and our validating webhook (the
//! rules CEL cannot state), registered as `deploy/` registers it. The table is printed.

use capo_provider::manager::manifests::{Flavor, objects};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::conversion::{WebhookWorld, resource};

const NS: &str = "takeover";
const FIXTURE: &str = "tests/fixtures/capo-webhook-cases.yaml";

/// One case of CAPO's webhook tests.
#[derive(serde::Deserialize)]
struct Case {
    kind: String,
    case: String,
    operation: String,
    #[serde(default, rename = "dryRun")]
    dry_run: bool,
    #[serde(default)]
    old: Value,
    new: Value,
    capo: String,
}

/// The world with the validating webhooks of `deploy/` registered, trusted as cert-manager's
/// injector makes them.
pub(crate) async fn admitting_world() -> WebhookWorld {
    let world = WebhookWorld::start(None).await;
    let mut configurations: Vec<Value> = objects(Flavor::Kustomize)
        .into_iter()
        .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .collect();
    for configuration in &mut configurations {
        for webhook in configuration["webhooks"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            webhook["clientConfig"]["caBundle"] = json!(world.webhook.certs.ca_bundle());
        }
    }
    assert_eq!(
        configurations.len(),
        1,
        "deploy/ registers one configuration"
    );
    world
        .sim
        .install(&configurations)
        .expect("the ValidatingWebhookConfiguration installs");
    world
}

/// IDs in CAPO's cases are not UUIDs (`net-1`); the CRDs (CAPO's too) want UUIDs. Each is
/// replaced by a UUID made from it, the same everywhere, so every comparison stays as it was.
fn with_uuid_ids(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(id) if key == "id" && !is_uuid(id) => {
                        *id = uuid_from(id);
                    }
                    _ => with_uuid_ids(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(with_uuid_ids),
        _ => {}
    }
}

fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

fn uuid_from(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("00000000-0000-4000-8000-{:012x}", hash & 0xffff_ffff_ffff)
}

fn version_of(kind: &str) -> &'static str {
    if kind == "OpenStackServer" {
        "v1alpha1"
    } else {
        "v1beta2"
    }
}

fn object_of(case: &Case, part: &Value, name: &str, namespace: &str) -> Value {
    let mut object = json!({
        "apiVersion": format!("{}/{}", capo_api::GROUP, version_of(&case.kind)),
        "kind": case.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": part["spec"],
    });
    if let Some(annotations) = part.pointer("/metadata/annotations") {
        object["metadata"]["annotations"] = annotations.clone();
    }
    with_uuid_ids(&mut object);
    object
}

/// Our verdict on one case: `Ok` admitted, `Err` refused with the API server's message.
async fn our_verdict(
    api: &Api<DynamicObject>,
    case: &Case,
    name: &str,
    namespace: &str,
) -> Result<(), String> {
    let new = object_of(case, &case.new, name, namespace);
    let as_dynamic =
        |value: Value| serde_json::from_value::<DynamicObject>(value).expect("a DynamicObject");
    let refused = |e: kube::Error| match e {
        kube::Error::Api(status) => status.message,
        other => other.to_string(),
    };
    if case.operation == "CREATE" {
        let params = PostParams {
            dry_run: case.dry_run,
            ..PostParams::default()
        };
        return api
            .create(&params, &as_dynamic(new))
            .await
            .map(drop)
            .map_err(refused);
    }
    let old = object_of(case, &case.old, name, namespace);
    api.create(&PostParams::default(), &as_dynamic(old))
        .await
        .unwrap_or_else(|e| panic!("{}: the old object is refused: {e}", case.case));
    if let Some(status) = case.old.get("status") {
        let mut status = json!({"status": status});
        with_uuid_ids(&mut status);
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("{}: the old status is refused: {e}", case.case));
    }
    let mut current = api.get(name).await.expect("the old object reads back");
    let new = as_dynamic(new);
    current.data["spec"] = new.data["spec"].clone();
    current.metadata.annotations = new.metadata.annotations;
    let params = PostParams {
        dry_run: case.dry_run,
        ..PostParams::default()
    };
    api.replace(name, &params, &current)
        .await
        .map(drop)
        .map_err(refused)
}

/// Whether CAPO's schema (and so ours: they are the same) refuses one of the case's
/// objects: the webhook test gave CAPO's webhook an object no API server would store.
fn refused_by_schema(case: &Case) -> Option<String> {
    let subnets = |part: &Value| {
        part.pointer("/spec/managedSubnets")
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
    };
    (subnets(&case.old) > 1 || subnets(&case.new) > 1)
        .then(|| "spec.managedSubnets: Too many: must have at most 1 item".to_owned())
}

/// Our rules on a case the schema refuses, evaluated without the API server: the stored
/// version's CEL rules (kube's CEL evaluator, as the simulator uses) and the webhook's.
fn direct_verdict(case: &Case) -> Result<(), String> {
    let schema = crate::common::storage_schema(&crate::common::our_crd(&case.kind));
    let new = object_of(case, &case.new, "direct", NS);
    let old = object_of(case, &case.old, "direct", NS);
    let old = (case.operation == "UPDATE").then_some(old);
    kube::core::cel::Validator::new()
        .validate(&schema, &new, old.as_ref())
        .map_err(|errors| format!("{errors:?}"))?;
    let request = json!({"operation": case.operation, "object": new, "oldObject": old, "dryRun": case.dry_run});
    capo_api::admission::webhook_rules(&format!("{}s", case.kind.to_lowercase()), &request)
}

/// Which check refused: the webhook, a CEL rule, the schema; `direct` for a case evaluated
/// without the API server.
fn decided_by(why: &str) -> &'static str {
    if why.starts_with("spec.managedSubnets: Too many") {
        "direct"
    } else if why.contains("admission webhook") {
        "webhook"
    } else if why.is_empty() {
        ""
    } else if why.contains("Invalid value: ") && !why.contains("Unsupported value") {
        "CEL"
    } else {
        "schema"
    }
}

/// One case's verdict: "allow" or "deny", and what refused it.
pub(crate) struct Verdict {
    pub(crate) case: String,
    pub(crate) kind: String,
    pub(crate) operation: String,
    pub(crate) capo: String,
    pub(crate) ours: String,
    pub(crate) why: String,
}

/// Every case of CAPO's webhook tests, replayed on the API server behind `client` (with our
/// CRDs and our ValidatingWebhookConfiguration) in `namespace`.
pub(crate) async fn replay(client: &kube::Client, namespace: &str) -> Vec<Verdict> {
    let text = std::fs::read_to_string(FIXTURE).expect("the fixture");
    let cases: Vec<Case> = serde_saphyr::from_str(&text).expect("the cases parse");
    let mut verdicts = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let api = Api::namespaced_with(
            client.clone(),
            namespace,
            &resource(&case.kind, version_of(&case.kind)),
        );
        let (ours, why) = match refused_by_schema(case) {
            Some(schema) => match direct_verdict(case) {
                Ok(()) => ("allow".to_owned(), schema),
                Err(message) => ("deny".to_owned(), format!("{schema}; {message}")),
            },
            None => match our_verdict(&api, case, &format!("case-{i}"), namespace).await {
                Ok(()) => ("allow".to_owned(), String::new()),
                Err(message) => ("deny".to_owned(), message),
            },
        };
        verdicts.push(Verdict {
            case: case.case.clone(),
            kind: case.kind.clone(),
            operation: case.operation.clone(),
            capo: case.capo.clone(),
            ours,
            why,
        });
    }
    verdicts
}

/// The verdicts as a table, and every one that differs from CAPO's.
pub(crate) fn table(verdicts: &[Verdict]) -> (String, Vec<String>) {
    let mut table = format!(
        "{:<4} {:<26} {:<6} {:<6} {:<6} {:<8} case\n",
        "#", "kind", "op", "capo", "ours", "by"
    );
    let mut disagreements = Vec::new();
    for (i, v) in verdicts.iter().enumerate() {
        table.push_str(&format!(
            "{i:<4} {:<26} {:<6} {:<6} {:<6} {:<8} {}\n",
            v.kind,
            v.operation,
            v.capo,
            v.ours,
            decided_by(&v.why),
            v.case
        ));
        if v.ours != v.capo {
            disagreements.push(format!(
                "#{i} {}: CAPO {}, ours {}: {}",
                v.case, v.capo, v.ours, v.why
            ));
        }
    }
    (table, disagreements)
}

/// Which check refused, as [`table`] prints it.
pub(crate) fn refused_by(verdict: &Verdict) -> &'static str {
    decided_by(&verdict.why)
}

#[tokio::test]
async fn every_case_of_capos_webhook_tests_gets_capos_verdict() {
    let world = admitting_world().await;
    let verdicts = replay(&world.client, NS).await;
    let (table, disagreements) = table(&verdicts);
    println!("{table}");
    assert!(
        verdicts.len() >= 60,
        "every case is replayed: {}",
        verdicts.len()
    );
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

/// The first finding, in v1beta1 (what CAPO 0.14's users send): a managed subnet's
/// CIDR edit is refused, its DNS servers' edit admitted. v1beta1's schema does not restate
/// the rule; the webhook applies the stored version's rules to the converted objects.
#[tokio::test]
async fn a_v1beta1_edit_is_admitted_by_the_same_rules_as_v1beta2() {
    let world = admitting_world().await;
    let spoke = world.api("OpenStackCluster", capo_api::conversion::SPOKE);
    let sent = crate::conversion::spoke_cluster("edited");
    let sent: DynamicObject = serde_json::from_value(sent).expect("a DynamicObject");
    spoke
        .create(&PostParams::default(), &sent)
        .await
        .expect("created in v1beta1");
    let edit = |subnet: Value| {
        let spoke = spoke.clone();
        async move {
            let mut current = spoke.get("edited").await.expect("reads back");
            current.data["spec"]["managedSubnets"] = json!([subnet]);
            spoke
                .replace("edited", &PostParams::default(), &current)
                .await
        }
    };
    let refused = edit(json!({"cidr": "10.7.0.0/24", "dnsNameservers": ["8.8.8.8"]}))
        .await
        .expect_err("a CIDR edit is refused");
    let kube::Error::Api(status) = refused else {
        panic!("an API error: {refused}")
    };
    assert!(
        status.message.contains("admission webhook")
            && status.message.contains("cannot change a subnet's CIDR"),
        "{}",
        status.message
    );
    edit(json!({"cidr": "10.6.0.0/24", "dnsNameservers": ["1.1.1.1"]}))
        .await
        .expect("a DNS servers' edit is admitted");
}
