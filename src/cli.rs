//! The `capo-rs` command line. The process has one tokio runtime, built here for the commands
//! that need one; benchmarks that run on virtual time build their own paused runtimes and do
//! not start it (a running runtime's clock cannot be paused).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use capo_api::crds;
use capo_provider::cloud::CloudOptions;
use capo_provider::manager::LeaderElection;
use capo_provider::membership::ScheduleConfig;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::openstack_args::OpenStackArgs;

/// capo-rs: Cluster API infrastructure provider for OpenStack.
#[derive(Debug, Parser)]
#[command(name = "capo-rs", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as text or as JSON objects (one per line; Cluster API's --logging-format).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to log: a level (error, warn, info, debug, trace) or a filter such as
    /// `info,capo_provider=debug`. A level is capo-rs's own; other crates (the OpenStack SDK,
    /// kube, hyper) stay at warn unless named, as in `debug,openstack_sdk=debug`.
    /// Default: $RUST_LOG, else info (error for the demo).
    #[arg(long, global = true)]
    pub log_level: Option<String>,
    /// Log verbosity as CAPO's `-v`/`--v` (klog): 0-3 info, 4 debug, 5 and more trace, for
    /// capo-rs's own logs. Takes the place of --log-level when both are given (the shipped
    /// manifests pass --log-level).
    #[arg(short = 'v', long = "v", global = true, value_name = "N")]
    pub verbosity: Option<u8>,
}

