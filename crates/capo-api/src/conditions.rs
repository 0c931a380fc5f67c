//! The condition vocabulary of every kind, and pure helpers that keep conditions honest:
//! `lastTransitionTime` moves only when the status moves, every owned condition exists from
//! the first visit, `Ready` summarises the rest, and [`kstatus`] tells what GitOps tools
//! (Flux, Argo CD, kpt) will conclude from an object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// Condition types.
pub mod types {
    /// Summary of the blocking conditions of an object.
    pub const READY: &str = "Ready";
    /// Whether reconciliation is paused (Cluster `spec.paused` or the paused annotation).
    pub const PAUSED: &str = "Paused";
    /// Cluster network, subnets and router exist.
    pub const NETWORK_READY: &str = "NetworkReady";
    /// Managed security groups and their rules exist.
    pub const SECURITY_GROUPS_READY: &str = "SecurityGroupsReady";
    /// The control-plane endpoint is known.
    pub const API_ENDPOINT_READY: &str = "APIEndpointReady";
    /// The API load balancer is ACTIVE and every desired member is ACTIVE in every pool.
    pub const API_SERVER_LOAD_BALANCER_READY: &str = "APIServerLoadBalancerReady";
    /// Members' operating status (health); reported, never blocking.
    pub const API_SERVER_LOAD_BALANCER_HEALTHY: &str = "APIServerLoadBalancerHealthy";
    /// A control-plane machine's member is ACTIVE in every pool.
    pub const API_SERVER_LOAD_BALANCER_MEMBER_READY: &str = "APIServerLoadBalancerMemberReady";
    /// The Nova server is ACTIVE.
    pub const INSTANCE_READY: &str = "InstanceReady";
}

