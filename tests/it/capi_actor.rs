//! The Cluster API actor (`capo_sim::capi`) against the simulated Kubernetes API only: no
//! OpenStack and no provider controllers. The test plays the infrastructure provider by hand
//! (an OpenStackMachine without a providerID gets `openstack:///<name>`). Every wait is for a
//! state written through the API, bounded by a timeout.

use std::time::Duration;

use capo_api::capi::{self, Cluster, Machine, deleting, labels};
use capo_api::{OpenStackCluster, OpenStackMachine, OpenStackMachineSpec};
use capo_sim::capi::{
    ActorEvent, CapiActor, CapiActorConfig, ControlPlane, MACHINE_FINALIZER, RolloutStep,
};
use capo_sim::kube::{KubeSim, KubeSimConfig};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "default";
const CLUSTER: &str = "c1";
const WAIT: Duration = Duration::from_secs(30);

async fn start_kube() -> (KubeSim, Client) {
    let kube = KubeSim::start(KubeSimConfig::default()).await.unwrap();
    let crds: Vec<Value> = capo_api::crds::all()
        .iter()
        .map(|crd| serde_json::to_value(crd).unwrap())
        .chain(
            capi::crds()
                .iter()
                .map(|crd| serde_json::to_value(crd).unwrap()),
        )
        .collect();
    kube.install(&crds).unwrap();
    let client = kube.client().unwrap();
    (kube, client)
}

/// The infrastructure provider, played by hand: every OpenStackMachine without a providerID
/// gets `openstack:///<name>`.
fn play_infrastructure(client: Client, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<OpenStackMachine> = Api::namespaced(client, NAMESPACE);
        let stream = watcher(api.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                () = cancel.cancelled() => return,
                next = stream.try_next() => next,
            };
            match next {
                Ok(Some(machine)) => {
                    if machine.spec.provider_id.is_some()
                        || machine.metadata.deletion_timestamp.is_some()
                    {
                        continue;
                    }
                    let name = machine.name_any();
                    let patch = json!({"spec": {"providerID": format!("openstack:///{name}")}});
                    if let Err(error) = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        eprintln!("infrastructure: {name}: {error}");
                    }
                }
                Ok(None) => return,
                Err(error) => eprintln!("infrastructure watch: {error}"),
            }
        }
    })
}

fn template() -> OpenStackMachineSpec {
    serde_json::from_value(json!({
        "flavor": {"filter": {"name": "m1.small"}},
        "image": {"filter": {"name": "ubuntu-2404-kube-v1.33.4"}},
    }))
    .unwrap()
}

fn plane() -> ControlPlane {
    ControlPlane {
        cluster: CLUSTER.into(),
        replicas: 3,
        template: template(),
        version: "v1.33.4".into(),
        failure_domains: vec!["az-1".into(), "az-2".into(), "az-3".into()],
    }
}

async fn create_cluster(client: &Client) {
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                        "kind": "OpenStackCluster", "name": CLUSTER}}
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let infra: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let osc: OpenStackCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "OpenStackCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {"identityRef": {"name": "cloud-config", "cloudName": "sim"},
                 "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}},
    }))
    .unwrap();
    infra.create(&PostParams::default(), &osc).await.unwrap();
    let status = json!({"status": {"initialization": {"provisioned": true}}});
    infra
        .patch_status(CLUSTER, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Waits (bounded) until the Machine satisfies `condition`.
async fn wait_machine(
    machines: &Api<Machine>,
    name: &str,
    what: &str,
    condition: impl Fn(Option<&Machine>) -> bool,
) {
    let waited = await_condition(machines.clone(), name, condition);
    tokio::time::timeout(WAIT, waited)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for Machine {name}: {what}"))
        .unwrap();
}

/// The failure domains of these Machines, sorted.
async fn failure_domains(machines: &Api<Machine>, names: &[String]) -> Vec<String> {
    let mut domains = Vec::new();
    for name in names {
        let machine = machines.get(name).await.unwrap();
        domains.push(machine.spec.failure_domain.unwrap_or_default());
    }
    domains.sort();
    domains
}

fn has_condition(machine: &Machine, type_: &str, reason: &str) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True" && c.reason == reason)
    })
}

