//! The OpenStackFloatingIPPool reconciler: Cluster API's IPAM contract for floating IPs.
//! observe (the pool's IPAddresses and claims, read fresh; its network's floating IPs, one
//! list) -> plan ([`plan`], pure) -> apply (release, answer) -> status (one patch).
//!
//! A claim asking this pool (by kind and name, as CAPO matches) is answered with an
//! IPAddress named after it, holding a preallocated IP, one the pool holds free, or a new
//! floating IP tagged with the pool's tag. An IPAddress that goes releases its IP by the
//! reclaim policy. A pool that goes waits for its IPAddresses, then deletes the floating IPs
//! it allocated.

pub mod plan;

use std::sync::Arc;

use capo_api::OpenStackFloatingIPPool;
use capo_api::common::{IdOrFilter, NetworkStatus};
use capo_api::conditions::{self, Desired, Status, reasons, types};
use capo_api::floating_ip_pool::OpenStackFloatingIPPoolStatus;
use capo_api::ipam::{self, IPAddress, IPAddressClaim, IPAddressSpec, LocalName, PoolReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::error::{Categorized, ErrorCategory, FromPanic};
use super::identity::{self, IdentityError};
use super::outcome::Outcome;
use super::server::resolve::neutron_filter;
use super::{Context, writes};
use crate::cloud::neutron::{Filter, FloatingIp};
use crate::cloud::{CloudClient, CloudError};
use plan::{Answer, Release};

/// The `controller` label of metrics and the span name.
pub const CONTROLLER: &str = "openstackfloatingippool";

/// What the watch hands us: the object, or why it could not be read.
pub type Watched = DeserializeGuard<OpenStackFloatingIPPool>;

/// CAPO's condition on the pool, written beside `Ready` with the same meaning.
pub const CAPO_READY: &str = "OpenstackFloatingIPPoolReadyCondition";
/// CAPO's reason when `maxIPs` stops allocations.
pub const MAX_IPS_REACHED: &str = "MaxIPsReached";
/// CAPO's reason when the pool's network cannot be found.
pub const UNABLE_TO_FIND_NETWORK: &str = "UnableToFindNetwork";

const STATUS_FIELDS: &[&str] = &[
    "claimedIPs",
    "availableIPs",
    "failedIPs",
    "floatingIPNetwork",
    "conditions",
    "observedGeneration",
];

/// Why a reconcile of an OpenStackFloatingIPPool failed; its category says what happens next.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The reconcile panicked: a bug in capo-rs, caught and retried with backoff.
    #[error("the reconcile panicked (a bug in capo-rs; please report it): {0}")]
    Panicked(String),
    /// A read or write through the Kubernetes API failed.
    #[error("{what}: {source}")]
    Kubernetes {
        /// What was being done (`listing IPAddressClaims`, `writing status`).
        what: String,
        /// The Kubernetes client's error.
        #[source]
        source: kube::Error,
    },
    /// No OpenStack client could be had from the `identityRef`.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// `floatingIPNetwork` matches no external network, or more than one (reason
    /// UnableToFindNetwork).
    #[error("{0}")]
    Network(String),
    /// An OpenStack request failed.
    #[error("{action}: {source}")]
    Cloud {
        /// What was being done (`finding the pool's external network`).
        action: String,
        /// The cloud's error; its category is the error's.
        #[source]
        source: CloudError,
    },
}

impl FromPanic for PoolError {
    fn from_panic(message: String) -> Self {
        PoolError::Panicked(message)
    }
}

impl Categorized for PoolError {
    fn category(&self) -> ErrorCategory {
        match self {
            PoolError::Kubernetes { .. } => ErrorCategory::Kubernetes,
            PoolError::Panicked(_) => ErrorCategory::Internal,
            PoolError::Identity(error) => error.category(),
            PoolError::Network(_) => ErrorCategory::InvalidSpec,
            PoolError::Cloud { source, .. } => source.category(),
        }
    }
}

impl PoolError {
    fn reason(&self) -> &'static str {
        match self {
            PoolError::Network(_) => UNABLE_TO_FIND_NETWORK,
            PoolError::Cloud { source, .. } if source.is_quota() => reasons::QUOTA_EXCEEDED,
            _ => self.category().reason(),
        }
    }

    fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> PoolError {
        let what = what.into();
        move |source| PoolError::Kubernetes { what, source }
    }

    fn cloud(action: impl Into<String>) -> impl FnOnce(CloudError) -> PoolError {
        let action = action.into();
        move |source| PoolError::Cloud { action, source }
    }
}