impl Cli {
    /// The log filter asked for: `-v`'s level, else `--log-level`, else `$RUST_LOG`.
    pub fn asked_log_level(&self) -> Option<String> {
        let from_verbosity = self.verbosity.map(|v| {
            match v {
                0..=3 => "info",
                4 => "debug",
                _ => "trace",
            }
            .to_owned()
        });
        from_verbosity
            .or_else(|| self.log_level.clone())
            .or_else(|| std::env::var("RUST_LOG").ok())
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Cli {
    /// Whether the command draws its own view (logs would tear it).
    /// The demo and the benchmarks that run whole stacks print their own results: their
    /// logs are errors only, unless asked.
    pub fn is_demo(&self) -> bool {
        #[cfg(feature = "demo")]
        if matches!(self.command, Command::Demo(_)) {
            return true;
        }
        #[cfg(feature = "bench")]
        if matches!(
            self.command,
            Command::Bench(
                crate::bench::BenchCommand::RolloutSafety { .. }
                    | crate::bench::BenchCommand::Scale { .. }
            )
        ) {
            return true;
        }
        false
    }
}

/// Subcommands.
// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers against a Kubernetes cluster (the manager).
    ///
    /// Connects with --kubeconfig, else as kubectl does ($KUBECONFIG, ~/.kube/config), else
    /// with the in-cluster service account. Waits until the CRDs are installed, then
    /// reconciles until SIGTERM or SIGINT; a second signal stops at once.
    Run(RunArgs),
    /// Print every CRD as one multi-document YAML stream, or write one file per CRD.
    ///
    /// Refuses (exit code 1) when kube-apiserver would refuse a CRD: a CEL rule over the
    /// cost budget, or one that does not compile.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print every CEL rule's estimated cost against the API server's budget instead.
        #[arg(long, conflicts_with = "out")]
        costs: bool,
    },
    /// Write the install manifests: the kustomize base in deploy/, and clusterctl's
    /// infrastructure-components.yaml and metadata.yaml in deploy/clusterctl/ (with
    /// ${VAR:=default} variables for the tunables). Without --out, print the components.
    Manifests {
        /// Write the files under this directory (the repository's is `deploy`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run a simulator standalone.
    #[cfg(feature = "demo")]
    #[command(subcommand)]
    Sim(crate::dev::SimCommand),
    /// Measurements that print figures.
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Measurements that print figures: not in this build (`--features bench`).
    #[cfg(all(feature = "demo", not(feature = "bench")))]
    #[command(hide = true, disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// capo-rs end to end, in one process, with no cloud: a cluster from a CAPO template
    /// brought up and its control plane rolled on the simulators, with a live view.
    ///
    /// Exit codes: 0 the cluster's API stayed up and nothing leaked; 1 it went down (the API
    /// pool reached zero ACTIVE members, as with --strategy lb-only) or something leaked.
    #[cfg(feature = "demo")]
    Demo(crate::dev::DemoArgs),
    /// Prove the dashboards and alerts on real data: a real Prometheus (Debian's
    /// `prometheus` package) scrapes `capo-rs demo --hold`; every panel query must return
    /// data, the stuck and ERROR alerts must fire, promtool must pass the rules and our
    /// /metrics; the key panels are drawn as PNGs. Exit code 1 when anything fails.
    #[cfg(feature = "demo")]
    ProveDashboards(crate::dev::ProveArgs),
    /// Watch load balancers' members through the membership engine, live.
    ///
    /// Exit codes: 0 every gate Ready (with --until-ready), 2 a member stuck, 3 a member in
    /// ERROR, 4 a load balancer in ERROR, 130 interrupted.
    WatchLb {
        /// clouds.yaml with the credentials.
        #[arg(long, required_unless_present = "noauth_octavia_url")]
        clouds_yaml: Option<PathBuf>,
        /// CA bundle (PEM) for the cloud's endpoints.
        #[arg(long)]
        cacert: Option<PathBuf>,
        /// The cloud's name in clouds.yaml.
        #[arg(long, required_unless_present = "noauth_octavia_url")]
        cloud: Option<String>,
        /// Test stacks only: an Octavia API with `auth_strategy = noauth` at this URL, no
        /// Keystone (requests carry `X-Project-Id` instead of a token).
        #[arg(long, conflicts_with_all = ["clouds_yaml", "cloud", "region", "cacert"])]
        noauth_octavia_url: Option<url::Url>,
        /// With --noauth-octavia-url: the project to act as.
        #[arg(long, default_value = "capo-rs", requires = "noauth_octavia_url")]
        project_id: String,
        /// Overrides the cloud's region.
        #[arg(long)]
        region: Option<String>,
        /// Exit 0 once every load balancer's gate is Ready.
        #[arg(long)]
        until_ready: bool,
        /// Seconds in PENDING_* before a member is stuck.
        #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
        member_stuck_after: u64,
        #[command(flatten)]
        openstack: OpenStackArgs,
        /// Load balancer ids or names.
        #[arg(required = true)]
        load_balancers: Vec<String>,
    },
}

/// `capo-rs run`'s flags.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// kubeconfig file; without it, $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Reconcile objects in this namespace only (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Reconcile only objects labelled cluster.x-k8s.io/watch-filter=VALUE (Cluster API's
    /// --watch-filter).
    #[arg(long)]
    pub watch_filter: Option<String>,
    /// This shard's share of each cloud's OpenStack budget (`--openstack-qps` and
    /// `--openstack-burst` give the whole budget): 0.5 for one of two shards. With
    /// `--leader-elect` it is written on the shard's Lease, and a shard whose share and the
    /// other shards' come to more than 1 stops before calling any cloud.
    #[arg(long, value_parser = capo_provider::manager::shards::parse_share)]
    pub openstack_budget_share: Option<f64>,
    /// OpenStackServers reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackserver_concurrency: u16,
    /// OpenStackClusters reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackcluster_concurrency: u16,
    /// OpenStackMachines reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackmachine_concurrency: u16,
    /// OpenStackMachineTemplates reconciled at once (with the AutoScaleFromZero gate).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackmachinetemplate_concurrency: u16,
    /// CAPO's feature gates, `Name=bool` pairs: PriorityQueue (accepted; no effect on
    /// capo-rs's queue), AutoScaleFromZero (machine templates' capacity for the cluster
    /// autoscaler), AllAlpha, AllBeta. An unknown gate stops the start.
    #[arg(long, default_value = "PriorityQueue=true,AutoScaleFromZero=false",
          value_parser = capo_provider::manager::features::parse_feature_gates)]
    pub feature_gates: capo_provider::manager::features::FeatureGates,
    /// OpenStack sessions (one token each) kept, one per credential; the one used longest
    /// ago goes past it. 0 (or less, as CAPO) keeps none: every reconcile authenticates anew.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub scope_cache_max_size: i64,
    /// A start-up CRD migration phase not to run, repeated for more: StorageVersionMigration
    /// or CleanupManagedFields.
    #[arg(long, value_name = "PHASE",
          value_parser = capo_provider::manager::features::parse_migration_phase)]
    pub skip_crd_migration_phases: Vec<capo_provider::manager::features::MigrationPhase>,
    /// Times a control-plane machine's load balancer member in ERROR is deleted and created
    /// again before the machine reports MemberError for a person to look.
    #[arg(long, default_value_t = 3)]
    pub member_repairs: u32,
    /// How often a settled object is looked at again for drift: 600, 600s, 10m or 1h.
    #[arg(long, default_value = "10m", value_parser = capo_provider::manager::parse_duration)]
    pub sync_period: Duration,
    /// Seconds in PENDING_* before a load balancer member is stuck.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub member_stuck_after: u64,
    /// What releases a control-plane machine: `serving` (its member ACTIVE and its health
    /// monitor reading ONLINE; ACTIVE alone where a pool has no monitor) or `provisioning`
    /// (ACTIVE alone).
    #[arg(long, value_enum, default_value_t = Gate::Serving)]
    pub gate: Gate,
    /// Serving gate: how long a member must read ONLINE without a break (ovn reports a new
    /// member ONLINE before its first check; an amphora starts it UP until a check fails).
    #[arg(long, default_value = "15s", value_parser = capo_provider::manager::parse_duration_or_zero)]
    pub serving_settle: Duration,
    /// Serving gate: how long a member that stopped serving must read ONLINE again without a
    /// break before it counts again (a flapping API is not trusted on its good stretches).
    #[arg(long, default_value = "5m", value_parser = capo_provider::manager::parse_duration_or_zero)]
    pub serving_recovery: Duration,
    /// Serving gate: how long an ACTIVE member may not serve before MemberNotServing holds
    /// its machine with a Warning.
    #[arg(long, default_value = "5m", value_parser = capo_provider::manager::parse_duration)]
    pub member_not_serving_after: Duration,
    /// The API pools' health monitor: `tcp` (CAPO's) or `https` (GET /readyz expecting 200).
    /// An OpenStackCluster's annotation
    /// infrastructure.cluster.x-k8s.io/capo-rs-api-health-monitor overrides it; ovn falls
    /// back to tcp.
    #[arg(long, value_enum, default_value_t = ApiMonitor::Tcp)]
    pub api_health_monitor: ApiMonitor,
    /// How long a leaving control-plane member keeps its open connections at weight 0
    /// before it is deleted (inside the pre-terminate hook); 0 deletes it at once.
    #[arg(long, default_value = "30s", value_parser = capo_provider::manager::parse_duration_or_zero)]
    pub drain_period: Duration,
    /// `reportingInstance` of events, and the start of the leader identity (in a cluster: the
    /// pod's name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,
    /// How long to wait for missing CRDs before exiting with their names (exit code 1); 0
    /// looks once.
    #[arg(long, default_value = "60s", value_parser = capo_provider::manager::parse_duration_or_zero)]
    pub crd_wait: Duration,
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// Where the admin server listens: /metrics, /healthz, /readyz (HOST:PORT, or :PORT for
    /// every address).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = capo_provider::manager::admin::parse_address)]
    pub admin_address: SocketAddr,
    /// Where /metrics is served over HTTPS, to callers whose bearer token the API server
    /// accepts (TokenReview) and allows `get` on /metrics (SubjectAccessReview), as CAPO's
    /// secure diagnostics (HOST:PORT, or :PORT; the manifests use :8443). Off when not given.
    #[arg(long, value_parser = capo_provider::manager::admin::parse_address)]
    pub metrics_address: Option<SocketAddr>,
    /// The directory holding the metrics server's tls.crt and tls.key (read again when they
    /// change); without it, a certificate made at start and signed by itself.
    #[arg(long)]
    pub metrics_cert_dir: Option<std::path::PathBuf>,
    /// Also serve /metrics on the admin address, over plain HTTP, to anyone who reaches it
    /// (local runs; a cluster uses --metrics-address).
    #[arg(long)]
    pub insecure_metrics: bool,
    /// Where the webhook server listens over HTTPS: the CRDs' conversion webhook
    /// (v1beta1 <-> v1beta2) and validating webhooks (HOST:PORT, or :PORT; the manifests use
    /// :9443). Off when not given. Every replica serves it, leading or not.
    #[arg(long, value_parser = capo_provider::manager::admin::parse_address)]
    pub webhook_address: Option<SocketAddr>,
    /// The directory holding the webhook's tls.crt and tls.key (the cert-manager Secret,
    /// mounted); read again whenever the files change.
    #[arg(long, default_value = capo_provider::manager::manifests::WEBHOOK_CERT_DIR)]
    pub webhook_cert_dir: std::path::PathBuf,
    /// Requests per second to the Kubernetes API server (client-go's token bucket).
    #[arg(long, default_value_t = 20.0, value_parser = positive_rate)]
    pub kube_api_qps: f64,
    /// Requests the Kubernetes API server may receive at once before --kube-api-qps applies.
    #[arg(long, default_value_t = NonZeroU32::new(30).unwrap_or(NonZeroU32::MIN))]
    pub kube_api_burst: NonZeroU32,
    #[command(flatten)]
    pub openstack: OpenStackArgs,
}

