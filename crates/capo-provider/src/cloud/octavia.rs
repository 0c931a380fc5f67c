//! Octavia v2: load balancers, listeners, pools, health monitors, members, the status tree,
//! providers and flavors. Statuses are parsed into enums; a value we do not know becomes
//! `Unknown` rather than an error, so a newer Octavia cannot break decoding.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::capabilities::{Answer, parse_version};
use super::endpoint::Call;
use super::{CloudError, Operation, RequestPath, Service};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProvisioningStatus {
    Active,
    Deleted,
    Error,
    PendingCreate,
    PendingUpdate,
    PendingDelete,
    #[serde(other)]
    Unknown,
}

impl ProvisioningStatus {
    /// Octavia's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Deleted => "DELETED",
            Self::Error => "ERROR",
            Self::PendingCreate => "PENDING_CREATE",
            Self::PendingUpdate => "PENDING_UPDATE",
            Self::PendingDelete => "PENDING_DELETE",
            Self::Unknown => "UNKNOWN",
        }
    }

    pub fn is_pending(self) -> bool {
        matches!(
            self,
            Self::PendingCreate | Self::PendingUpdate | Self::PendingDelete
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OperatingStatus {
    Online,
    Draining,
    Offline,
    Degraded,
    Error,
    NoMonitor,
    #[serde(other)]
    Unknown,
}

impl OperatingStatus {
    /// Octavia's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "ONLINE",
            Self::Draining => "DRAINING",
            Self::Offline => "OFFLINE",
            Self::Degraded => "DEGRADED",
            Self::Error => "ERROR",
            Self::NoMonitor => "NO_MONITOR",
            Self::Unknown => "UNKNOWN",
        }
    }
}