/// Condition reasons (CamelCase, as Kubernetes requires).
pub mod reasons {
    /// Written on the first visit, before anything is known.
    pub const NOT_YET_RECONCILED: &str = "NotYetReconciled";
    /// The condition holds.
    pub const READY: &str = "Ready";
    /// Reconciliation is paused.
    pub const PAUSED: &str = "Paused";
    /// Reconciliation is not paused.
    pub const NOT_PAUSED: &str = "NotPaused";
    /// The load balancer has not been observed yet.
    pub const LOAD_BALANCER_NOT_OBSERVED: &str = "LoadBalancerNotObserved";
    /// The load balancer itself is PENDING_*.
    pub const LOAD_BALANCER_PENDING: &str = "LoadBalancerPending";
    /// The load balancer itself is in ERROR.
    pub const LOAD_BALANCER_ERROR: &str = "LoadBalancerError";
    /// Some desired members are PENDING_*.
    pub const MEMBERS_PENDING: &str = "MembersPending";
    /// Some desired member is in ERROR.
    pub const MEMBER_ERROR: &str = "MemberError";
    /// Some desired member has been PENDING_* for longer than the stuck timeout.
    pub const MEMBER_STUCK: &str = "MemberStuck";
    /// Some desired members are absent from a pool.
    pub const MEMBERS_MISSING: &str = "MembersMissing";
    /// Some desired members are ACTIVE but their health monitor has not seen their API serve
    /// yet (the serving gate).
    pub const MEMBERS_NOT_YET_SERVING: &str = "MembersNotYetServing";
    /// Some desired member's health monitor has not seen its API serve for longer than the
    /// not-serving threshold: the rollout is held (the serving gate).
    pub const MEMBER_NOT_SERVING: &str = "MemberNotServing";
    /// The API pool has no health monitor: the serving gate falls back to provisioning status.
    pub const NO_HEALTH_MONITOR: &str = "NoHealthMonitor";
    /// The provider cannot check the API over HTTPS (ovn): the monitor checks the TCP port.
    pub const HEALTH_MONITOR_TCP_FALLBACK: &str = "HealthMonitorTCPFallback";
    /// Every member reports ONLINE or NO_MONITOR.
    pub const HEALTHY: &str = "Healthy";
    /// Some member reports OFFLINE, DEGRADED, DRAINING or ERROR.
    pub const DEGRADED: &str = "Degraded";
    /// Transient trouble talking to OpenStack; retried with backoff.
    pub const OPENSTACK_UNAVAILABLE: &str = "OpenStackUnavailable";
    /// The credentials are missing or unusable (no Secret, unknown cloud, malformed
    /// clouds.yaml, refused authentication); waits for a Secret change.
    pub const INVALID_CREDENTIALS: &str = "InvalidCredentials";
    /// An object the spec names (a user-data Secret) does not exist yet; waits for it.
    pub const DEPENDENCY_MISSING: &str = "DependencyMissing";
    /// Transient trouble talking to the Kubernetes API; retried with backoff.
    pub const KUBERNETES_UNAVAILABLE: &str = "KubernetesUnavailable";
    /// The spec cannot work (unknown flavor, invalid CIDR); waits for a spec change.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A reconcile panicked (a bug in capo-rs); caught, and retried with backoff.
    pub const INTERNAL_ERROR: &str = "InternalError";
    /// The object is being deleted.
    pub const DELETING: &str = "Deleting";
    /// The reasons of the load balancer gate (`APIServerLoadBalancerReady` and
    /// `APIServerLoadBalancerMemberReady`), most serious first: the membership engine's verdicts,
    /// one for one.
    pub const LOAD_BALANCER_GATE: &[&str] = &[
        LOAD_BALANCER_NOT_OBSERVED,
        LOAD_BALANCER_ERROR,
        MEMBER_ERROR,
        MEMBER_STUCK,
        MEMBER_NOT_SERVING,
        LOAD_BALANCER_PENDING,
        MEMBERS_MISSING,
        MEMBERS_PENDING,
        MEMBERS_NOT_YET_SERVING,
        READY,
    ];
    /// The load balancer is disabled in the spec, so there is nothing to wait for.
    pub const LOAD_BALANCER_DISABLED: &str = "LoadBalancerDisabled";
    /// APIServerLoadBalancerMemberReady of a worker: only control-plane machines join.
    pub const NOT_CONTROL_PLANE: &str = "NotControlPlane";
    /// Without a load balancer: the API floating IP points at a running control-plane machine.
    pub const FLOATING_IP_ATTACHED: &str = "FloatingIPAttached";
    /// Without a load balancer: a leaving machine handed the API floating IP to another.
    pub const FLOATING_IP_MOVED: &str = "FloatingIPMoved";
    /// The machine is leaving, but its member is the last ACTIVE one of its pool: held.
    pub const LAST_ACTIVE_MEMBER: &str = "LastActiveMember";
    /// The machine's members are being removed from the API load balancer.
    pub const MEMBER_REMOVING: &str = "MemberRemoving";
    /// Its members are gone from every pool.
    pub const MEMBER_REMOVED: &str = "MemberRemoved";
    /// The server is being built.
    pub const INSTANCE_BUILDING: &str = "InstanceBuilding";
    /// The server is in ERROR (CAPO's reason).
    pub const INSTANCE_ERROR: &str = "InstanceStateError";
    /// The server we created is gone, and nobody asked us to delete it (CAPO's reason).
    pub const INSTANCE_NOT_FOUND: &str = "InstanceNotFound";
    /// The server is DELETED, or being deleted by someone else (CAPO's reason).
    pub const INSTANCE_DELETED: &str = "InstanceDeleted";
    /// The server exists but is not running (SHUTOFF, SUSPENDED, ...; CAPO's reason).
    pub const INSTANCE_NOT_ACTIVE: &str = "InstanceNotReady";
    /// A machine waits for its cluster's infrastructure (CAPO's reason).
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructure";
    /// A machine waits for its bootstrap data (CAPO's reason).
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    /// The cloud refused for lack of quota.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// A volume the server needs is in ERROR.
    pub const VOLUME_ERROR: &str = "VolumeError";
    /// The server waits for its IPAddressClaim to be answered (CAPO's event reason).
    pub const WAITING_FOR_IP_ADDRESS_CLAIM: &str = "WaitingForIPAddressClaim";
}

/// Finalizers, with CAPO's names so that capo-rs adopts the objects CAPO created (and CAPO
/// adopts ours).
pub mod finalizers {
    /// On OpenStackCluster.
    pub const CLUSTER: &str = "openstackcluster.infrastructure.cluster.x-k8s.io";
    /// On OpenStackMachine.
    pub const MACHINE: &str = "openstackmachine.infrastructure.cluster.x-k8s.io";
    /// On OpenStackServer.
    pub const SERVER: &str = "openstackserver.infrastructure.cluster.x-k8s.io";
}

