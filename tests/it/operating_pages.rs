//! The operating pages' reads (`docs/troubleshooting.md`, `alerts.md`, `events.md`,
//! `conditions.md`) pasted as a user pastes them, their placeholders (`NS`, `NAME`, `LB_ID`,
//! `POOL_ID`, `MEMBER_ID`) filled in, by bash with kubectl and the `openstack` client, against a
//! cluster capo-rs runs on the real tiers: each must succeed and print what the page says it
//! shows. What needs capo-rs's pods (its logs, its Lease, its admin port) is marked on the pages
//! as not run: the test tiers run no pods.

use std::path::Path;

use regex::Regex;

use crate::book::{book_block, paste};

/// Where the reads run: the API server, the cloud, and the objects the placeholders name.
pub(crate) struct Reads<'a> {
    /// An admin kubeconfig of the real API server the cluster is on.
    pub(crate) kubeconfig: &'a Path,
    /// The real tier's clouds.yaml, and the cloud the cluster's credentials name.
    pub(crate) clouds_yaml: &'a Path,
    pub(crate) cloud: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) cluster: &'a str,
    /// A control-plane machine whose member is ACTIVE, its member and the member's pool.
    pub(crate) machine: &'a str,
    pub(crate) member: &'a str,
    pub(crate) pool: &'a str,
    pub(crate) lb: &'a str,
}

impl Reads<'_> {
    /// `block` with its placeholders filled in; `NAME` is `name`.
    fn filled(&self, block: &str, name: &str) -> String {
        let placeholder = Regex::new(r"\b(NS|NAME|LB_ID|POOL_ID|MEMBER_ID)\b").unwrap();
        placeholder
            .replace_all(block, |c: &regex::Captures| match &c[1] {
                "NS" => self.namespace.to_owned(),
                "NAME" => name.to_owned(),
                "LB_ID" => self.lb.to_owned(),
                "POOL_ID" => self.pool.to_owned(),
                _ => self.member.to_owned(),
            })
            .into_owned()
    }

    /// Pastes `block` filled in, in a shell with kubectl and the `openstack` client on its PATH.
    async fn paste(&self, block: &str, name: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let venv = std::env::var("CAPO_OPENSTACK_VENV")
            .unwrap_or_else(|_| "/var/cache/capo-rs/openstack-venv".to_owned());
        let kubectl = std::env::var("CAPO_REAL_KUBE_BIN")
            .expect("CAPO_REAL_KUBE_BIN (tests/kube/up.sh prints it)");
        let env = [
            ("HOME", dir.path().display().to_string()),
            ("KUBECONFIG", self.kubeconfig.display().to_string()),
            (
                "PATH",
                format!(
                    "{venv}/bin:{kubectl}:{}",
                    std::env::var("PATH").unwrap_or_default()
                ),
            ),
            (
                "OS_CLIENT_CONFIG_FILE",
                self.clouds_yaml.display().to_string(),
            ),
            ("OS_CLOUD", self.cloud.to_owned()),
        ];
        paste(&self.filled(block, name), dir.path(), &env).await
    }
}