/// `{"id": ...}` references inside Octavia objects.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct IdRef {
    pub id: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LoadBalancer {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    #[serde(default)]
    pub vip_address: Option<String>,
    #[serde(default)]
    pub vip_port_id: Option<String>,
    #[serde(default)]
    pub vip_subnet_id: Option<String>,
    #[serde(default)]
    pub vip_network_id: Option<String>,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub flavor_id: Option<String>,
    #[serde(default)]
    pub availability_zone: Option<String>,
    #[serde(default)]
    pub listeners: Vec<IdRef>,
    #[serde(default)]
    pub pools: Vec<IdRef>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LoadBalancerSpec {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_subnet_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_network_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vip_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavor_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub availability_zone: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Listener {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    pub protocol: String,
    pub protocol_port: u16,
    #[serde(default)]
    pub default_pool_id: Option<String>,
    #[serde(default)]
    pub allowed_cidrs: Option<Vec<String>>,
    #[serde(default)]
    pub loadbalancers: Vec<IdRef>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ListenerSpec {
    pub name: String,
    pub loadbalancer_id: String,
    pub protocol: String,
    pub protocol_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_cidrs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Pool {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    pub protocol: String,
    pub lb_algorithm: String,
    #[serde(default)]
    pub healthmonitor_id: Option<String>,
    #[serde(default)]
    pub listeners: Vec<IdRef>,
    #[serde(default)]
    pub loadbalancers: Vec<IdRef>,
    #[serde(default)]
    pub members: Vec<IdRef>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolSpec {
    pub name: String,
    pub protocol: String,
    pub lb_algorithm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listener_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadbalancer_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct HealthMonitor {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    pub delay: u32,
    pub timeout: u32,
    pub max_retries: u32,
    #[serde(default)]
    pub max_retries_down: Option<u32>,
    /// HTTP and HTTPS monitors only.
    #[serde(default)]
    pub url_path: Option<String>,
    #[serde(default)]
    pub expected_codes: Option<String>,
    #[serde(default)]
    pub pools: Vec<IdRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HealthMonitorSpec {
    pub name: String,
    pub pool_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub delay: u32,
    pub timeout: u32,
    pub max_retries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries_down: Option<u32>,
    /// HTTP and HTTPS monitors only (Octavia refuses them on the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_codes: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Member {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    pub address: String,
    pub protocol_port: u16,
    #[serde(default)]
    pub subnet_id: Option<String>,
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemberSpec {
    pub name: String,
    pub address: String,
    pub protocol_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnet_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_port: Option<u16>,
    /// Octavia's default is 1; 0 keeps a new member out of new connections (amphora).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl MemberSpec {
    /// A member by name, address and port; the rest left to Octavia's defaults.
    pub fn new(name: impl Into<String>, address: impl Into<String>, protocol_port: u16) -> Self {
        MemberSpec {
            name: name.into(),
            address: address.into(),
            protocol_port,
            ..MemberSpec::default()
        }
    }
}

/// `GET /loadbalancers/{id}/status`: the whole tree's statuses in one call.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct StatusTree {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    #[serde(default)]
    pub listeners: Vec<ListenerStatus>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ListenerStatus {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    #[serde(default)]
    pub pools: Vec<PoolStatus>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct PoolStatus {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    #[serde(default)]
    pub health_monitor: Option<HealthMonitorStatus>,
    #[serde(default)]
    pub members: Vec<MemberStatus>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct HealthMonitorStatus {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct MemberStatus {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    pub address: String,
    pub protocol_port: u16,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Provider {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Flavor {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub enabled: bool,
}

/// One row of the load balancer list, trimmed to what tells whether anything under the LB
/// changed: Octavia writes the row (and `updated_at`, to the second) on every member create,
/// update and delete under it, and shows the lock (`PENDING_UPDATE`) while one is in flight.
/// A member's own status changing without a flow (the ovn race, a health check) does not
/// touch it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct LoadBalancerRow {
    pub id: String,
    pub provisioning_status: ProvisioningStatus,
    pub operating_status: OperatingStatus,
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// Rows per list page: Octavia's default and largest page.
pub const LIST_PAGE: usize = 1000;

/// The attributes a row asks for, each as its own `fields` parameter.
const ROW_FIELDS: [&str; 4] = [
    "id",
    "provisioning_status",
    "operating_status",
    "updated_at",
];

/// Filters for load balancer lists: by name, by all of `tags`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadBalancerFilter {
    pub name: Option<String>,
    pub tags: Vec<String>,
}

const fn op(name: &'static str) -> Operation {
    Operation::new(Service::LoadBalancer, name)
}

/// Typed Octavia calls.
pub struct Octavia<'a> {
    path: &'a RequestPath,
}

impl<'a> Octavia<'a> {
    pub(crate) fn new(path: &'a RequestPath) -> Self {
        Octavia { path }
    }

    pub async fn create_load_balancer(
        &self,
        spec: &LoadBalancerSpec,
    ) -> Result<LoadBalancer, CloudError> {
        let op = op("loadbalancer_create");
        let call = Call::post(op, "lbaas/loadbalancers", json!({ "loadbalancer": spec }));
        self.path.fetch(call.key("loadbalancer")).await
    }

    pub async fn get_load_balancer(&self, id: &str) -> Result<LoadBalancer, CloudError> {
        let op = op("loadbalancer_get");
        let call = Call::get(op, format!("lbaas/loadbalancers/{}", seg(id)));
        self.path.fetch(call.key("loadbalancer")).await
    }

    pub async fn list_load_balancers(
        &self,
        filter: &LoadBalancerFilter,
    ) -> Result<Vec<LoadBalancer>, CloudError> {
        let op = op("loadbalancer_list");
        let mut call = Call::get(op, "lbaas/loadbalancers").query_opt("name", filter.name.clone());
        if !filter.tags.is_empty() {
            call = call.query("tags", filter.tags.join(","));
        }
        self.path.fetch_all(call.key("loadbalancers")).await
    }

    /// Every load balancer the project sees, as rows, one request per [`LIST_PAGE`] of them
    /// (or per the cloud's smaller page size). `fields` is repeated (Octavia 19 reads a
    /// comma-separated value as one unknown attribute and returns empty objects), and pages
    /// are asked for by marker here because Octavia's `next` links drop `fields`. A page as
    /// long as the first is followed by another (Octavia cannot say whether it was the last;
    /// a cloud whose `pagination_max_limit` is below 1,000 answers pages shorter than asked
    /// for); an empty or shorter page is the last.
    pub async fn list_load_balancer_rows(&self) -> Result<Vec<LoadBalancerRow>, CloudError> {
        self.list_load_balancer_rows_covering(None).await
    }

    /// The same, stopping once every LB in `wanted` was listed: a page that happens to be
    /// full is not followed by another for nothing.
    pub async fn list_load_balancer_rows_covering(
        &self,
        wanted: Option<&std::collections::HashSet<String>>,
    ) -> Result<Vec<LoadBalancerRow>, CloudError> {
        let mut rows: Vec<LoadBalancerRow> = Vec::new();
        let mut found = 0;
        let mut page_size = 0;
        loop {
            let mut call = Call::get(op("loadbalancer_list"), "lbaas/loadbalancers")
                .query("limit", LIST_PAGE.to_string())
                .query_opt("marker", rows.last().map(|row| row.id.clone()));
            for field in ROW_FIELDS {
                call = call.query("fields", field);
            }
            let page: Vec<LoadBalancerRow> = self.path.fetch(call.key("loadbalancers")).await?;
            page_size = page_size.max(page.len());
            let full = !page.is_empty() && page.len() >= page_size;
            if let Some(wanted) = wanted {
                found += page.iter().filter(|row| wanted.contains(&row.id)).count();
            }
            rows.extend(page);
            if !full || wanted.is_some_and(|wanted| found >= wanted.len()) {
                return Ok(rows);
            }
        }
    }

    /// `cascade` deletes listeners, pools, monitors and members with it.
    pub async fn delete_load_balancer(&self, id: &str, cascade: bool) -> Result<(), CloudError> {
        let op = op("loadbalancer_delete");
        let call = Call::delete(op, format!("lbaas/loadbalancers/{}", seg(id)));
        let call = if cascade {
            call.query("cascade", "true")
        } else {
            call
        };
        self.path.run(call).await
    }

    pub async fn status_tree(&self, lb_id: &str) -> Result<StatusTree, CloudError> {
        #[derive(Deserialize)]
        struct Statuses {
            loadbalancer: StatusTree,
        }
        let op = op("loadbalancer_status_get");
        let call = Call::get(op, format!("lbaas/loadbalancers/{}/status", seg(lb_id)));
        let statuses: Statuses = self.path.fetch(call.key("statuses")).await?;
        Ok(statuses.loadbalancer)
    }

    pub async fn create_listener(&self, spec: &ListenerSpec) -> Result<Listener, CloudError> {
        let op = op("loadbalancer_listener_create");
        let call = Call::post(op, "lbaas/listeners", json!({ "listener": spec }));
        self.path.fetch(call.key("listener")).await
    }

    pub async fn get_listener(&self, id: &str) -> Result<Listener, CloudError> {
        let op = op("loadbalancer_listener_get");
        let call = Call::get(op, format!("lbaas/listeners/{}", seg(id)));
        self.path.fetch(call.key("listener")).await
    }

    /// Listeners of a load balancer, optionally by name.
    pub async fn list_listeners(
        &self,
        lb_id: &str,
        name: Option<&str>,
    ) -> Result<Vec<Listener>, CloudError> {
        let op = op("loadbalancer_listener_list");
        let call = Call::get(op, "lbaas/listeners")
            .query("loadbalancer_id", lb_id)
            .query_opt("name", name);
        self.path.fetch_all(call.key("listeners")).await
    }

    /// Changes the CIDRs allowed to reach a listener (`allowedCIDRs` in the cluster spec).
    pub async fn update_listener_allowed_cidrs(
        &self,
        id: &str,
        allowed_cidrs: &[String],
    ) -> Result<Listener, CloudError> {
        let op = op("loadbalancer_listener_update");
        let body = json!({ "listener": { "allowed_cidrs": allowed_cidrs } });
        let call = Call::put(op, format!("lbaas/listeners/{}", seg(id)), body);
        self.path.fetch(call.key("listener")).await
    }

    pub async fn delete_listener(&self, id: &str) -> Result<(), CloudError> {
        let op = op("loadbalancer_listener_delete");
        self.path
            .run(Call::delete(op, format!("lbaas/listeners/{}", seg(id))))
            .await
    }

    pub async fn create_pool(&self, spec: &PoolSpec) -> Result<Pool, CloudError> {
        let op = op("loadbalancer_pool_create");
        let call = Call::post(op, "lbaas/pools", json!({ "pool": spec }));
        self.path.fetch(call.key("pool")).await
    }

    pub async fn get_pool(&self, id: &str) -> Result<Pool, CloudError> {
        let op = op("loadbalancer_pool_get");
        let call = Call::get(op, format!("lbaas/pools/{}", seg(id)));
        self.path.fetch(call.key("pool")).await
    }

    /// Pools of a load balancer, optionally by name.
    pub async fn list_pools(
        &self,
        lb_id: &str,
        name: Option<&str>,
    ) -> Result<Vec<Pool>, CloudError> {
        let op = op("loadbalancer_pool_list");
        let call = Call::get(op, "lbaas/pools")
            .query("loadbalancer_id", lb_id)
            .query_opt("name", name);
        self.path.fetch_all(call.key("pools")).await
    }

    pub async fn delete_pool(&self, id: &str) -> Result<(), CloudError> {
        let op = op("loadbalancer_pool_delete");
        self.path
            .run(Call::delete(op, format!("lbaas/pools/{}", seg(id))))
            .await
    }

    pub async fn create_health_monitor(
        &self,
        spec: &HealthMonitorSpec,
    ) -> Result<HealthMonitor, CloudError> {
        let op = op("loadbalancer_healthmonitor_create");
        let call = Call::post(op, "lbaas/healthmonitors", json!({ "healthmonitor": spec }));
        self.path.fetch(call.key("healthmonitor")).await
    }

    pub async fn get_health_monitor(&self, id: &str) -> Result<HealthMonitor, CloudError> {
        let op = op("loadbalancer_healthmonitor_get");
        let call = Call::get(op, format!("lbaas/healthmonitors/{}", seg(id)));
        self.path.fetch(call.key("healthmonitor")).await
    }

    pub async fn list_health_monitors(
        &self,
        pool_id: &str,
    ) -> Result<Vec<HealthMonitor>, CloudError> {
        let op = op("loadbalancer_healthmonitor_list");
        let call = Call::get(op, "lbaas/healthmonitors").query("pool_id", pool_id);
        self.path.fetch_all(call.key("healthmonitors")).await
    }

    /// Changes a health monitor in place: its timings, and an HTTP(S) monitor's request.
    /// (Its `type` cannot change: Octavia refuses the attribute on an update.)
    pub async fn update_health_monitor(
        &self,
        id: &str,
        wanted: &HealthMonitorSpec,
    ) -> Result<HealthMonitor, CloudError> {
        let op = op("loadbalancer_healthmonitor_update");
        let mut fields = json!({
            "delay": wanted.delay, "timeout": wanted.timeout,
            "max_retries": wanted.max_retries, "max_retries_down": wanted.max_retries_down,
        });
        for (key, value) in [
            ("http_method", &wanted.http_method),
            ("url_path", &wanted.url_path),
            ("expected_codes", &wanted.expected_codes),
        ] {
            if let Some(value) = value {
                fields[key] = json!(value);
            }
        }
        let body = json!({ "healthmonitor": fields });
        let call = Call::put(op, format!("lbaas/healthmonitors/{}", seg(id)), body);
        self.path.fetch(call.key("healthmonitor")).await
    }

    pub async fn delete_health_monitor(&self, id: &str) -> Result<(), CloudError> {
        let op = op("loadbalancer_healthmonitor_delete");
        self.path
            .run(Call::delete(
                op,
                format!("lbaas/healthmonitors/{}", seg(id)),
            ))
            .await
    }

    pub async fn list_members(&self, pool_id: &str) -> Result<Vec<Member>, CloudError> {
        let op = op("loadbalancer_member_list");
        let call = Call::get(op, format!("lbaas/pools/{}/members", seg(pool_id)));
        self.path.fetch_all(call.key("members")).await
    }

    pub async fn get_member(&self, pool_id: &str, member_id: &str) -> Result<Member, CloudError> {
        let op = op("loadbalancer_member_get");
        let path = format!("lbaas/pools/{}/members/{}", seg(pool_id), seg(member_id));
        self.path.fetch(Call::get(op, path).key("member")).await
    }

    /// One member at a time: a batch update puts every listed member in PENDING_UPDATE and one
    /// failure sends the whole batch to ERROR.
    pub async fn create_member(
        &self,
        pool_id: &str,
        spec: &MemberSpec,
    ) -> Result<Member, CloudError> {
        let op = op("loadbalancer_member_create");
        let path = format!("lbaas/pools/{}/members", seg(pool_id));
        let call = Call::post(op, path, json!({ "member": spec }));
        self.path.fetch(call.key("member")).await
    }

    /// Sets a member's weight: 0 takes it out of new connections while open ones go on
    /// (amphora; ovn ignores weights).
    pub async fn set_member_weight(
        &self,
        pool_id: &str,
        member_id: &str,
        weight: u32,
    ) -> Result<Member, CloudError> {
        let op = op("loadbalancer_member_update");
        let path = format!("lbaas/pools/{}/members/{}", seg(pool_id), seg(member_id));
        let call = Call::put(op, path, json!({ "member": { "weight": weight } }));
        self.path.fetch(call.key("member")).await
    }

    pub async fn delete_member(&self, pool_id: &str, member_id: &str) -> Result<(), CloudError> {
        let op = op("loadbalancer_member_delete");
        let path = format!("lbaas/pools/{}/members/{}", seg(pool_id), seg(member_id));
        self.path.run(Call::delete(op, path)).await
    }

    /// Octavia's current API version, from its version document at the endpoint's root (the
    /// last entry, as CAPO reads it), remembered for a while per cloud.
    pub async fn api_version(&self) -> Result<Option<(u32, u32)>, CloudError> {
        const QUESTION: &str = "octavia api version";
        if let Some(Answer::Version(known)) = self.path.capabilities().known(QUESTION) {
            return Ok(known);
        }
        #[derive(Deserialize)]
        struct Version {
            id: String,
        }
        let call = Call::get(op("version_list"), "../").key("versions");
        let versions: Vec<Version> = self.path.fetch(call).await?;
        // The highest listed (CAPO takes the last; the highest does not rely on the order).
        let current = versions.iter().filter_map(|v| parse_version(&v.id)).max();
        self.path
            .capabilities()
            .remember(QUESTION, Answer::Version(current));
        Ok(current)
    }

    pub async fn list_providers(&self) -> Result<Vec<Provider>, CloudError> {
        let op = op("loadbalancer_provider_list");
        let call = Call::get(op, "lbaas/providers");
        self.path.fetch_all(call.key("providers")).await
    }

    /// Flavors, optionally by name.
    pub async fn list_flavors(&self, name: Option<&str>) -> Result<Vec<Flavor>, CloudError> {
        let op = op("loadbalancer_flavor_list");
        let call = Call::get(op, "lbaas/flavors").query_opt("name", name);
        self.path.fetch_all(call.key("flavors")).await
    }
}

/// An id or name as one path segment: anything that could change the path is escaped.
pub(crate) fn seg(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> serde_json::Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/octavia")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    #[test]
    fn recorded_objects_decode() {
        let lb = sample("loadbalancer_active.json");
        let lb: LoadBalancer = serde_json::from_value(lb["loadbalancer"].clone()).unwrap();
        assert_eq!(lb.provisioning_status, ProvisioningStatus::Active);
        let member: Member =
            serde_json::from_value(sample("member_create_response.json")["member"].clone())
                .unwrap();
        assert_eq!(
            member.provisioning_status,
            ProvisioningStatus::PendingCreate
        );
        let tree: StatusTree = serde_json::from_value(
            sample("status_tree_with_hm_and_operating_error.json")["statuses"]["loadbalancer"]
                .clone(),
        )
        .unwrap();
        let pool = &tree.listeners[0].pools[0];
        assert!(pool.health_monitor.is_some());
        assert_eq!(pool.members[1].operating_status, OperatingStatus::Error);
    }

    #[test]
    fn recorded_list_rows_decode_and_show_what_moved() {
        let signals = sample("loadbalancer_list_signals.json");
        let row = |key: &str| -> LoadBalancerRow {
            serde_json::from_value(signals[key].clone()).unwrap()
        };
        let settled = row("row_settled");
        assert_eq!(settled.provisioning_status, ProvisioningStatus::Active);
        let locked = row("row_member_create_in_flight");
        assert!(locked.provisioning_status.is_pending());
        assert!(row("row_after_member_create").updated_at > settled.updated_at);
        // The list cannot see a member finishing after its LB unlocked, nor a pushed
        // operating status: the row stays as it was.
        assert_eq!(
            row("row_lb_active_member_held"),
            row("row_after_held_member_released")
        );
        assert_eq!(
            row("row_after_held_member_released"),
            row("row_after_member_operating_error")
        );
        assert!(
            row("row_after_member_delete").updated_at
                > row("row_after_member_operating_error").updated_at
        );
        // A comma-separated `fields` names nothing Octavia knows: empty objects.
        assert_eq!(
            signals["list_fields_comma_separated"]["loadbalancers"][0],
            serde_json::json!({})
        );
    }

    #[test]
    fn unknown_statuses_do_not_break_decoding() {
        let status: ProvisioningStatus = serde_json::from_str("\"PENDING_MIGRATE\"").unwrap();
        assert_eq!(status, ProvisioningStatus::Unknown);
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(seg("abc-123"), "abc-123");
        assert_eq!(seg("../x y"), "..%2Fx%20y");
    }
}