/// The conditions each kind owns, in the order `Ready` reports their causes.
pub mod owned {
    use super::types::*;

    /// OpenStackCluster.
    pub const CLUSTER: &[&str] = &[
        READY,
        PAUSED,
        NETWORK_READY,
        SECURITY_GROUPS_READY,
        API_SERVER_LOAD_BALANCER_READY,
        API_SERVER_LOAD_BALANCER_HEALTHY,
        API_ENDPOINT_READY,
    ];
    /// The OpenStackCluster conditions that make up its `Ready`.
    pub const CLUSTER_READY_FROM: &[&str] = &[
        NETWORK_READY,
        SECURITY_GROUPS_READY,
        API_SERVER_LOAD_BALANCER_READY,
        API_ENDPOINT_READY,
    ];
    /// OpenStackMachine.
    pub const MACHINE: &[&str] = &[
        READY,
        PAUSED,
        INSTANCE_READY,
        API_SERVER_LOAD_BALANCER_MEMBER_READY,
    ];
    /// The OpenStackMachine conditions that make up its `Ready`.
    pub const MACHINE_READY_FROM: &[&str] =
        &[INSTANCE_READY, API_SERVER_LOAD_BALANCER_MEMBER_READY];
    /// OpenStackServer.
    pub const SERVER: &[&str] = &[READY, PAUSED, INSTANCE_READY];
    /// The OpenStackServer conditions that make up its `Ready`.
    pub const SERVER_READY_FROM: &[&str] = &[INSTANCE_READY];
}

/// `metav1.ConditionStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known (yet).
    Unknown,
}

