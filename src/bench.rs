//! `capo-rs bench`: the measurements that print figures, built only with the `bench` feature
//! (`cargo run --release --features bench -- bench ...`): a newcomer's first build, and the
//! production build, carry none of this code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use capo_bench::Strategy;
use capo_bench::membership::BenchConfig;
use capo_provider::membership::ScheduleConfig;
use clap::Subcommand;

use crate::dev::demo_strategy;
use crate::openstack_args::OpenStackArgs;
/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Randomized whole-stack rollouts on virtual time (controllers, engine, Cluster API
    /// actor, both simulators), eight safety invariants checked at every write and every cloud
    /// transition. Run i plays seed SEED+i; exits 1 on any violation.
    RolloutSafety {
        /// How many runs (the default takes about 14 minutes on 2 cores).
        #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        /// The first run's seed; `--runs 1 --seed S` replays the run of seed S.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Runs at once, one thread each (default: the machine's cores).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        threads: Option<u16>,
        /// `status-tree` (capo-rs: status trees and the serving gate), `provisioning` (capo-rs
        /// with --gate=provisioning) or `lb-only` (trusting the load balancer's status):
        /// the last two show the violations the checker finds then.
        #[arg(long, default_value = "status-tree", value_parser = demo_strategy)]
        strategy: Strategy,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// `capo-rs run` in its own process against both simulators in theirs: N clusters of
    /// control-plane and worker machines brought up, a share rolled, the controller
    /// restarted; its memory, CPU, reconcile times and requests against the targets.
    Scale {
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        clusters: u32,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        control_plane: u32,
        #[arg(long, default_value_t = 3)]
        workers: u32,
        /// Share of the clusters whose control plane is rolled.
        #[arg(long, default_value_t = 0.1, value_parser = share)]
        rollout_share: f64,
        /// The controller's OpenStack budget (its `--openstack-qps` and `--openstack-burst`).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        openstack_qps: u32,
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
        openstack_burst: u32,
        /// Reconciles at once, per kind.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..))]
        concurrency: u16,
        /// Seconds of steady state measured.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        steady: u64,
        /// Run the controller as this many shards (processes with `--watch-filter`, each with
        /// its share of the budget), the clusters labelled for them in turn: checks that the
        /// shards stay within the cloud's budget together and that each object has one shard.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        shards: u32,
        /// The controller to measure: a `capo-rs` binary (the production build, say), or a
        /// wrapper that execs one with its arguments. Default: this binary.
        #[arg(long)]
        controller: Option<PathBuf>,
        /// A real Kubernetes tier's run directory (`tests/kube/up.sh`'s CAPO_KUBE_RUN) in
        /// place of the simulated API server: the controller runs with its ServiceAccount's
        /// token. Give the bench a tier of its own; its objects stay.
        #[arg(long)]
        kube_tier: Option<PathBuf>,
        /// Restarts per `PriorityQueue` setting at the end, alternating on and off (the
        /// figure "a change during the restart", with the gate on and off).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
        priority_restarts: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Memory per stored object, by kind: each kind's objects (shaped as `bench scale` makes
    /// them) decoded, trimmed and stored as the manager's watches do, in a process of its own.
    StoreMemory {
        /// Objects stored per kind.
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
        objects: u32,
        /// Measure this kind only, in this process, and print bytes per object.
        #[arg(long)]
        kind: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Memory of the engine's per-cluster and per-LB series (gate, reason, members,
    /// counters): kept as plain rows, as the engine keeps them, against prometheus's `*Vec`s,
    /// each in a process of its own; both must scrape the same text.
    SeriesMemory {
        /// Clusters, one load balancer each.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        clusters: u32,
        /// Members per load balancer.
        #[arg(long, default_value_t = 6)]
        members: u32,
        /// Measure this layout only (`rows` or `vecs`), in this process, and print JSON.
        #[arg(long)]
        layout: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The webhook's latency per review (one object per ConversionReview, as the API server
    /// sends them; one AdmissionReview per update), over HTTPS and, for conversions, in process.
    Webhook {
        /// Reviews measured per case (four conversions: two kinds, two directions; two
        /// admissions: an update sent in each version).
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(10..))]
        requests: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Cost of the OpenStack request path per call, without the network.
    RequestPath {
        /// Calls per measurement.
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
        calls: u32,
    },
    /// Control-plane rollouts against the simulated cloud, once per membership strategy.
    Membership {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        clusters: u32,
        /// Control-plane members per cluster.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        members: u32,
        /// Seconds over which rollouts start.
        #[arg(long, default_value_t = 3600)]
        window: u64,
        /// Engine budget: requests per second to the cloud endpoint.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        qps: u32,
        #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
        burst: u32,
        /// Seconds in PENDING_* before a member is stuck.
        #[arg(long, default_value_t = 600)]
        stuck_after: u64,
        /// Share of members that take 120 s.
        #[arg(long, default_value_t = 0.05, value_parser = share)]
        slow_share: f64,
        /// Share of members that get stuck.
        #[arg(long, default_value_t = 0.01, value_parser = share)]
        stuck_share: f64,
        /// Share of members that go ERROR.
        #[arg(long, default_value_t = 0.01, value_parser = share)]
        error_share: f64,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Status-tree: seconds between polls of an LB with something pending (at least 0.05).
        #[arg(long, default_value_t = ScheduleConfig::default().urgent_initial.as_secs_f64(), value_parser = poll_interval)]
        urgent_interval: f64,
        /// Status-tree: seconds a pending state is polled at that interval before backing off.
        #[arg(long, default_value_t = 180.0, value_parser = seconds)]
        urgent_fresh: f64,
        /// Status-tree: shortest drift interval for settled LBs, in seconds (at least 1).
        #[arg(long, default_value_t = 300.0, value_parser = drift_interval)]
        drift_min: f64,
        /// Octavia's own order: an LB stays locked until its new member settles (the default
        /// scenario is the race, where members outlast their LB's unlock).
        #[arg(long)]
        octavia_ordered: bool,
        /// Status-tree: the detection lag to aim at, in seconds: polls of pending work, and
        /// lists while an LB is locked, this far apart (overrides --urgent-interval).
        #[arg(long, value_parser = poll_interval)]
        detection_target: Option<f64>,
        /// Status-tree: poll every LB on its own, as before the LB list was used.
        #[arg(long)]
        no_list: bool,
        /// Run status-tree once per detection target (seconds, comma-separated) and member-get
        /// once, and print requests per transition against lag p99.
        #[arg(long, value_delimiter = ',', value_parser = poll_interval)]
        pareto: Vec<f64>,
        /// Strategies to run, comma-separated.
        #[arg(
            long,
            default_value = "status-tree,member-get,lb-only",
            value_delimiter = ','
        )]
        strategies: Vec<Strategy>,
    },
    /// The engine at steady state: memory and CPU of tracking settled load balancers.
    MembershipSteady {
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        load_balancers: u32,
        #[arg(long, default_value_t = 3)]
        members: u32,
        /// Seconds of (virtual) steady state to measure.
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
        seconds: u64,
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
        qps: u32,
        /// Poll every LB on its own, as before the LB list was used.
        #[arg(long)]
        no_list: bool,
        /// Members deleted behind the engine's back during the stretch (drift detection).
        #[arg(long, default_value_t = 20)]
        drifts: u32,
    },
    /// The simulated Octavia at scale: memory and status-tree GET time in-process.
    SimStatusTree {
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        load_balancers: u32,
        #[arg(long, default_value_t = 3)]
        members: u32,
        /// Status-tree GETs to time.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
        gets: u32,
    },
    /// The OpenStackServer controller end to end (real time, simulated Kubernetes and
    /// OpenStack): reconciles and OpenStack requests per server created and deleted.
    Servers {
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        servers: u32,
        /// Ports per server.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        ports: u32,
        /// Boot each server from a Cinder root volume.
        #[arg(long)]
        root_volume: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        openstack: OpenStackArgs,
    },
    /// Paces concurrent calls through one endpoint's limiter (real time) and reports the
    /// achieved rate and the largest burst seen.
    RateLimit {
        /// Calls to make, all at once.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
        requests: u32,
        #[command(flatten)]
        openstack: OpenStackArgs,
    },
}

fn parse_at_least(text: &str, min: f64, what: &str) -> Result<f64, String> {
    let value: f64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if value.is_finite() && value >= min {
        Ok(value)
    } else {
        Err(format!("{what} must be at least {min}, not {text}"))
    }
}

fn share(text: &str) -> Result<f64, String> {
    let value = parse_at_least(text, 0.0, "a share")?;
    if value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("a share is at most 1, not {text}"))
    }
}

