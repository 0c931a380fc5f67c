//! `capo-rs bench sim-status-tree`: the simulated Octavia's cost at scale. Builds N load
//! balancers with M members each in-process (virtual time), then times status-tree GETs through
//! the simulator's request handling (no TCP) and reports the memory the cloud took.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use capo_provider::cloud::octavia::{MemberSpec, ProvisioningStatus};
use capo_provider::cloud::{CloudClient, CloudOptions, Clouds, RateLimit};
use capo_sim::openstack::{Delay, OpenStackSim, OpenStackSimConfig, Scenario, Timings};

#[derive(Debug)]
pub struct Report {
    pub load_balancers: u32,
    pub members_each: u32,
    pub build: Duration,
    pub resident_growth_bytes: Option<u64>,
    pub gets: u32,
    /// Per status-tree GET through the typed client and the in-process session.
    pub via_client: Duration,
}

impl Report {
    pub fn print(&self) {
        println!(
            "simulated Octavia with {} load balancers x {} members:",
            self.load_balancers, self.members_each
        );
        println!("  built in {:.2} s (wall)", self.build.as_secs_f64());
        match self.resident_growth_bytes {
            Some(bytes) => println!(
                "  resident memory grew by {:.1} MiB",
                bytes as f64 / 1048576.0
            ),
            None => println!("  resident memory: not available on this platform"),
        }
        let per = self.via_client.as_secs_f64() * 1e6 / f64::from(self.gets);
        println!(
            "  status-tree GET, in-process through the cloud client: {per:.1} us (mean of {})",
            self.gets
        );
    }
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

pub fn run(load_balancers: u32, members_each: u32, gets: u32) -> anyhow::Result<Report> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    runtime.block_on(async move {
        let instant = Delay::Fixed(0.01);
        let scenario = Scenario {
            seed: Some(1),
            timings: Timings {
                lb_create: instant.clone(),
                lb_update: instant.clone(),
                child_create: instant.clone(),
                member_create: instant.clone(),
                ..Timings::default()
            },
            ..Scenario::default()
        };
        let sim = OpenStackSim::start(OpenStackSimConfig {
            scenario,
            ..OpenStackSimConfig::default()
        })
        .await?;
        let mut options = CloudOptions::default();
        let unlimited =
            std::num::NonZeroU32::new(1_000_000_000).unwrap_or(std::num::NonZeroU32::MAX);
        options.rate_limit = RateLimit {
            qps: unlimited,
            burst: unlimited,
        };
        let registry = prometheus::Registry::new();
        let clouds = Clouds::new(options, &registry, CancellationToken::new())?;
        let client = clouds.client(sim.session());
        let before = resident_bytes();
        let started = Instant::now();
        let mut lbs = Vec::new();
        for i in 0..load_balancers {
            lbs.push(build_one(&client, i, members_each).await?);
        }
        let build = started.elapsed();
        let resident_growth_bytes = before
            .zip(resident_bytes())
            .map(|(b, a)| a.saturating_sub(b));
        let started = Instant::now();
        for n in 0..gets {
            let lb = &lbs[(n as usize) % lbs.len().max(1)];
            client.octavia().status_tree(lb).await?;
        }
        let via_client = started.elapsed();
        Ok(Report {
            load_balancers,
            members_each,
            build,
            resident_growth_bytes,
            gets,
            via_client,
        })
    })
}

async fn build_one(client: &CloudClient, i: u32, members: u32) -> anyhow::Result<String> {
    let octavia = client.octavia();
    let (lb, pool) = capo_sim::support::api_load_balancer(client, &format!("lb-{i}")).await?;
    for m in 0..members {
        let address = format!("10.{}.{}.{}", i / 250 % 250, i % 250, m + 2);
        octavia
            .create_member(&pool, &MemberSpec::new(format!("m{m}"), address, 6443))
            .await?;
        capo_sim::support::settle(client, &lb).await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let tree = octavia.status_tree(&lb).await?;
    anyhow::ensure!(
        tree.listeners
            .iter()
            .flat_map(|l| &l.pools)
            .flat_map(|p| &p.members)
            .all(|m| m.provisioning_status == ProvisioningStatus::Active),
        "members of lb-{i} did not settle"
    );
    Ok(lb)
}