/// `--gate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Gate {
    Provisioning,
    Serving,
}

/// `--api-health-monitor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiMonitor {
    Tcp,
    Https,
}

/// Leader election flags, as Cluster API's providers name them.
/// The Lease replicas without `--watch-filter` compete for.
const DEFAULT_LEASE: &str = "capo-rs-leader-election";

#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    /// Run the controllers only while holding a coordination.k8s.io Lease, so that several
    /// replicas can run and one works (on in the manifests). `--leader-elect` or
    /// `--leader-elect=true|false`.
    #[arg(long, num_args = 0..=1, default_value_t = false, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// How long a leader's silence lasts before a standby takes over.
    #[arg(long, default_value = "15s", value_parser = capo_provider::manager::parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps failing to renew before it stops (exit code 1).
    #[arg(long, default_value = "10s", value_parser = capo_provider::manager::parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try for the Lease, and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = capo_provider::manager::parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The Lease's name (a shard's default adds its `--watch-filter`).
    #[arg(long, default_value = DEFAULT_LEASE)]
    pub leader_election_id: String,
    /// The Lease's namespace (default: the pod's, else the kubeconfig context's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
}

/// The engine's polls share each endpoint's limiter with the controllers' requests, so they
/// are paced within the same budget (this shard's part of it): a budget raised for a large
/// cloud speeds the looks that gate every cluster and machine, not only the controllers.
/// The settled LBs' background checks keep the defaults' rates (their shares shrink as the
/// budget grows): a larger budget is room for urgent work, not a reason to ask more often.
fn engine_schedule(cloud: &CloudOptions, defaults: &ScheduleConfig) -> ScheduleConfig {
    let budget_qps = f64::from(cloud.rate_limit.qps.get());
    let share_of = |share: f64| share.min(defaults.budget_qps * share / budget_qps);
    ScheduleConfig {
        budget_qps,
        burst: f64::from(cloud.rate_limit.burst.get()),
        drift_share: share_of(defaults.drift_share),
        safety_share: share_of(defaults.safety_share),
        ..defaults.clone()
    }
}