/// One reconcile, as kube-runtime's `Controller` calls it.
pub async fn reconcile(object: Arc<Watched>, ctx: Arc<Context>) -> Result<Action, PoolError> {
    super::reconcile_watched(
        CONTROLLER,
        object,
        ctx,
        async |pool, ctx, _key| reconcile_pool(pool, ctx).await,
        PoolError::kube("writing status"),
    )
    .await
}

/// After a failed reconcile: back off, or wait.
pub fn error_policy(object: Arc<Watched>, error: &PoolError, ctx: Arc<Context>) -> Action {
    super::back_off(CONTROLLER, object.as_ref(), error, &ctx)
}

/// What one pass works with.
struct Pass<'a> {
    ctx: &'a Context,
    pool: &'a OpenStackFloatingIPPool,
    namespace: String,
    cloud: CloudClient,
    addresses: Vec<IPAddress>,
    claims: Vec<IPAddressClaim>,
    network: NetworkStatus,
    floating_ips: Vec<FloatingIp>,
}

async fn reconcile_pool(
    pool: &OpenStackFloatingIPPool,
    ctx: &Context,
) -> Result<Outcome, PoolError> {
    let namespace = pool.namespace().unwrap_or_default();
    let api: Api<OpenStackFloatingIPPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let before = pool.status.clone();
    let mut status = before.clone().unwrap_or_default();
    let generation = pool.meta().generation;
    let result = run(pool, ctx, &api, &namespace, &mut status).await;
    if matches!(result, Ok(Outcome::Deleted)) {
        return result;
    }
    let now = Timestamp::now();
    if let Err(error) = &result {
        let failed = Desired::new(
            types::READY,
            Status::False,
            error.reason(),
            error.to_string(),
        );
        conditions::set(&mut status.conditions, &failed, generation, now);
        if error.category().is_terminal() {
            let regarding = pool.object_ref(&());
            let note = error.to_string();
            ctx.event(
                &regarding,
                EventType::Warning,
                error.reason(),
                "Reconcile",
                note,
            )
            .await;
        }
    }
    mirror_for_capo(&mut status, generation, now);
    status.observed_generation = generation;
    writes::patch_status(
        &api,
        &pool.name_any(),
        before.as_ref(),
        &status,
        STATUS_FIELDS,
    )
    .await
    .map_err(PoolError::kube("writing status"))?;
    result
}

/// CAPO's condition says what `Ready` says.
fn mirror_for_capo(
    status: &mut OpenStackFloatingIPPoolStatus,
    generation: Option<i64>,
    now: Timestamp,
) {
    let Some(ready) = conditions::find(&status.conditions, types::READY).cloned() else {
        return;
    };
    let state = if ready.status == "True" {
        Status::True
    } else {
        Status::False
    };
    let capo = Desired::new(CAPO_READY, state, &ready.reason, ready.message);
    conditions::set(&mut status.conditions, &capo, generation, now);
}