/// Each control-plane Machine has joined and has what the Machine controller puts in place.
async fn assert_joined_control_plane(client: &Client, names: &[String]) {
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let infra: Api<OpenStackMachine> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let raw_machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<Machine>(&()),
    );
    for name in names {
        assert!(name.starts_with("c1-control-plane-"), "{name}");
        let machine = machines.get(name).await.unwrap();
        let status = machine.status.clone().unwrap_or_default();
        assert_eq!(status.node_ref.map(|n| n.name).as_deref(), Some(&**name));
        assert_eq!(
            status
                .initialization
                .and_then(|i| i.infrastructure_provisioned),
            Some(true)
        );
        // Read as sent: `capi::MachineSpec::provider_id` may not read `spec.providerID`.
        let raw = raw_machines.get(name).await.unwrap();
        assert_eq!(
            raw.data["spec"]["providerID"],
            json!(format!("openstack:///{name}"))
        );
        assert_eq!(machine.spec.cluster_name, CLUSTER);
        assert_eq!(machine.spec.version.as_deref(), Some("v1.33.4"));
        assert!(machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER));
        assert!(capi::is_control_plane(machine.labels()));
        assert!(machine.annotations().contains_key(labels::KCP_HOOK));
        let secret_name = format!("{name}-bootstrap");
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some(&*secret_name)
        );
        let secret = secrets.get(&secret_name).await.unwrap();
        let value = secret.data.unwrap_or_default().remove("value").unwrap();
        assert!(
            String::from_utf8(value.0)
                .unwrap()
                .starts_with("#cloud-config")
        );

        let osm = infra.get(name).await.unwrap();
        let owner = osm
            .owner_references()
            .iter()
            .find(|r| r.kind == "Machine")
            .unwrap_or_else(|| panic!("{name}: no Machine owner"));
        assert_eq!(owner.name, *name);
        assert_eq!(Some(&owner.uid), machine.metadata.uid.as_ref());
        assert_eq!(owner.api_version, "cluster.x-k8s.io/v1beta2");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(
            osm.labels().get(labels::CLUSTER_NAME).map(String::as_str),
            Some(CLUSTER)
        );
        assert!(capi::is_control_plane(osm.labels()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_then_a_rollout_that_waits_for_an_extra_pre_terminate_hook() {
    let (_kube, client) = start_kube().await;
    let cancel = CancellationToken::new();
    let infrastructure = play_infrastructure(client.clone(), cancel.clone());
    let actor = CapiActor::start(
        client.clone(),
        CapiActorConfig {
            namespace: NAMESPACE.into(),
            tick: Duration::from_millis(50),
            join_delay: Duration::from_millis(150),
            wait_timeout: WAIT,
        },
        cancel.clone(),
    );
    let mut events = actor.events();
    let machines: Api<Machine> = Api::namespaced(client.clone(), NAMESPACE);
    let infra: Api<OpenStackMachine> = Api::namespaced(client.clone(), NAMESPACE);

    // The Cluster controller: ownership of the OpenStackCluster, provisioned and endpoint.
    create_cluster(&client).await;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), NAMESPACE);
    let copied = await_condition(clusters.clone(), CLUSTER, |c: Option<&Cluster>| {
        c.is_some_and(|c| {
            c.spec.control_plane_endpoint.is_some()
                && c.status
                    .as_ref()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.infrastructure_provisioned)
                    == Some(true)
        })
    });
    tokio::time::timeout(WAIT, copied).await.unwrap().unwrap();
    let cluster = clusters.get(CLUSTER).await.unwrap();
    let endpoint = cluster.spec.control_plane_endpoint.unwrap();
    assert_eq!(endpoint.host.as_deref(), Some("192.0.2.10"));
    assert_eq!(endpoint.port, Some(6443));
    let osc_api: Api<OpenStackCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let owned = await_condition(osc_api.clone(), CLUSTER, |o: Option<&OpenStackCluster>| {
        o.is_some_and(|o| !o.owner_references().is_empty())
    });
    tokio::time::timeout(WAIT, owned).await.unwrap().unwrap();
    let osc = osc_api.get(CLUSTER).await.unwrap();
    let owner = &osc.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Cluster", CLUSTER)
    );
    assert_eq!(Some(&owner.uid), cluster.metadata.uid.as_ref());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(
        osc.labels().get(labels::CLUSTER_NAME).map(String::as_str),
        Some(CLUSTER)
    );

    // Scale up to 3, one at a time.
    let plane = plane();
    let old = tokio::time::timeout(WAIT * 3, actor.scale_control_plane(&plane))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.len(), 3);
    assert_joined_control_plane(&client, &old).await;
    assert_eq!(
        failure_domains(&machines, &old).await,
        ["az-1", "az-2", "az-3"]
    );

    // A worker: no control-plane label, no KCP hook.
    let workers = actor.create_workers(CLUSTER, 1, template()).await.unwrap();
    assert_eq!(workers.len(), 1);
    tokio::time::timeout(WAIT, actor.wait_joined(&workers[0]))
        .await
        .unwrap()
        .unwrap();
    let worker = machines.get(&workers[0]).await.unwrap();
    assert!(!capi::is_control_plane(worker.labels()));
    assert!(!worker.annotations().contains_key(labels::KCP_HOOK));
    assert!(!capi::is_control_plane(
        infra.get(&workers[0]).await.unwrap().labels()
    ));

    // The oldest machine, the first to go, carries an extra pre-terminate hook.
    let hooked = old[0].clone();
    let hook = json!({"metadata": {"annotations": {labels::LB_MEMBER_HOOK: ""}}});
    machines
        .patch(&hooked, &PatchParams::default(), &Patch::Merge(&hook))
        .await
        .unwrap();

    let mut steps = Vec::new();
    let rollout = actor.rollout(&plane, |step| steps.push(step));
    let hook_holder = async {
        // The hooked Machine waits, with the KCP hook still present and its infrastructure
        // still there, until the extra hook is removed.
        wait_machine(&machines, &hooked, "waiting for its hooks", |m| {
            m.is_some_and(|m| {
                m.metadata.deletion_timestamp.is_some()
                    && has_condition(
                        m,
                        deleting::CONDITION,
                        deleting::WAITING_FOR_PRE_TERMINATE_HOOK,
                    )
            })
        })
        .await;
        let machine = machines.get(&hooked).await.unwrap();
        assert!(machine.annotations().contains_key(labels::KCP_HOOK));
        assert!(machine.annotations().contains_key(labels::LB_MEMBER_HOOK));
        assert!(capi::waits_for_pre_terminate_hooks(&machine));
        let condition = machine
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == deleting::CONDITION))
            .unwrap();
        assert!(
            condition.message.contains("capo-rs-lb-member"),
            "{condition:?}"
        );
        assert!(condition.message.contains("kcp-cleanup"), "{condition:?}");
        let osm = infra.get(&hooked).await.unwrap();
        assert!(osm.metadata.deletion_timestamp.is_none());
        // The provider is done with the member: it removes its hook.
        let unhook = json!({"metadata": {"annotations": {labels::LB_MEMBER_HOOK: null}}});
        machines
            .patch(&hooked, &PatchParams::default(), &Patch::Merge(&unhook))
            .await
            .unwrap();
    };
    let (report, ()) = tokio::time::timeout(WAIT * 4, async { tokio::join!(rollout, hook_holder) })
        .await
        .unwrap();
    let report = report.unwrap();

    assert_eq!(report.replaced, old);
    assert_eq!(report.created.len(), 3);
    assert_eq!(steps.len(), 12);
    for (round, chunk) in steps.chunks(4).enumerate() {
        let new = report.created[round].clone();
        let gone = old[round].clone();
        assert_eq!(
            chunk,
            [
                RolloutStep::Created { name: new.clone() },
                RolloutStep::Joined { name: new },
                RolloutStep::Deleting { name: gone.clone() },
                RolloutStep::Deleted { name: gone },
            ]
        );
    }
    let now = actor.control_plane_machines(CLUSTER).await.unwrap();
    let now: Vec<String> = now.iter().map(ResourceExt::name_any).collect();
    assert_eq!(now, report.created);
    for name in &old {
        assert!(machines.get_opt(name).await.unwrap().is_none(), "{name}");
        assert!(infra.get_opt(name).await.unwrap().is_none(), "{name}");
    }
    assert_joined_control_plane(&client, &now).await;
    assert_eq!(
        failure_domains(&machines, &now).await,
        ["az-1", "az-2", "az-3"]
    );

    // The loop's account of the hooked Machine: waited for both hooks, then KCP's went,
    // then its infrastructure, then the Machine.
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        let name = match &event {
            ActorEvent::WaitingForHooks { name, .. }
            | ActorEvent::KcpHookRemoved { name }
            | ActorEvent::InfrastructureDeleting { name }
            | ActorEvent::MachineReleased { name } => name,
            ActorEvent::MachineJoined { .. } => continue,
        };
        if *name == hooked {
            seen.push(event);
        }
    }
    let mut both = vec![
        labels::KCP_HOOK.to_owned(),
        labels::LB_MEMBER_HOOK.to_owned(),
    ];
    both.sort();
    assert_eq!(
        seen,
        [
            ActorEvent::WaitingForHooks {
                name: hooked.clone(),
                hooks: both
            },
            ActorEvent::KcpHookRemoved {
                name: hooked.clone()
            },
            ActorEvent::InfrastructureDeleting {
                name: hooked.clone()
            },
            ActorEvent::MachineReleased {
                name: hooked.clone()
            },
        ]
    );

    actor.stop().await;
    cancel.cancel();
    tokio::time::timeout(WAIT, infrastructure)
        .await
        .unwrap()
        .unwrap();
}