/// A shard's part of each endpoint's budget: the rate and the burst scaled by its share (at
/// least one request each).
fn shared_budget(mut options: CloudOptions, share: Option<f64>) -> CloudOptions {
    let Some(share) = share else {
        return options;
    };
    let scale = |whole: NonZeroU32| {
        let part = (f64::from(whole.get()) * share).floor() as u32;
        NonZeroU32::new(part).unwrap_or(NonZeroU32::MIN)
    };
    options.rate_limit.qps = scale(options.rate_limit.qps);
    options.rate_limit.burst = scale(options.rate_limit.burst);
    options
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a positive number of requests per second"
        )),
    }
}

impl RunArgs {
    fn manager_config(&self) -> anyhow::Result<capo_provider::manager::ManagerConfig> {
        use capo_provider::manager::{ManagerConfig, WatchScope};
        let defaults = ManagerConfig::default();
        let cloud = CloudOptions {
            session_cache_max: usize::try_from(self.scope_cache_max_size).unwrap_or(0),
            ..shared_budget(self.openstack.options()?, self.openstack_budget_share)
        };
        Ok(ManagerConfig {
            scope: WatchScope {
                namespace: self.namespace.clone(),
                // `--watch-filter=` (an empty value) filters nothing.
                watch_filter: self.watch_filter.clone().filter(|value| !value.is_empty()),
            },
            server_concurrency: self.openstackserver_concurrency,
            cluster_concurrency: self.openstackcluster_concurrency,
            machine_concurrency: self.openstackmachine_concurrency,
            template_concurrency: self.openstackmachinetemplate_concurrency,
            features: self.feature_gates,
            skip_migration: self.skip_crd_migration_phases.clone(),
            controllers: capo_provider::controllers::ControllerConfig {
                sync_period: self.sync_period,
                instance: self.instance.clone(),
                member_repairs: self.member_repairs,
                api_monitor: match self.api_health_monitor {
                    ApiMonitor::Tcp => capo_provider::controllers::gate::MonitorKind::Tcp,
                    ApiMonitor::Https => capo_provider::controllers::gate::MonitorKind::Https,
                },
                drain_period: self.drain_period,
                ..defaults.controllers.clone()
            },
            engine: capo_provider::membership::EngineConfig {
                stuck_after: Duration::from_secs(self.member_stuck_after),
                serving: (self.gate == Gate::Serving).then_some(
                    capo_provider::membership::ServingRules {
                        settle: self.serving_settle,
                        recovery: self.serving_recovery,
                        not_serving_after: self.member_not_serving_after,
                    },
                ),
                schedule: engine_schedule(&cloud, &defaults.engine.schedule),
                ..defaults.engine.clone()
            },
            cloud,
            budget_share: self.openstack_budget_share.or(Some(1.0)),
            crd_wait: Some(self.crd_wait),
            ..defaults
        })
    }