/// Runs every read of the operating pages against `at`; what each printed must name what the
/// page says it shows.
pub(crate) async fn the_operating_pages_reads(at: &Reads<'_>) {
    let (machine, cluster) = (at.machine, at.cluster);
    let shown = |page: &str, out: &str, wanted: &[&str]| {
        for word in wanted {
            assert!(
                out.contains(word),
                "docs/{page}: the read shows no {word}:\n{out}"
            );
        }
    };

    // Troubleshooting: the objects, a machine's conditions and events, the members as
    // capo-rs saw them, and Octavia's own view of the member and the load balancer.
    let out = at
        .paste(
            &book_block("troubleshooting.md", "kubectl get osm -n NS -o wide"),
            machine,
        )
        .await;
    shown(
        "troubleshooting.md",
        &out,
        &[cluster, machine, "Ready", "openstack:///"],
    );
    let out = at
        .paste(
            &book_block(
                "troubleshooting.md",
                "kubectl get osc -n NS NAME -o jsonpath='{.status.apiServerManagedLoadBalancer.id}{\"\\n\"}{range .status.apiServerManagedLoadBalancer.members[*]}{.name}{\"\\t\"}{.port}{\"\\t\"}{.id}{\"\\t\"}{.provisioningStatus}{\"\\t\"}{.operatingStatus}{\"\\t\"}{.since}{\"\\n\"}{end}'",
            ),
            cluster,
        )
        .await;
    shown("troubleshooting.md", &out, &[at.lb, at.member, "ACTIVE"]);
    let out = at
        .paste(
            &book_block(
                "troubleshooting.md",
                "openstack loadbalancer status show LB_ID",
            ),
            cluster,
        )
        .await;
    shown("troubleshooting.md", &out, &[at.member, at.lb, "ACTIVE"]);
    let out = at
        .paste(
            &book_block(
                "troubleshooting.md",
                "kubectl get osm -n NS NAME -o jsonpath='{.metadata.annotations.infrastructure\\.cluster\\.x-k8s\\.io/capo-rs-lb-member-repairs}{\"\\n\"}'",
            ),
            machine,
        )
        .await;
    shown("troubleshooting.md", &out, &[at.member, at.lb]);
    let out = at
        .paste(
            &book_block(
                "troubleshooting.md",
                "kubectl get osc -n NS NAME -o jsonpath='{.status.apiServerManagedLoadBalancer.id}{\"\\n\"}'",
            ),
            cluster,
        )
        .await;
    shown("troubleshooting.md", &out, &[at.lb, "ACTIVE"]);
    let out = at
        .paste(
            &book_block(
                "troubleshooting.md",
                "kubectl get osc -n NS NAME -o jsonpath='{.spec.controlPlaneEndpoint}{\"\\n\"}{.status.apiServerManagedLoadBalancer.ip}{\" \"}{.status.apiServerManagedLoadBalancer.internalIP}{\"\\n\"}{.status.apiServerManagedLoadBalancer.allowedCIDRs}{\"\\n\"}'",
            ),
            cluster,
        )
        .await;
    shown("troubleshooting.md", &out, &["\"host\"", "6443"]);

    // Alerts: the gate and the members as the objects report them, then Octavia's tree.
    let out = at
        .paste(
            &book_block(
                "alerts.md",
                "kubectl -n NS get openstackcluster,openstackmachine -o wide",
            ),
            cluster,
        )
        .await;
    shown("alerts.md", &out, &[cluster, machine, at.member, "True "]);
    let out = at
        .paste(
            &book_block(
                "alerts.md",
                "LB=$(kubectl -n NS get openstackcluster NAME -o jsonpath='{.status.apiServerManagedLoadBalancer.id}')",
            ),
            cluster,
        )
        .await;
    shown("alerts.md", &out, &[at.lb, at.member, "ACTIVE"]);

    // Events and conditions: a machine's events, capo-rs's warnings, one reason everywhere,
    // and a machine's conditions one per line.
    at.paste(
        &book_block(
            "events.md",
            "kubectl get events -n NS --field-selector involvedObject.kind=OpenStackMachine,involvedObject.name=NAME",
        ),
        machine,
    )
    .await;
    let out = at
        .paste(
            &book_block(
                "conditions.md",
                "kubectl get osm -n NS NAME -o jsonpath='{range .status.conditions[*]}{.type}{\"\\t\"}{.status}{\"\\t\"}{.reason}{\"\\t\"}{.message}{\"\\n\"}{end}'",
            ),
            machine,
        )
        .await;
    shown(
        "conditions.md",
        &out,
        &["Ready\tTrue", "APIServerLoadBalancerMemberReady"],
    );
}