fn seconds(text: &str) -> Result<f64, String> {
    parse_at_least(text, 0.0, "a duration")
}

fn poll_interval(text: &str) -> Result<f64, String> {
    parse_at_least(text, 0.05, "the poll interval")
}

fn drift_interval(text: &str) -> Result<f64, String> {
    parse_at_least(text, 1.0, "the drift interval")
}

/// Runs a benchmark. The virtual-time ones run on their own paused runtimes; the others on
/// the process runtime `runtime` builds.
pub fn bench(
    command: BenchCommand,
    runtime: fn() -> std::io::Result<tokio::runtime::Runtime>,
) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::RolloutSafety {
            runs,
            seed,
            threads,
            strategy,
            json,
        } => return rollout_safety(runs, seed, threads, strategy, json),
        BenchCommand::Scale {
            clusters,
            control_plane,
            workers,
            rollout_share,
            openstack_qps,
            openstack_burst,
            concurrency,
            steady,
            shards,
            controller,
            kube_tier,
            priority_restarts,
            json,
        } => {
            let binary = std::env::current_exe()?;
            let config = capo_bench::scale::ScaleConfig {
                controller: controller.unwrap_or_else(|| binary.clone()),
                binary,
                clusters,
                control_plane,
                workers,
                rollout_share,
                openstack_qps,
                openstack_burst,
                concurrency,
                steady: Duration::from_secs(steady),
                kube_tier,
                priority_restarts,
            };
            let say = |line: &str| eprintln!("scale: {line}");
            if shards > 1 {
                let report = runtime()?.block_on(capo_bench::shards::run(config, shards, &say))?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    report.print();
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = runtime()?.block_on(capo_bench::scale::run(config, &say))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                report.print();
            }
        }
        BenchCommand::RequestPath { calls } => {
            runtime()?
                .block_on(capo_bench::request_path::run(calls))?
                .print();
        }
        BenchCommand::Membership {
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
            octavia_ordered,
            detection_target,
            no_list,
            pareto,
            strategies,
        } => {
            let config = BenchConfig {
                octavia_ordered,
                clusters,
                members,
                window: Duration::from_secs(window),
                qps,
                burst,
                stuck_after: Duration::from_secs(stuck_after),
                slow_share,
                stuck_share,
                error_share,
                seed,
                schedule: capo_bench::membership::aim_at(
                    ScheduleConfig {
                        urgent_initial: Duration::from_secs_f64(urgent_interval),
                        urgent_fresh: Duration::from_secs_f64(urgent_fresh),
                        drift_min: Duration::from_secs_f64(drift_min),
                        list_sweep: !no_list,
                        ..ScheduleConfig::default()
                    },
                    detection_target,
                ),
                floor_lag: detection_target.unwrap_or(BenchConfig::default().floor_lag),
                ..BenchConfig::default()
            };
            if !pareto.is_empty() {
                let points = capo_bench::membership::pareto(&config, &pareto)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&points)?);
                } else {
                    capo_bench::membership::print_pareto(&config, &points);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let reports = capo_bench::membership::run(&config, &strategies)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"config": config, "results": reports})
                    )?
                );
            } else {
                capo_bench::membership::print_table(&config, &reports);
            }
        }
        BenchCommand::MembershipSteady {
            load_balancers,
            members,
            seconds,
            qps,
            no_list,
            drifts,
        } => {
            let report = capo_bench::membership::steady(
                load_balancers,
                members,
                seconds,
                qps,
                !no_list,
                drifts,
            )?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        BenchCommand::SimStatusTree {
            load_balancers,
            members,
            gets,
        } => {
            capo_bench::sim_status_tree::run(load_balancers, members, gets)?.print();
        }
        BenchCommand::Servers {
            servers,
            ports,
            root_volume,
            json,
            openstack,
        } => {
            let config = capo_bench::servers::ServersConfig {
                servers,
                ports,
                root_volume,
                timeout: Duration::from_secs(600),
                cloud: openstack.options()?,
            };
            let report = runtime()?.block_on(capo_bench::servers::run(config))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                report.print();
            }
        }
        BenchCommand::StoreMemory {
            objects,
            kind,
            json,
        } => {
            if let Some(kind) = kind {
                println!(
                    "{}",
                    capo_bench::store_memory::measure_here(&kind, objects)?
                );
                return Ok(ExitCode::SUCCESS);
            }
            let figures = capo_bench::store_memory::run(&std::env::current_exe()?, objects)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&figures)?);
            } else {
                capo_bench::store_memory::print(&figures);
            }
        }
        BenchCommand::SeriesMemory {
            clusters,
            members,
            layout,
            json,
        } => {
            if let Some(layout) = layout {
                println!(
                    "{}",
                    capo_bench::series_memory::measure_here(&layout, clusters, members)?
                );
                return Ok(ExitCode::SUCCESS);
            }
            let binary = std::env::current_exe()?;
            let figures = capo_bench::series_memory::run(&binary, clusters, members)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&figures)?);
            } else {
                capo_bench::series_memory::print(&figures);
            }
        }
        BenchCommand::Webhook { requests, json } => {
            let results = runtime()?.block_on(capo_bench::webhook::run(requests as usize))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            } else {
                capo_bench::webhook::print(&results);
            }
        }
        BenchCommand::RateLimit {
            requests,
            openstack,
        } => {
            runtime()?
                .block_on(capo_bench::request_path::rate_limit(
                    requests,
                    openstack.options()?,
                ))?
                .print();
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn rollout_safety(
    runs: u64,
    seed: u64,
    threads: Option<u16>,
    strategy: Strategy,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let threads = threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let config = capo_bench::safety::SafetyConfig {
        runs,
        seed,
        threads,
        strategy,
    };
    // One line per tenth of the runs, on stderr, so that a long run shows it is alive.
    let step = (runs / 10).max(1);
    let progress = move |done: u64, total: u64| {
        if done.is_multiple_of(step) || done == total {
            eprintln!("rollout-safety: {done}/{total} runs played");
        }
    };
    let report = capo_bench::safety::run(&config, &progress);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(if report.violation_count() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