    /// The Lease's name: a shard (`--watch-filter`) competes for its own, named after its
    /// filter, unless `--leader-election-id` names one.
    fn lease_name(&self) -> String {
        let id = &self.leader.leader_election_id;
        match self.watch_filter.as_deref().filter(|f| !f.is_empty()) {
            Some(filter) if id == DEFAULT_LEASE => {
                let suffix: String = filter
                    .to_ascii_lowercase()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect();
                format!("{id}-{}", suffix.trim_matches(|c| c == '-' || c == '.'))
            }
            _ => id.clone(),
        }
    }

    /// The Lease to compete for, when asked.
    fn leader_election(
        &self,
        identity: &str,
        default_namespace: &str,
    ) -> anyhow::Result<Option<LeaderElection>> {
        let args = &self.leader;
        if !args.leader_elect {
            return Ok(None);
        }
        let namespace = args
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| default_namespace.to_owned());
        let election = LeaderElection {
            namespace,
            name: self.lease_name(),
            identity: identity.to_owned(),
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
            annotations: std::collections::BTreeMap::from([(
                capo_provider::manager::shards::SHARE_ANNOTATION.to_owned(),
                self.openstack_budget_share.unwrap_or(1.0).to_string(),
            )]),
        };
        election.validate().map_err(anyhow::Error::msg)?;
        Ok(Some(election))
    }
}