async fn run(
    pool: &OpenStackFloatingIPPool,
    ctx: &Context,
    api: &Api<OpenStackFloatingIPPool>,
    namespace: &str,
    status: &mut OpenStackFloatingIPPoolStatus,
) -> Result<Outcome, PoolError> {
    let deleting = pool.meta().deletion_timestamp.is_some();
    if deleting && !pool.finalizers().iter().any(|f| f == ipam::POOL_FINALIZER) {
        return Ok(Outcome::Deleted);
    }
    if !deleting {
        writes::add_finalizer(api, pool, ipam::POOL_FINALIZER)
            .await
            .map_err(PoolError::kube("adding the finalizer"))?;
    }
    let cloud = if deleting {
        identity::cleanup_client(ctx, namespace, &pool.spec.identity_ref).await?
    } else {
        identity::cloud_client(ctx, namespace, &pool.spec.identity_ref).await?
    };
    let network = network(pool, &cloud, status).await?;
    status.floating_ip_network = Some(network.clone());
    let mut pass = Pass {
        ctx,
        pool,
        namespace: namespace.to_owned(),
        cloud,
        addresses: Vec::new(),
        claims: Vec::new(),
        network,
        floating_ips: Vec::new(),
    };
    pass.observe().await?;
    let view = pass.view(status);
    let plan = plan::plan(&view.pool, &view.addresses, &view.claims, &view.cloud);
    for release in &plan.releases {
        pass.release(release).await?;
    }
    for orphan in &plan.orphans {
        pass.delete_address(orphan).await?;
    }
    if deleting {
        return pass.finish_deletion(api, status, &plan).await;
    }
    status.claimed_ips = plan.claimed.clone();
    status.available_ips = plan.available.clone();
    status.failed_ips = plan.failed.clone();
    if !plan.duplicates.is_empty() {
        let note = format!(
            "several IPAddresses hold {}: delete all but one of them",
            plan.duplicates.join(", ")
        );
        tracing::warn!(%note, "duplicate addresses");
        pass.event(EventType::Warning, "DuplicateAddress", note)
            .await;
    }
    for answer in &plan.answers {
        pass.answer(answer, status).await?;
    }
    let waiting = if plan.over_max.is_empty() {
        Desired::new(types::READY, Status::True, reasons::READY, "")
    } else {
        let message = format!(
            "maxIPs ({}) reached: claims {} wait for an address to be released",
            pool.spec.max_ips.unwrap_or_default(),
            plan.over_max.join(", ")
        );
        Desired::new(types::READY, Status::False, MAX_IPS_REACHED, message)
    };
    conditions::set(
        &mut status.conditions,
        &waiting,
        pool.meta().generation,
        Timestamp::now(),
    );
    Ok(Outcome::Settled)
}

/// The external network the pool allocates from: recorded once resolved; else the one the
/// spec names, or the only external network there is (as CAPO's empty filter finds it).
async fn network(
    pool: &OpenStackFloatingIPPool,
    cloud: &CloudClient,
    status: &OpenStackFloatingIPPoolStatus,
) -> Result<NetworkStatus, PoolError> {
    if let Some(known) = &status.floating_ip_network {
        return Ok(known.clone());
    }
    let found = match &pool.spec.floating_ip_network {
        Some(IdOrFilter { id: Some(id), .. }) => {
            let filter = Filter {
                id: Some(id.clone()),
                ..Filter::default()
            };
            filter.with("router:external", "true")
        }
        Some(IdOrFilter { filter, .. }) => {
            neutron_filter(filter.as_ref()).with("router:external", "true")
        }
        None => Filter::default().with("router:external", "true"),
    };
    let mut networks = cloud
        .neutron()
        .list_networks(&found)
        .await
        .map_err(PoolError::cloud("finding the pool's external network"))?;
    match networks.len() {
        1 => {
            let network = networks.remove(0);
            Ok(NetworkStatus {
                name: network.name,
                id: network.id,
                tags: network.tags,
            })
        }
        0 => Err(PoolError::Network(
            "no external network matches floatingIPNetwork".into(),
        )),
        n => Err(PoolError::Network(format!(
            "{n} external networks match floatingIPNetwork: name exactly one"
        ))),
    }
}

/// The pass's observations, as the plan takes them.
struct View {
    pool: plan::Pool,
    addresses: Vec<plan::Address>,
    claims: Vec<plan::Claim>,
    cloud: Vec<plan::CloudIp>,
}