impl Status {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    /// Parses the wire form; anything unexpected counts as Unknown.
    pub fn parse(s: &str) -> Self {
        match s {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// What a controller wants a condition to say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    /// Condition type.
    pub type_: &'a str,
    /// Condition status.
    pub status: Status,
    /// CamelCase reason; always set.
    pub reason: &'a str,
    /// Human-readable detail.
    pub message: String,
}

impl<'a> Desired<'a> {
    /// A condition with the given type, status, reason and message.
    pub fn new(
        type_: &'a str,
        status: Status,
        reason: &'a str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Finds a condition by type.
pub fn find<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Status of a condition by type; Unknown when absent.
pub fn status_of(conditions: &[Condition], type_: &str) -> Status {
    find(conditions, type_).map_or(Status::Unknown, |c| Status::parse(&c.status))
}

/// Sets a condition. `lastTransitionTime` becomes `now` only when the condition is new or
/// its status changes; reason, message and `observedGeneration` are always refreshed.
/// Returns whether anything changed.
///
/// ```
/// use capo_api::conditions::{Desired, Status, reasons, set, types};
/// use k8s_openapi::jiff::Timestamp;
///
/// let mut conditions = Vec::new();
/// let pending = Desired::new(types::API_SERVER_LOAD_BALANCER_READY, Status::False, reasons::MEMBERS_PENDING, "cp-1 PENDING_CREATE");
/// assert!(set(&mut conditions, &pending, Some(1), Timestamp::now()));
/// assert!(!set(&mut conditions, &pending, Some(1), Timestamp::now()), "no change, no write");
/// ```
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: &Desired<'_>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = desired.status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let before = existing.clone();
            if existing.status != status {
                existing.status = status.to_owned();
                existing.last_transition_time = Time(now);
            }
            existing.reason = desired.reason.to_owned();
            existing.message.clone_from(&desired.message);
            existing.observed_generation = generation;
            *existing != before
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_owned(),
                status: status.to_owned(),
                reason: desired.reason.to_owned(),
                message: desired.message.clone(),
                observed_generation: generation,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// Adds every owned condition that is missing as Unknown/`NotYetReconciled`, so a user
/// sees from the first visit which conditions the controller will report. Existing
/// conditions are left as they are. Returns whether anything was added.
pub fn initialize(
    conditions: &mut Vec<Condition>,
    owned: &[&str],
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let mut added = false;
    for type_ in owned {
        if find(conditions, type_).is_none() {
            let desired = Desired::new(
                type_,
                Status::Unknown,
                reasons::NOT_YET_RECONCILED,
                "Waiting for the first reconcile.",
            );
            added |= set(conditions, &desired, generation, now);
        }
    }
    added
}

/// The `Paused` condition for a paused or unpaused object.
pub fn paused(is_paused: bool) -> Desired<'static> {
    if is_paused {
        Desired::new(
            types::PAUSED,
            Status::True,
            reasons::PAUSED,
            "Reconciliation is paused.",
        )
    } else {
        Desired::new(types::PAUSED, Status::False, reasons::NOT_PAUSED, "")
    }
}

/// Summarises `from` into `Ready`: False (with the first False condition's reason and a
/// message naming every False one) if any is False, else Unknown if any is Unknown or
/// missing, else True.
pub fn summarize_ready<'a>(conditions: &'a [Condition], from: &[&str]) -> Desired<'a> {
    let mut first_false: Option<&Condition> = None;
    let mut problems = Vec::new();
    let mut unknown = Vec::new();
    for type_ in from {
        match find(conditions, type_) {
            Some(c) if c.status == "True" => {}
            Some(c) if c.status == "False" => {
                first_false.get_or_insert(c);
                problems.push(describe(c));
            }
            Some(c) => unknown.push(describe(c)),
            None => unknown.push(format!("{type_}: not reported yet")),
        }
    }
    if let Some(cause) = first_false {
        return Desired::new(
            types::READY,
            Status::False,
            &cause.reason,
            problems.join("; "),
        );
    }
    if !unknown.is_empty() {
        return Desired::new(
            types::READY,
            Status::Unknown,
            reasons::NOT_YET_RECONCILED,
            unknown.join("; "),
        );
    }
    Desired::new(types::READY, Status::True, reasons::READY, "")
}

fn describe(c: &Condition) -> String {
    if c.message.is_empty() {
        format!("{}: {}", c.type_, c.reason)
    } else {
        format!("{}: {}", c.type_, c.message)
    }
}

/// Our own spec write moved the object from generation `from` to `to`, and nothing else did:
/// what was observed at `from` is observed at `to`. Saves the pass the write would wake from
/// writing the status again only to move its generations.
pub fn advance_generation(
    conditions: &mut [Condition],
    observed: &mut Option<i64>,
    from: Option<i64>,
    to: Option<i64>,
) {
    let Some(to) = to else {
        return;
    };
    for condition in conditions
        .iter_mut()
        .filter(|c| c.observed_generation == from)
    {
        condition.observed_generation = Some(to);
    }
    if *observed == from {
        *observed = Some(to);
    }
}

/// The status of an object that lacks `status.observedGeneration` is treated as never
/// reconciled, as the CRD default says.
pub fn observed_generation_or_default(observed: Option<i64>) -> i64 {
    observed.unwrap_or(-1)
}

/// What kstatus (sigs.k8s.io/cli-utils), and so Flux, Argo CD and kpt, compute for an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KStatus {
    /// Fully reconciled.
    Current,
    /// Not reconciled yet, or reconciling.
    InProgress(String),
    /// Reconciliation failed (`Stalled` is True).
    Failed(String),
    /// Being deleted.
    Terminating,
}

