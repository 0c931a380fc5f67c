//! The subcommands that run the simulators and the demo (`sim`, `demo`, `prove-dashboards`),
//! built only with the default `demo` feature: the production build carries none of this code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use capo_api::crds;
use capo_demo::Strategy;
use capo_sim::kube::{KubeSim, KubeSimConfig};
use capo_sim::openstack::{OpenStackSim, OpenStackSimConfig, Scenario};
use clap::Subcommand;

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
        /// Install capo-rs's CRDs at start, and minimal Cluster API Cluster and Machine CRDs
        /// (a management cluster has Cluster API's own).
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
        /// Timings and faults to start with (YAML or JSON; see docs/sim-openstack.md).
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// Also create a project network, `private` (subnet `private-subnet`, 10.0.0.0/24), as
        /// DevStack does.
        #[arg(long)]
        tenant_network: bool,
    },
}

/// `capo-rs demo`'s flags.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// `status-tree` (capo-rs: each member's own provisioning_status) or `lb-only` (trusting
    /// the load balancer's status, never the member's).
    #[arg(long, default_value = "status-tree", value_parser = demo_strategy)]
    strategy: Strategy,
    /// Divides every timing of the story: 2 (the default) plays it in about a minute and a
    /// half, 1 in about two and a half.
    #[arg(long, default_value_t = 2.0, value_parser = demo_speed)]
    speed: f64,
    /// Serve /metrics on 127.0.0.1 at this port (0 picks a free one).
    #[arg(long, default_value_t = 9184)]
    metrics_port: u16,
    /// Keep running (and serving /metrics) after the story, until Ctrl-C, so that
    /// Prometheus can scrape it.
    #[arg(long)]
    hold: bool,
    /// Use this cluster's API instead of the embedded simulator (the cloud stays
    /// simulated). The demo installs missing CRDs and works in namespace capo-rs-demo.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Plain log lines instead of the live view, even on a terminal.
    #[arg(long)]
    plain: bool,
}

pub(crate) fn demo_strategy(text: &str) -> Result<Strategy, String> {
    match text.parse::<Strategy>()? {
        Strategy::MemberGet => {
            Err("status-tree, provisioning or lb-only, not member-get".to_owned())
        }
        strategy => Ok(strategy),
    }
}

fn demo_speed(text: &str) -> Result<f64, String> {
    let speed: f64 = text.parse().map_err(|e| format!("{e}"))?;
    capo_demo::Pace::new(speed).map(|pace| pace.speed())
}

/// Plays the demo; its exit code says whether the cluster's API stayed up.
pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let config = capo_demo::DemoConfig {
        strategy: args.strategy,
        pace: capo_demo::Pace::new(args.speed).map_err(anyhow::Error::msg)?,
        metrics_listen: SocketAddr::from(([127, 0, 0, 1], args.metrics_port)),
        kubeconfig: args.kubeconfig,
        plain: args.plain,
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let interrupted = shutdown.clone();
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupted.cancel();
        }
    });
    let running = tokio::select! {
        running = capo_demo::run(config, shutdown.clone()) => running?,
        () = shutdown.cancelled() => anyhow::bail!("interrupted"),
    };
    println!("\n{}", running.summary.render());
    if args.hold {
        println!(
            "{} (exit code {}); /metrics on http://{}/metrics until Ctrl-C",
            capo_demo::prove::HOLDING,
            running.summary.exit_code(),
            running.metrics.addr
        );
        shutdown.cancelled().await;
    }
    signals.abort();
    Ok(ExitCode::from(running.summary.exit_code()))
}

/// `capo-rs prove-dashboards`' flags.
#[derive(Debug, clap::Args)]
pub struct ProveArgs {
    /// Where the pictures go.
    #[arg(long, default_value = "docs/img")]
    out: PathBuf,
    /// The demo's speed (see `capo-rs demo --speed`).
    #[arg(long, default_value_t = 1.0, value_parser = demo_speed)]
    speed: f64,
    #[arg(long, default_value = "prometheus")]
    prometheus: PathBuf,
    #[arg(long, default_value = "promtool")]
    promtool: PathBuf,
    /// A TrueType font for the pictures.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the proof; exit code 1 when any part of it fails.
pub async fn prove_dashboards(args: ProveArgs) -> anyhow::Result<ExitCode> {
    let config = capo_demo::prove::ProveConfig {
        capo_rs: std::env::current_exe()?,
        prometheus: args.prometheus,
        promtool: args.promtool,
        speed: args.speed,
        pictures: args.out,
        font: args.font,
    };
    let report = capo_demo::prove::prove(&config).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs a simulator until interrupted.
pub async fn sim(command: SimCommand) -> anyhow::Result<ExitCode> {
    match command {
        SimCommand::Kube {
            listen,
            kubeconfig_out,
            with_crds,
        } => run_kube_sim(listen, kubeconfig_out, with_crds).await?,
        SimCommand::Openstack {
            listen,
            clouds_yaml_out,
            scenario,
            tenant_network,
        } => run_openstack_sim(listen, clouds_yaml_out, scenario, tenant_network).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_kube_sim(
    listen: SocketAddr,
    kubeconfig_out: Option<PathBuf>,
    with_crds: bool,
) -> anyhow::Result<()> {
    let config = KubeSimConfig {
        listen,
        ..KubeSimConfig::default()
    };
    let sim = KubeSim::start(config).await?;
    if with_crds {
        let crds: Vec<serde_json::Value> = crds::all()
            .iter()
            .chain(capo_api::capi::crds().iter())
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
}

async fn run_openstack_sim(
    listen: SocketAddr,
    clouds_yaml_out: Option<PathBuf>,
    scenario: Option<PathBuf>,
    tenant_network: bool,
) -> anyhow::Result<()> {
    let scenario = match scenario {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            Scenario::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Scenario::default(),
    };
    let config = OpenStackSimConfig {
        listen,
        scenario,
        settings: capo_sim::openstack::CloudSettings {
            tenant_network,
            ..Default::default()
        },
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
}