impl Pass<'_> {
    /// The pool's IPAddresses and claims, from the API server (not a cache: see `plan`), and
    /// the floating IPs of its network.
    async fn observe(&mut self) -> Result<(), PoolError> {
        let name = self.pool.name_any();
        let ours = |reference: &PoolReference| reference.floating_ip_pool() == Some(name.as_str());
        let addresses: Api<IPAddress> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        self.addresses = addresses
            .list(&ListParams::default())
            .await
            .map_err(PoolError::kube("listing IPAddresses"))?
            .items
            .into_iter()
            .filter(|a| ours(&a.spec.pool_ref))
            .collect();
        let claims: Api<IPAddressClaim> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        self.claims = claims
            .list(&ListParams::default())
            .await
            .map_err(PoolError::kube("listing IPAddressClaims"))?
            .items
            .into_iter()
            .filter(|c| ours(&c.spec.pool_ref))
            .collect();
        let filter = Filter::default().with("floating_network_id", self.network.id.clone());
        self.floating_ips = self
            .cloud
            .neutron()
            .list_floating_ips(&filter)
            .await
            .map_err(PoolError::cloud("listing the network's floating IPs"))?;
        Ok(())
    }

    fn view(&self, status: &OpenStackFloatingIPPoolStatus) -> View {
        let spec = &self.pool.spec;
        let pool = plan::Pool {
            preallocated: spec.pre_allocated_floating_ips.clone(),
            available: status.available_ips.clone(),
            reclaim: spec.reclaim_policy,
            max_ips: spec.max_ips,
        };
        let addresses = self
            .addresses
            .iter()
            .map(|a| plan::Address {
                name: a.name_any(),
                claim: a.spec.claim_ref.name.clone(),
                ip: a.spec.address.clone(),
                deleting: a.meta().deletion_timestamp.is_some(),
                held: a.finalizers().iter().any(|f| f == ipam::ADDRESS_FINALIZER),
            })
            .collect();
        let claims = self
            .claims
            .iter()
            .map(|c| plan::Claim {
                name: c.name_any(),
                deleting: c.meta().deletion_timestamp.is_some(),
                answered: c.address_name().is_some(),
            })
            .collect();
        let tag = ipam::pool_tag(&self.pool.name_any());
        let cloud = self
            .floating_ips
            .iter()
            .map(|f| plan::CloudIp {
                id: f.id.clone(),
                ip: f.floating_ip_address.clone(),
                attached: f.port_id.is_some(),
                tagged: f.tags.contains(&tag),
            })
            .collect();
        View {
            pool,
            addresses,
            claims,
            cloud,
        }
    }

    async fn release(&self, release: &Release) -> Result<(), PoolError> {
        let neutron = self.cloud.neutron();
        match release {
            Release::Delete { id, .. } => match neutron.delete_floating_ip(id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {
                    tracing::info!(floating_ip = %id, "deleted a released floating IP");
                }
                Err(error) => {
                    return Err(PoolError::cloud(format!("deleting floating IP {id}"))(
                        error,
                    ));
                }
            },
            Release::Return {
                id, detach: true, ..
            } => {
                neutron
                    .associate_floating_ip(id, None)
                    .await
                    .map_err(PoolError::cloud(format!("detaching floating IP {id}")))?;
            }
            Release::Return { .. } | Release::Gone { .. } => {}
        }
        let api: Api<IPAddress> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        if let Some(address) = self
            .addresses
            .iter()
            .find(|a| a.name_any() == release.address())
        {
            writes::remove_finalizer(&api, address, ipam::ADDRESS_FINALIZER)
                .await
                .map_err(PoolError::kube(format!(
                    "releasing IPAddress {}",
                    release.address()
                )))?;
        }
        Ok(())
    }

    async fn delete_address(&self, name: &str) -> Result<(), PoolError> {
        let api: Api<IPAddress> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(address = %name, "its claim is gone: deleting the IPAddress");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(PoolError::kube(format!("deleting IPAddress {name}"))(error)),
        }
    }

    /// The pool goes once no IPAddress is left: what it allocated goes with it.
    async fn finish_deletion(
        &self,
        api: &Api<OpenStackFloatingIPPool>,
        status: &mut OpenStackFloatingIPPoolStatus,
        plan: &plan::Plan,
    ) -> Result<Outcome, PoolError> {
        let left = self.addresses.iter().filter(|a| {
            let released = plan.releases.iter().any(|r| r.address() == a.name_any());
            !(released && a.meta().deletion_timestamp.is_some())
        });
        let left: Vec<String> = left.map(ResourceExt::name_any).collect();
        if !left.is_empty() {
            let message = format!(
                "waiting for {} IPAddresses to be released: {}",
                left.len(),
                left.join(", ")
            );
            let deleting = Desired::new(types::READY, Status::False, reasons::DELETING, message);
            conditions::set(
                &mut status.conditions,
                &deleting,
                self.pool.meta().generation,
                Timestamp::now(),
            );
            return Ok(Outcome::Poll(self.ctx.config.poll_max));
        }
        let mut view = self.view(status);
        view.pool.available = plan.available.clone();
        for id in plan::on_pool_deletion(&view.pool, &view.cloud) {
            match self.cloud.neutron().delete_floating_ip(&id).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(error) => {
                    return Err(PoolError::cloud(format!("deleting floating IP {id}"))(
                        error,
                    ));
                }
            }
        }
        writes::remove_finalizer(api, self.pool, ipam::POOL_FINALIZER)
            .await
            .map_err(PoolError::kube("removing the finalizer"))?;
        tracing::info!("pool deleted; its floating IPs released");
        Ok(Outcome::Deleted)
    }

    async fn answer(
        &self,
        answer: &Answer,
        status: &mut OpenStackFloatingIPPoolStatus,
    ) -> Result<(), PoolError> {
        let (claim, ip) = match answer {
            Answer::Link { claim } => return self.point_claim(claim).await,
            Answer::Give { claim, ip } => (claim, ip.clone()),
            Answer::Allocate { claim } => (claim, self.allocate(status).await?),
        };
        let Some(found) = self.claims.iter().find(|c| &c.name_any() == claim) else {
            return Ok(());
        };
        self.create_address(found, &ip).await?;
        status.available_ips.retain(|held| held != &ip);
        if !status.claimed_ips.contains(&ip) {
            status.claimed_ips.push(ip.clone());
        }
        self.point_claim(claim).await?;
        let note = format!("Claim {claim} got {ip}");
        tracing::info!(claim = %claim, ip = %ip, "claim answered");
        self.event(EventType::Normal, "ClaimedIP", note).await;
        Ok(())
    }

    /// A new floating IP, tagged so a restart finds it, and held as available until its
    /// IPAddress exists (so a failure in between loses nothing). One that cannot be tagged
    /// where Neutron tags is deleted at once rather than left for nobody to find.
    async fn allocate(
        &self,
        status: &mut OpenStackFloatingIPPoolStatus,
    ) -> Result<String, PoolError> {
        let neutron = self.cloud.neutron();
        let name = self.pool.name_any();
        let description =
            format!("Created by cluster-api-provider-openstack OpenStackFloatingIPPool {name}");
        let created = neutron
            .create_floating_ip(&self.network.id, None, &description)
            .await
            .map_err(PoolError::cloud("allocating a floating IP"))?;
        if let Err(error) = neutron
            .set_tags("floatingips", &created.id, &[ipam::pool_tag(&name)])
            .await
        {
            if let Err(cleanup) = neutron.delete_floating_ip(&created.id).await {
                tracing::warn!(floating_ip = %created.id, error = %cleanup, "deleting an untagged floating IP failed");
            }
            return Err(PoolError::cloud("tagging a new floating IP")(error));
        }
        tracing::info!(floating_ip = %created.floating_ip_address, "allocated a floating IP");
        status
            .available_ips
            .push(created.floating_ip_address.clone());
        Ok(created.floating_ip_address)
    }

    async fn create_address(&self, claim: &IPAddressClaim, ip: &str) -> Result<(), PoolError> {
        let name = claim.name_any();
        let owner = OwnerReference {
            api_version: IPAddressClaim::api_version(&()).into_owned(),
            kind: IPAddressClaim::kind(&()).into_owned(),
            name: name.clone(),
            uid: claim.uid().unwrap_or_default(),
            ..OwnerReference::default()
        };
        let address = IPAddress {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                finalizers: Some(vec![ipam::ADDRESS_FINALIZER.into()]),
                owner_references: Some(vec![owner]),
                labels: claim.metadata.labels.clone(),
                ..ObjectMeta::default()
            },
            spec: IPAddressSpec {
                claim_ref: LocalName { name: name.clone() },
                pool_ref: PoolReference {
                    api_group: capo_api::GROUP.into(),
                    kind: ipam::FLOATING_IP_POOL_KIND.into(),
                    name: self.pool.name_any(),
                },
                address: ip.to_owned(),
                prefix: 32,
                gateway: None,
            },
        };
        let api: Api<IPAddress> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        match api.create(&PostParams::default(), &address).await {
            Ok(_) => Ok(()),
            // Made by an earlier pass whose claim write was lost: the next pass links it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(PoolError::kube(format!("creating IPAddress {name}"))(error)),
        }
    }

    async fn point_claim(&self, claim: &str) -> Result<(), PoolError> {
        let api: Api<IPAddressClaim> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let patch = Patch::Merge(json!({"status": {"addressRef": {"name": claim}}}));
        api.patch_status(claim, &PatchParams::default(), &patch)
            .await
            .map_err(PoolError::kube(format!("answering claim {claim}")))?;
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let regarding = self.pool.object_ref(&());
        self.ctx
            .event(&regarding, type_, reason, "Reconcile", note)
            .await;
    }
}
