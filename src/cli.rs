//! The `capo-rs` command line.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::api::crds;
use crate::bench::membership::BenchConfig;
use crate::cloud::{CloudOptions, PathOptions, RateLimit};
use crate::membership::{ScheduleConfig, Strategy};
use crate::sim::kube::{KubeSim, KubeSimConfig};
use crate::sim::openstack::{OpenStackSim, OpenStackSimConfig, Scenario};

/// capo-rs: Cluster API infrastructure provider for OpenStack.
#[derive(Debug, Parser)]
#[command(name = "capo-rs", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
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
    #[command(subcommand)]
    Sim(SimCommand),
    /// Measurements that print figures.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Watch load balancers' members through the membership engine, live.
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
        #[arg(long, default_value_t = 600)]
        member_stuck_after: u64,
        #[command(flatten)]
        openstack: OpenStackArgs,
        /// Load balancer ids or names.
        #[arg(required = true)]
        load_balancers: Vec<String>,
    },
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Cost of the OpenStack request path per call, without the network.
    RequestPath {
        /// Calls per measurement.
        #[arg(long, default_value_t = 100_000)]
        calls: u32,
    },
    /// Control-plane rollouts against the simulated cloud, once per membership strategy.
    Membership {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 1000)]
        clusters: u32,
        /// Control-plane members per cluster.
        #[arg(long, default_value_t = 3)]
        members: u32,
        /// Seconds over which rollouts start.
        #[arg(long, default_value_t = 3600)]
        window: u64,
        /// Engine budget: requests per second to the cloud endpoint.
        #[arg(long, default_value_t = 20)]
        qps: u32,
        #[arg(long, default_value_t = 40)]
        burst: u32,
        /// Seconds in PENDING_* before a member is stuck.
        #[arg(long, default_value_t = 600)]
        stuck_after: u64,
        #[arg(long, default_value_t = 0.05)]
        slow_share: f64,
        #[arg(long, default_value_t = 0.01)]
        stuck_share: f64,
        #[arg(long, default_value_t = 0.01)]
        error_share: f64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Status-tree: seconds between polls of an LB with something pending.
        #[arg(long, default_value_t = 1.5)]
        urgent_interval: f64,
        /// Status-tree: seconds a pending state is polled at that interval before backing off.
        #[arg(long, default_value_t = 180.0)]
        urgent_fresh: f64,
        /// Status-tree: shortest drift interval for settled LBs, in seconds.
        #[arg(long, default_value_t = 300.0)]
        drift_min: f64,
        /// Strategies to run, comma-separated.
        #[arg(
            long,
            default_value = "status-tree,member-get,lb-only",
            value_delimiter = ','
        )]
        strategies: Vec<String>,
    },
    /// The engine at steady state: memory and CPU of tracking settled load balancers.
    MembershipSteady {
        #[arg(long, default_value_t = 1000)]
        load_balancers: u32,
        #[arg(long, default_value_t = 3)]
        members: u32,
        /// Seconds of (virtual) steady state to measure.
        #[arg(long, default_value_t = 3600)]
        seconds: u64,
        #[arg(long, default_value_t = 20)]
        qps: u32,
    },
    /// The simulated Octavia at scale: memory and status-tree GET time in-process.
    SimStatusTree {
        #[arg(long, default_value_t = 1000)]
        load_balancers: u32,
        #[arg(long, default_value_t = 3)]
        members: u32,
        /// Status-tree GETs to time.
        #[arg(long, default_value_t = 10_000)]
        gets: u32,
    },
    /// Paces concurrent calls through one endpoint's limiter (real time) and reports the
    /// achieved rate and the largest burst seen.
    RateLimit {
        /// Calls to make, all at once.
        #[arg(long, default_value_t = 200)]
        requests: u32,
        #[command(flatten)]
        openstack: OpenStackArgs,
    },
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
    #[arg(long, default_value_t = 30)]
    pub openstack_timeout: u64,
}

impl OpenStackArgs {
    pub fn options(&self) -> CloudOptions {
        let defaults = CloudOptions::default();
        CloudOptions {
            rate_limit: RateLimit {
                qps: self.openstack_qps,
                burst: self.openstack_burst,
            },
            path: PathOptions {
                request_timeout: Duration::from_secs(self.openstack_timeout.max(1)),
                ..defaults.path.clone()
            },
            ..defaults
        }
    }
}

/// Simulators.
#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// A simulated Kubernetes API server (plain HTTP), for kubectl and controllers.
    Kube {
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: SocketAddr,
        /// Write a kubeconfig for the server to this file.
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
        /// Install capo-rs's CRDs at start.
        #[arg(long)]
        with_crds: bool,
    },
    /// A simulated OpenStack (Keystone, Nova, Neutron, Glance, Octavia) on one port.
    Openstack {
        /// Address to listen on (port 0 picks a free port).
        #[arg(long, default_value = "127.0.0.1:5000")]
        listen: SocketAddr,
        /// Write a clouds.yaml for the simulator (clouds `sim` and `sim-appcred`) to this file.
        #[arg(long)]
        clouds_yaml_out: Option<PathBuf>,
        /// Timings and faults to start with (YAML or JSON; see the README).
        #[arg(long)]
        scenario: Option<PathBuf>,
    },
}