/// This process's name for itself: the pod's name (or the host's), made unique.
fn identity(instance: Option<&str>) -> String {
    let base = instance
        .map(str::to_owned)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "capo-rs".to_owned());
    capo_provider::manager::leader::identity(&base)
}

/// `capo-rs run`: the admin server and the manager, until a signal.
async fn run_manager(args: RunArgs) -> anyhow::Result<()> {
    use capo_provider::manager::{self, Health, KubeClientOptions, Phase};
    let identity = identity(args.instance.as_deref());
    let registry = prometheus::Registry::new();
    let options = KubeClientOptions {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        user_agent: format!("capo-rs/{} ({identity})", env!("CARGO_PKG_VERSION")),
        requests: Some(manager::kube_client::KubeRequests::register(&registry)?),
    };
    let client = manager::connect(args.kubeconfig.as_deref(), &options).await?;
    let mut config = args.manager_config()?;
    config.leader_election = args.leader_election(&identity, client.default_namespace())?;
    let health = Arc::new(Health::new(&manager::CONTROLLERS));
    let admin_stop = CancellationToken::new();
    let plain = if args.insecure_metrics {
        manager::admin::PlainMetrics::Served
    } else {
        manager::admin::PlainMetrics::Elsewhere
    };
    let (_, admin) = manager::admin::serve(
        args.admin_address,
        registry.clone(),
        health.clone(),
        plain,
        admin_stop.clone(),
    )
    .await?;
    if let Some(address) = args.metrics_address {
        use manager::metrics_auth::{Gatekeeper, KubeReviews};
        let config = manager::metrics_server::MetricsServerConfig {
            address,
            cert_dir: args.metrics_cert_dir.clone(),
        };
        let gatekeeper = Arc::new(Gatekeeper::new(Arc::new(KubeReviews::new(client.clone()))));
        manager::metrics_server::serve(config, registry.clone(), gatekeeper, admin_stop.clone())
            .await?;
    }
    let _admin_stops_last = admin_stop.clone().drop_guard();
    // Like the admin server, the webhook serves from start to exit, leader or not: the API
    // server needs it to read the version an object is not stored in.
    let webhook = match args.webhook_address {
        None => None,
        Some(address) => {
            let config = manager::webhook::WebhookConfig {
                address,
                cert_dir: args.webhook_cert_dir.clone(),
                reload_every: manager::webhook::CERT_RELOAD_PERIOD,
            };
            let metrics = manager::webhook::WebhookMetrics::register(&registry)?;
            let (_, task) = manager::webhook::serve(
                config,
                metrics,
                manager::webhook::capo_rules::capo_validators(),
                admin_stop.clone(),
            )
            .await?;
            Some(task)
        }
    };
    tracing::info!(%identity, version = env!("CARGO_PKG_VERSION"), "capo-rs starting");
    let shutdown = CancellationToken::new();
    let manager =
        manager::run_with_health(client, config, &registry, health.clone(), shutdown.clone());
    tokio::pin!(manager);
    tokio::select! {
        result = &mut manager => return Ok(result?),
        () = termination() => {}
    }
    tracing::info!(
        "shutting down: reconciles in flight finish first (a second signal stops at once)"
    );
    health.set_phase(Phase::Stopping);
    shutdown.cancel();
    let result = tokio::select! {
        result = manager => result.map_err(anyhow::Error::from),
        () = termination() => Err(anyhow::anyhow!("stopped at once by a second signal")),
    };
    admin_stop.cancel();
    let _ = admin.await;
    if let Some(webhook) = webhook {
        let _ = webhook.await;
    }
    result
}

