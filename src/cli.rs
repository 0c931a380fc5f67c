//! The `capo-rs` command line. The process has one tokio runtime, built here for the commands
//! that need one; benchmarks that run on virtual time build their own paused runtimes and do
//! not start it (a running runtime's clock cannot be paused).

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use capo_api::crds;
use capo_provider::cloud::{CloudOptions, PathOptions, RateLimit};
use clap::{Parser, Subcommand};

/// capo-rs: Cluster API infrastructure provider for OpenStack.
#[derive(Debug, Parser)]
#[command(name = "capo-rs", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Whether the command draws its own view (logs would tear it).
    pub fn is_demo(&self) -> bool {
        #[cfg(feature = "dev-tools")]
        if matches!(self.command, Command::Demo(_)) {
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
    /// Run a simulator standalone.
    #[cfg(feature = "dev-tools")]
    #[command(subcommand)]
    Sim(crate::dev::SimCommand),
    /// Measurements that print figures.
    #[cfg(feature = "dev-tools")]
    #[command(subcommand)]
    Bench(crate::dev::BenchCommand),
    /// capo-rs end to end, in one process, with no cloud: a cluster from a CAPO template
    /// brought up and its control plane rolled on the simulators, with a live view.
    ///
    /// Exit codes: 0 the cluster's API stayed up and nothing leaked; 1 it went down (the API
    /// pool reached zero ACTIVE members, as with --strategy lb-only) or something leaked.
    #[cfg(feature = "dev-tools")]
    Demo(crate::dev::DemoArgs),
    /// Prove the dashboards and alerts on real data: a real Prometheus (Debian's
    /// `prometheus` package) scrapes `capo-rs demo --hold`; every panel query must return
    /// data, the stuck and ERROR alerts must fire, promtool must pass the rules and our
    /// /metrics; the key panels are drawn as PNGs. Exit code 1 when anything fails.
    #[cfg(feature = "dev-tools")]
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
    /// OpenStackServers reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackserver_concurrency: u16,
    /// OpenStackClusters reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackcluster_concurrency: u16,
    /// OpenStackMachines reconciled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
    pub openstackmachine_concurrency: u16,
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
    /// `reportingInstance` of events (in a cluster: the pod's name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,
    #[command(flatten)]
    pub openstack: OpenStackArgs,
}

impl RunArgs {
    fn manager_config(&self) -> capo_provider::manager::ManagerConfig {
        use capo_provider::manager::{ManagerConfig, WatchScope};
        let defaults = ManagerConfig::default();
        ManagerConfig {
            scope: WatchScope {
                namespace: self.namespace.clone(),
                watch_filter: self.watch_filter.clone(),
            },
            server_concurrency: self.openstackserver_concurrency,
            cluster_concurrency: self.openstackcluster_concurrency,
            machine_concurrency: self.openstackmachine_concurrency,
            controllers: capo_provider::controllers::ControllerConfig {
                sync_period: self.sync_period,
                instance: self.instance.clone(),
                member_repairs: self.member_repairs,
                ..defaults.controllers.clone()
            },
            engine: capo_provider::membership::EngineConfig {
                stuck_after: Duration::from_secs(self.member_stuck_after),
                ..defaults.engine.clone()
            },
            cloud: self.openstack.options(),
            ..defaults
        }
    }
}

/// `capo-rs run`: the manager until a signal.
async fn run_manager(args: RunArgs) -> anyhow::Result<()> {
    let client = capo_provider::manager::connect(args.kubeconfig.as_deref()).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let registry = prometheus::Registry::new();
    let manager =
        capo_provider::manager::run(client, args.manager_config(), &registry, shutdown.clone());
    tokio::pin!(manager);
    tokio::select! {
        result = &mut manager => return Ok(result?),
        () = termination() => {}
    }
    tracing::info!(
        "shutting down: reconciles in flight finish first (a second signal stops at once)"
    );
    shutdown.cancel();
    tokio::select! {
        result = manager => Ok(result?),
        () = termination() => anyhow::bail!("stopped at once by a second signal"),
    }
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

/// How politely we talk to OpenStack; shared by every command that does.
#[derive(Clone, Debug, clap::Args)]
pub struct OpenStackArgs {
    /// Requests per second to each OpenStack endpoint (auth URL, region and service).
    #[arg(long, default_value_t = NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN))]
    pub openstack_qps: NonZeroU32,
    /// Requests an endpoint may receive at once before the per-second rate applies.
    #[arg(long, default_value_t = NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN))]
    pub openstack_burst: NonZeroU32,
    /// Seconds to wait for one OpenStack answer.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub openstack_timeout: u64,
}

impl OpenStackArgs {
    /// The cloud options these flags describe.
    pub fn options(&self) -> CloudOptions {
        let defaults = CloudOptions::default();
        CloudOptions {
            rate_limit: RateLimit {
                qps: self.openstack_qps,
                burst: self.openstack_burst,
            },
            path: PathOptions {
                request_timeout: Duration::from_secs(self.openstack_timeout),
                ..defaults.path.clone()
            },
            ..defaults
        }
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
        #[cfg(feature = "dev-tools")]
        Command::Bench(command) => crate::dev::bench(command, runtime),
        #[cfg(feature = "dev-tools")]
        Command::Sim(command) => runtime()?.block_on(crate::dev::sim(command)),
        #[cfg(feature = "dev-tools")]
        Command::Demo(args) => runtime()?.block_on(crate::dev::demo(args)),
        #[cfg(feature = "dev-tools")]
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
                options: openstack.options(),
            };
            let code = runtime()?.block_on(crate::watch_lb::watch(args))?;
            Ok(ExitCode::from(code))
        }
    }
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