/// Computes the kstatus of an object in its JSON form, following kstatus's rules for
/// custom resources: deletion first, then `observedGeneration` vs `generation`, then the
/// `Reconciling`, `Stalled` and `Ready` conditions.
///
/// ```
/// use capo_api::conditions::{KStatus, kstatus};
/// // A new object as the API server returns it: generation 1, status defaulted by the CRD.
/// let fresh = serde_json::json!({"metadata": {"generation": 1}, "status": {"observedGeneration": -1}});
/// assert!(matches!(kstatus(&fresh), KStatus::InProgress(_)));
/// ```
pub fn kstatus(object: &Value) -> KStatus {
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        return KStatus::Terminating;
    }
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = object
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed != generation
    {
        return KStatus::InProgress(format!(
            "observed generation {observed}, current generation {generation}"
        ));
    }
    let conditions = object
        .pointer("/status/conditions")
        .and_then(Value::as_array);
    let condition = |type_: &str| {
        conditions?
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    };
    let status_is = |c: &Value, s: &str| c.get("status").and_then(Value::as_str) == Some(s);
    let message = |c: &Value| {
        let reason = c.get("reason").and_then(Value::as_str).unwrap_or_default();
        let message = c.get("message").and_then(Value::as_str).unwrap_or_default();
        format!("{reason}: {message}")
    };
    if let Some(c) = condition("Reconciling").filter(|c| status_is(c, "True")) {
        return KStatus::InProgress(message(c));
    }
    if let Some(c) = condition("Stalled").filter(|c| status_is(c, "True")) {
        return KStatus::Failed(message(c));
    }
    if let Some(c) = condition("Ready").filter(|c| status_is(c, "False")) {
        return KStatus::InProgress(message(c));
    }
    KStatus::Current
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("valid timestamp")
    }

    fn cond(type_: &'static str, status: Status, reason: &'static str) -> Desired<'static> {
        Desired::new(type_, status, reason, "")
    }

    #[test]
    fn set_adds_a_new_condition_with_now_as_transition_time() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            &cond("InstanceReady", Status::False, "InstanceBuilding"),
            Some(3),
            t(0)
        ));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].status, "False");
        assert_eq!(cs[0].reason, "InstanceBuilding");
        assert_eq!(cs[0].observed_generation, Some(3));
        assert_eq!(cs[0].last_transition_time, Time(t(0)));
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut cs = Vec::new();
        set(&mut cs, &cond("X", Status::False, "A"), Some(1), t(0));
        // Same status, new reason and generation: the time stays, the rest updates.
        assert!(set(&mut cs, &cond("X", Status::False, "B"), Some(2), t(10)));
        assert_eq!(cs[0].last_transition_time, Time(t(0)));
        assert_eq!(cs[0].reason, "B");
        assert_eq!(cs[0].observed_generation, Some(2));
        // New status: the time moves.
        assert!(set(
            &mut cs,
            &cond("X", Status::True, "Ready"),
            Some(2),
            t(20)
        ));
        assert_eq!(cs[0].last_transition_time, Time(t(20)));
    }

    #[test]
    fn setting_the_same_condition_again_reports_no_change() {
        let mut cs = Vec::new();
        set(&mut cs, &cond("X", Status::True, "Ready"), Some(1), t(0));
        assert!(!set(
            &mut cs,
            &cond("X", Status::True, "Ready"),
            Some(1),
            t(50)
        ));
        assert_eq!(cs[0].last_transition_time, Time(t(0)));
    }

    #[test]
    fn initialize_writes_every_owned_condition_as_unknown_once() {
        let mut cs = Vec::new();
        set(
            &mut cs,
            &cond(types::INSTANCE_READY, Status::True, "Ready"),
            Some(1),
            t(0),
        );
        assert!(initialize(&mut cs, owned::MACHINE, Some(1), t(5)));
        assert_eq!(cs.len(), owned::MACHINE.len());
        for c in &cs {
            if c.type_ == types::INSTANCE_READY {
                assert_eq!(c.status, "True", "existing conditions are kept");
            } else {
                assert_eq!(
                    (c.status.as_str(), c.reason.as_str()),
                    ("Unknown", reasons::NOT_YET_RECONCILED)
                );
            }
        }
        assert!(
            !initialize(&mut cs, owned::MACHINE, Some(1), t(9)),
            "second visit adds nothing"
        );
    }

    #[test]
    fn paused_condition_says_paused_or_not() {
        assert_eq!(paused(true).status, Status::True);
        assert_eq!(paused(true).reason, reasons::PAUSED);
        assert_eq!(paused(false).status, Status::False);
        assert_eq!(paused(false).reason, reasons::NOT_PAUSED);
    }

    #[test]
    fn ready_is_true_only_when_every_contributor_is_true() {
        let mut cs = Vec::new();
        for type_ in owned::MACHINE_READY_FROM {
            set(&mut cs, &cond(type_, Status::True, "Ready"), Some(1), t(0));
        }
        // Paused and informational conditions do not count.
        set(&mut cs, &paused(true), Some(1), t(0));
        let ready = summarize_ready(&cs, owned::MACHINE_READY_FROM);
        assert_eq!((ready.status, ready.reason), (Status::True, reasons::READY));
    }

    #[test]
    fn ready_is_false_with_the_first_false_reason_and_every_cause_in_the_message() {
        let mut cs = Vec::new();
        set(
            &mut cs,
            &cond(types::NETWORK_READY, Status::True, "Ready"),
            Some(1),
            t(0),
        );
        set(
            &mut cs,
            &cond(
                types::SECURITY_GROUPS_READY,
                Status::Unknown,
                "NotYetReconciled",
            ),
            Some(1),
            t(0),
        );
        let lb = Desired::new(
            types::API_SERVER_LOAD_BALANCER_READY,
            Status::False,
            reasons::MEMBERS_PENDING,
            "m-1 PENDING_CREATE for 40s",
        );
        set(&mut cs, &lb, Some(1), t(0));
        set(
            &mut cs,
            &cond(types::API_ENDPOINT_READY, Status::False, "EndpointMissing"),
            Some(1),
            t(0),
        );
        let ready = summarize_ready(&cs, owned::CLUSTER_READY_FROM);
        assert_eq!(ready.status, Status::False);
        assert_eq!(ready.reason, reasons::MEMBERS_PENDING);
        assert!(
            ready.message.contains("m-1 PENDING_CREATE"),
            "{}",
            ready.message
        );
        assert!(
            ready.message.contains("APIEndpointReady: EndpointMissing"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn ready_is_unknown_while_a_contributor_is_unknown_or_missing() {
        let mut cs = Vec::new();
        set(
            &mut cs,
            &cond(types::INSTANCE_READY, Status::True, "Ready"),
            Some(1),
            t(0),
        );
        let ready = summarize_ready(&cs, owned::MACHINE_READY_FROM);
        assert_eq!(ready.status, Status::Unknown);
        assert!(
            ready
                .message
                .contains(types::API_SERVER_LOAD_BALANCER_MEMBER_READY)
        );
    }

    #[test]
    fn status_of_missing_condition_is_unknown() {
        assert_eq!(status_of(&[], types::READY), Status::Unknown);
        assert_eq!(Status::parse("bogus"), Status::Unknown);
        assert_eq!(Status::from(true), Status::True);
    }

    #[test]
    fn missing_observed_generation_reads_as_minus_one() {
        assert_eq!(observed_generation_or_default(None), -1);
        assert_eq!(observed_generation_or_default(Some(4)), 4);
    }

    #[test]
    fn kstatus_terminating_wins() {
        let obj = json!({"metadata": {"generation": 1, "deletionTimestamp": "2026-01-01T00:00:00Z"},
                         "status": {"observedGeneration": 1}});
        assert_eq!(kstatus(&obj), KStatus::Terminating);
    }

    #[test]
    fn kstatus_in_progress_until_the_generation_is_observed() {
        let obj = json!({"metadata": {"generation": 1}, "status": {"observedGeneration": -1}});
        assert!(matches!(kstatus(&obj), KStatus::InProgress(_)));
        let obj = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": ""}]}});
        assert!(matches!(kstatus(&obj), KStatus::InProgress(_)));
    }

    #[test]
    fn kstatus_without_observed_generation_is_current_which_is_why_the_default_matters() {
        let obj = json!({"metadata": {"generation": 1}});
        assert_eq!(kstatus(&obj), KStatus::Current);
    }

    #[test]
    fn kstatus_reads_reconciling_stalled_and_ready() {
        let with = |type_: &str, status: &str| {
            json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1,
                "conditions": [{"type": type_, "status": status, "reason": "Why", "message": "because"}]}})
        };
        assert!(matches!(
            kstatus(&with("Reconciling", "True")),
            KStatus::InProgress(_)
        ));
        assert_eq!(
            kstatus(&with("Stalled", "True")),
            KStatus::Failed("Why: because".into())
        );
        assert!(matches!(
            kstatus(&with("Ready", "False")),
            KStatus::InProgress(_)
        ));
        assert_eq!(kstatus(&with("Ready", "True")), KStatus::Current);
        assert_eq!(kstatus(&with("Ready", "Unknown")), KStatus::Current);
    }

    #[test]
    fn our_own_spec_write_moves_what_was_observed_to_its_generation() {
        let now = Timestamp::now();
        let mut cs = Vec::new();
        let ready = Desired::new(types::READY, Status::True, "Ready", "");
        set(&mut cs, &ready, Some(4), now);
        let other = Desired::new("Other", Status::True, "Done", "");
        set(&mut cs, &other, Some(3), now);
        let mut observed = Some(4);
        advance_generation(&mut cs, &mut observed, Some(4), Some(5));
        assert_eq!(observed, Some(5));
        assert_eq!(cs[0].observed_generation, Some(5));
        // A condition observed at another generation says so still.
        assert_eq!(cs[1].observed_generation, Some(3));
    }
}