/// SIGTERM or SIGINT.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The process's tokio runtime.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// Runs a parsed command; the process's exit code.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => {
            runtime()?.block_on(run_manager(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds { out, costs } => {
            write_crds(out, costs)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Manifests { out } => {
            write_manifests(out)?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "bench")]
        Command::Bench(command) => crate::bench::bench(command, runtime),
        #[cfg(all(feature = "demo", not(feature = "bench")))]
        Command::Bench { .. } => {
            eprintln!(
                "Error: this capo-rs was built without the benchmarks; build it with them: \
                 cargo run --release --features bench -- bench ..."
            );
            Ok(ExitCode::from(2))
        }
        #[cfg(feature = "demo")]
        Command::Sim(command) => runtime()?.block_on(crate::dev::sim(command)),
        #[cfg(feature = "demo")]
        Command::Demo(args) => runtime()?.block_on(crate::dev::demo(args)),
        #[cfg(feature = "demo")]
        Command::ProveDashboards(args) => runtime()?.block_on(crate::dev::prove_dashboards(args)),
        Command::WatchLb {
            clouds_yaml,
            cacert,
            cloud,
            noauth_octavia_url,
            project_id,
            region,
            until_ready,
            member_stuck_after,
            openstack,
            load_balancers,
        } => {
            let target = match (noauth_octavia_url, clouds_yaml, cloud) {
                (Some(url), _, _) => crate::watch_lb::Target::NoAuthOctavia { url, project_id },
                (None, Some(clouds_yaml), Some(cloud)) => crate::watch_lb::Target::Cloud {
                    clouds_yaml,
                    cacert,
                    cloud,
                    region,
                },
                _ => anyhow::bail!("give --clouds-yaml and --cloud (or --noauth-octavia-url)"),
            };
            let args = crate::watch_lb::WatchArgs {
                target,
                load_balancers,
                until_ready,
                stuck_after: Duration::from_secs(member_stuck_after),
                options: openstack.options()?,
            };
            let code = runtime()?.block_on(crate::watch_lb::watch(args))?;
            Ok(ExitCode::from(code))
        }
    }
}