/// Runs a parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds { out, costs } => {
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
        }
        Command::Sim(SimCommand::Kube {
            listen,
            kubeconfig_out,
            with_crds,
        }) => run_kube_sim(listen, kubeconfig_out, with_crds)?,
        Command::Sim(SimCommand::Openstack {
            listen,
            clouds_yaml_out,
            scenario,
        }) => run_openstack_sim(listen, clouds_yaml_out, scenario)?,
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
            let code = crate::watch_lb::run(crate::watch_lb::WatchArgs {
                target,
                load_balancers,
                until_ready,
                stuck_after: Duration::from_secs(member_stuck_after),
                options: openstack.options(),
            })?;
            std::process::exit(code);
        }
        Command::Bench(BenchCommand::RequestPath { calls }) => {
            crate::bench::request_path::run(calls.max(1))?.print();
        }
        Command::Bench(BenchCommand::Membership {
            json,
            clusters,
            members,
            window,
            qps,
            burst,
            stuck_after,
            slow_share,
            stuck_share,
            error_share,
            seed,
            urgent_interval,
            urgent_fresh,
            drift_min,
            strategies,
        }) => {
            let strategies = strategies
                .iter()
                .map(|s| s.parse::<Strategy>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!(e))?;
            let config = BenchConfig {
                clusters: clusters.max(1),
                members: members.max(1),
                window: Duration::from_secs(window),
                qps: qps.max(1),
                burst: burst.max(1),
                stuck_after: Duration::from_secs(stuck_after),
                slow_share,
                stuck_share,
                error_share,
                seed,
                schedule: ScheduleConfig {
                    urgent_initial: Duration::from_secs_f64(urgent_interval.max(0.05)),
                    urgent_fresh: Duration::from_secs_f64(urgent_fresh.max(0.0)),
                    drift_min: Duration::from_secs_f64(drift_min.max(1.0)),
                    ..ScheduleConfig::default()
                },
                ..BenchConfig::default()
            };
            let reports = crate::bench::membership::run(&config, &strategies)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"config": config, "results": reports})
                    )?
                );
            } else {
                crate::bench::membership::print_table(&config, &reports);
            }
        }
        Command::Bench(BenchCommand::MembershipSteady {
            load_balancers,
            members,
            seconds,
            qps,
        }) => {
            let report = crate::bench::membership::steady(
                load_balancers.max(1),
                members,
                seconds.max(1),
                qps.max(1),
            )?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Bench(BenchCommand::SimStatusTree {
            load_balancers,
            members,
            gets,
        }) => {
            crate::bench::sim_status_tree::run(load_balancers.max(1), members, gets.max(1))?
                .print();
        }
        Command::Bench(BenchCommand::RateLimit {
            requests,
            openstack,
        }) => {
            crate::bench::request_path::rate_limit(requests.max(1), openstack.options())?.print();
        }
    }
    Ok(())
}

fn run_kube_sim(
    listen: SocketAddr,
    kubeconfig_out: Option<PathBuf>,
    with_crds: bool,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let config = KubeSimConfig {
            listen,
            ..KubeSimConfig::default()
        };
        let sim = KubeSim::start(config).await?;
        if with_crds {
            let crds: Vec<serde_json::Value> = crds::all()
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            sim.install(&crds)?;
        }
        match kubeconfig_out {
            Some(path) => {
                std::fs::write(&path, sim.kubeconfig())?;
                eprintln!("kubeconfig written to {}", path.display());
            }
            None => eprintln!("serving on {}", sim.url()),
        }
        tokio::signal::ctrl_c().await?;
        sim.shutdown().await;
        Ok(())
    })
}

fn run_openstack_sim(
    listen: SocketAddr,
    clouds_yaml_out: Option<PathBuf>,
    scenario: Option<PathBuf>,
) -> anyhow::Result<()> {
    let scenario = match scenario {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            Scenario::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Scenario::default(),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let config = OpenStackSimConfig {
            listen,
            scenario,
            ..OpenStackSimConfig::default()
        };
        let sim = OpenStackSim::start(config).await?;
        if let Some(path) = clouds_yaml_out {
            std::fs::write(&path, sim.clouds_yaml())?;
            eprintln!("clouds.yaml written to {}", path.display());
        }
        eprintln!(
            "simulated OpenStack on {} (Keystone: {})",
            sim.url(),
            sim.auth_url()
        );
        tokio::signal::ctrl_c().await?;
        sim.shutdown().await;
        Ok(())
    })
}