fn write_manifests(out: Option<PathBuf>) -> anyhow::Result<()> {
    let crds_yaml = crds::to_multi_yaml(&crds::all())?;
    let files = capo_provider::manager::manifests::files(&crds_yaml);
    let Some(dir) = out else {
        let components = files
            .iter()
            .find(|(path, _)| path.ends_with("infrastructure-components.yaml"))
            .map(|(_, text)| text.as_str())
            .unwrap_or_default();
        print!("{components}");
        return Ok(());
    };
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn write_crds(out: Option<PathBuf>, costs: bool) -> anyhow::Result<()> {
    let all = crds::all();
    let refused: Vec<String> = all.iter().flat_map(crds::lint).collect();
    if !refused.is_empty() {
        anyhow::bail!(
            "kube-apiserver would refuse these CRDs:\n{}",
            refused.join("\n")
        );
    }
    match (out, costs) {
        (_, true) => print!("{}", crds::cost_table(&all)),
        (None, false) => print!("{}", crds::to_multi_yaml(&all)?),
        (Some(dir), false) => {
            for path in crds::write_dir(&all, &dir)? {
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<RunArgs, clap::Error> {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            run: RunArgs,
        }
        let argv = std::iter::once("capo-rs").chain(flags.iter().copied());
        Wrapper::try_parse_from(argv).map(|w| w.run)
    }

    fn run_args(flags: &[&str]) -> RunArgs {
        parse(flags).expect("flags parse")
    }

    #[test]
    fn a_shard_competes_for_its_own_lease_and_takes_its_share_of_the_budget() {
        assert_eq!(run_args(&[]).lease_name(), DEFAULT_LEASE);
        let shard = run_args(&[
            "--watch-filter",
            "Team_A",
            "--openstack-budget-share",
            "0.25",
        ]);
        assert_eq!(shard.lease_name(), "capo-rs-leader-election-team-a");
        let named = run_args(&["--watch-filter", "a", "--leader-election-id", "mine"]);
        assert_eq!(named.lease_name(), "mine");
        let mut whole = CloudOptions::default();
        whole.rate_limit.qps = NonZeroU32::new(100).expect("non-zero");
        whole.rate_limit.burst = NonZeroU32::new(200).expect("non-zero");
        let part = shared_budget(whole.clone(), shard.openstack_budget_share);
        assert_eq!(
            (part.rate_limit.qps.get(), part.rate_limit.burst.get()),
            (25, 50)
        );
        let tiny = shared_budget(whole, Some(0.001));
        assert_eq!(tiny.rate_limit.qps.get(), 1, "never below one request");
        let refused = parse(&["--openstack-budget-share", "1.5"]).expect_err("over the whole");
        assert!(refused.to_string().contains("(0, 1]"), "{refused}");
    }

    #[test]
    fn the_engine_polls_within_the_budget_the_process_is_given() {
        let budget = |flags: &[&str]| {
            let config = run_args(flags).manager_config().expect("a config");
            let schedule = &config.engine.schedule;
            (schedule.budget_qps, schedule.burst)
        };
        assert_eq!(budget(&[]), (10.0, 20.0), "the defaults, as before");
        let raised = ["--openstack-qps", "100", "--openstack-burst", "200"];
        assert_eq!(budget(&raised), (100.0, 200.0));
        let shard = [&raised[..], &["--openstack-budget-share", "0.25"]].concat();
        assert_eq!(budget(&shard), (25.0, 50.0), "a shard's part of it");
        let background = |flags: &[&str]| {
            let config = run_args(flags).manager_config().expect("a config");
            let s = config.engine.schedule;
            (s.budget_qps * s.drift_share, s.budget_qps * s.safety_share)
        };
        let (drift, safety) = background(&[]);
        let (raised_drift, raised_safety) = background(&raised);
        assert!(
            (raised_drift - drift).abs() < 1e-9,
            "drift checks no more often"
        );
        assert!(
            (raised_safety - safety).abs() < 1e-9,
            "safety trees no more often"
        );
        let small = background(&["--openstack-qps", "4"]);
        assert!(
            small.0 < drift,
            "a smaller budget keeps its shares: {small:?}"
        );
    }

    #[test]
    fn capos_flags_take_capos_values_and_act() {
        use capo_provider::manager::features::MigrationPhase;
        let defaults = run_args(&[]).manager_config().expect("a config");
        assert!(!defaults.features.auto_scale_from_zero, "off, as CAPO's");
        assert_eq!(defaults.cloud.session_cache_max, 10);
        let capo = run_args(&[
            "--feature-gates=PriorityQueue=false,AutoScaleFromZero=true",
            "--openstackmachinetemplate-concurrency=3",
            "--scope-cache-max-size=-1",
            "--skip-crd-migration-phases=StorageVersionMigration",
            "--skip-crd-migration-phases=CleanupManagedFields",
        ])
        .manager_config()
        .expect("a config");
        assert!(capo.features.auto_scale_from_zero && !capo.features.priority_queue);
        assert_eq!(capo.template_concurrency, 3);
        assert_eq!(capo.cloud.session_cache_max, 0);
        assert_eq!(capo.skip_migration, MigrationPhase::ALL);
        let unknown = parse(&["--feature-gates=MachinePool=true"]).expect_err("not CAPO's");
        assert!(
            unknown
                .to_string()
                .contains("unrecognized feature gate: MachinePool"),
            "{unknown}"
        );
        assert!(parse(&["--skip-crd-migration-phases=All"]).is_err());
    }

    #[test]
    fn klogs_verbosity_is_a_level() {
        let level = |argv: &[&str]| {
            let argv = std::iter::once("capo-rs").chain(argv.iter().copied());
            Cli::try_parse_from(argv).map(|cli| cli.asked_log_level())
        };
        assert_eq!(
            level(&["-v=2", "crds"]).ok().flatten().as_deref(),
            Some("info")
        );
        assert_eq!(
            level(&["crds", "--v", "4"]).ok().flatten().as_deref(),
            Some("debug")
        );
        assert_eq!(
            level(&["crds", "-v", "6"]).ok().flatten().as_deref(),
            Some("trace")
        );
        assert_eq!(
            level(&["crds", "--log-level=info", "--v=4"])
                .ok()
                .flatten()
                .as_deref(),
            Some("debug"),
            "-v added to the shipped manifests, which pass --log-level"
        );
    }
}
