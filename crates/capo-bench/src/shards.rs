//! `bench scale --shards N`: N `capo-rs run` processes, each a shard as users run one (its own
//! `--watch-filter`, its own Lease, `--openstack-budget-share 1/N` of one cloud's budget),
//! against one simulated cloud. The clusters are labelled for the shards in turn and brought
//! up with their machines. The run then checks what sharding promises: together the shards
//! never go over the cloud's budget, and every object is written by exactly one shard, the
//! one its label names.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt as _;
use serde::Serialize;
use serde_json::Value;

use crate::scale::{
    ScaleConfig, Stage, bring_up, create_cluster, free_port, per_service_seconds, proc_sample,
    start_actor, start_controller, wait_clusters_provisioned, wait_ready, windows_over_the_budget,
};

#[derive(Clone, Debug, Default, Serialize)]
pub struct ShardReport {
    pub shards: u32,
    pub clusters: u32,
    pub machines: u64,
    pub bring_up_seconds: f64,
    /// OpenStack requests per cluster created (before any machine), all shards together.
    pub openstack_requests_per_cluster_created: f64,
    /// The most requests to one service in one second, all shards together, and what the
    /// cloud's whole budget allows in one.
    pub openstack_peak_per_second: u64,
    pub openstack_budget_per_second: u64,
    /// Windows (1-60 s) in which the shards together sent one service more than the whole
    /// budget's token bucket allows, summed over services.
    pub openstack_windows_over_budget: u64,
    /// Our objects some replica wrote, and how many of them more than one shard wrote, or a
    /// shard other than the one their label names.
    pub objects_written: u64,
    pub objects_written_by_several_shards: u64,
    pub objects_written_by_another_shard: u64,
    /// Each shard's RSS at the end and its peak.
    pub rss_bytes_by_shard: BTreeMap<String, (u64, u64)>,
}

fn shard_name(index: u32) -> String {
    format!("shard-{index}")
}

/// Which shard a cluster goes to: in turn.
fn shard_of(cluster_index: u32, shards: u32) -> String {
    shard_name(cluster_index % shards.max(1))
}

pub async fn run(
    config: ScaleConfig,
    shards: u32,
    say: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<ShardReport> {
    // Each shard's requests come from the simulated API server's log, by client.
    anyhow::ensure!(
        config.kube_tier.is_none(),
        "--shards needs the simulated API server (no --kube-tier)"
    );
    let stage = Stage::start(&config).await?;
    let share = format!("{}", 1.0 / f64::from(shards.max(1)));
    let mut controllers = Vec::new();
    for index in 0..shards {
        let name = shard_name(index);
        let admin = free_port()?;
        let extra: Vec<String> = [
            "--watch-filter",
            &name,
            "--openstack-budget-share",
            &share,
            "--leader-elect",
            "--instance",
            &name,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process_name: &'static str = Box::leak(name.clone().into_boxed_str());
        let process = start_controller(
            &config,
            &stage.kubeconfig,
            admin,
            &stage.dir,
            process_name,
            &extra,
        )?;
        wait_ready(&stage.http, admin).await?;
        controllers.push((name, process));
    }
    say(&format!(
        "{shards} shards leading, each with {share} of the budget"
    ));

    let started = Instant::now();
    let before = stage.sims.requests().await?;
    let names: Vec<(String, String)> = (0..config.clusters)
        .map(|i| (crate::scale::cluster_name(i), shard_of(i, shards)))
        .collect();
    futures::stream::iter(names.iter())
        .map(|(name, shard)| create_cluster(&stage.client, name, Some(shard)))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    wait_clusters_provisioned(&stage.client, config.clusters).await?;
    let clusters_up = stage.sims.requests().await?;
    let per_cluster =
        (clusters_up.openstack - before.openstack) / f64::from(config.clusters.max(1));
    say(&format!(
        "{} clusters provisioned, {per_cluster:.1} OpenStack requests each",
        config.clusters
    ));
    let actor = start_actor(&stage.client);
    let clusters: Vec<String> = names.iter().map(|(name, _)| name.clone()).collect();
    bring_up(&actor, &clusters, &config).await?;
    let bring_up_seconds = started.elapsed().as_secs_f64();
    say(&format!("machines up in {bring_up_seconds:.0} s"));
    actor.stop().await;

    let mut report = ShardReport {
        shards,
        clusters: config.clusters,
        machines: u64::from(config.clusters) * u64::from(config.control_plane + config.workers),
        bring_up_seconds,
        openstack_requests_per_cluster_created: per_cluster,
        ..ShardReport::default()
    };
    for (name, process) in &controllers {
        let sample = proc_sample(process.pid()?);
        report
            .rss_bytes_by_shard
            .insert(name.clone(), (sample.rss, sample.peak_rss.max(sample.rss)));
    }
    let log = stage
        .sims
        .get(format!("{}/_sim/requests", stage.sims.openstack_url))
        .await?;
    let per_service = per_service_seconds(&log["per_service_second"]);
    report.openstack_peak_per_second = per_service
        .values()
        .flat_map(|seconds| seconds.values().copied())
        .max()
        .unwrap_or(0);
    report.openstack_budget_per_second = u64::from(config.openstack_qps + config.openstack_burst);
    report.openstack_windows_over_budget = windows_over_the_budget(&per_service, &config);
    let kube = stage
        .sims
        .get(format!(
            "{}/_sim/requests",
            stage
                .sims
                .kube_url
                .as_deref()
                .context("shards run on the simulated API server")?
        ))
        .await?;
    let labelled: BTreeMap<&str, &str> = names
        .iter()
        .map(|(cluster, shard)| (cluster.as_str(), shard.as_str()))
        .collect();
    count_writers(&mut report, &kube["writers_by_object"], &labelled);
    for (_, process) in controllers {
        process.terminate().await?;
    }
    let _ = std::fs::remove_dir_all(&stage.dir);
    Ok(report)
}

/// Who wrote each of our objects: one shard each, the one its cluster was labelled for. An
/// object's cluster is the longest cluster name its own name begins with (the objects of
/// cluster `c` are named `c`, `c-control-plane-…`, `c-md-0-…`).
fn count_writers(report: &mut ShardReport, writers: &Value, labelled: &BTreeMap<&str, &str>) {
    let Some(writers) = writers.as_object() else {
        return;
    };
    for (object, by) in writers {
        let instances: BTreeSet<&str> = by
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let shards: BTreeSet<&str> = instances
            .into_iter()
            .filter(|i| i.starts_with("shard-"))
            .collect();
        if shards.is_empty() {
            continue;
        }
        report.objects_written += 1;
        if shards.len() > 1 {
            report.objects_written_by_several_shards += 1;
        }
        let name = object.rsplit('/').next().unwrap_or_default();
        let owner = labelled
            .iter()
            .filter(|(cluster, _)| name == **cluster || name.starts_with(&format!("{cluster}-")))
            .max_by_key(|(cluster, _)| cluster.len())
            .map(|(_, shard)| *shard);
        if owner.is_some_and(|owner| shards.iter().any(|s| *s != owner)) {
            report.objects_written_by_another_shard += 1;
        }
    }
}

impl ShardReport {
    pub fn print(&self) {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        println!(
            "{} shards, {} clusters, {} machines; bring-up {:.0} s",
            self.shards, self.clusters, self.machines, self.bring_up_seconds
        );
        println!("\n{:<52} {:>12} {:>10}", "figure", "measured", "target");
        println!(
            "{:<52} {:>12} {:>10}",
            "windows over the cloud's budget (all shards)", self.openstack_windows_over_budget, "0"
        );
        println!(
            "{:<52} {:>12} {:>10}",
            "peak requests to one service in 1 s (all shards)",
            self.openstack_peak_per_second,
            format!("<= {}", self.openstack_budget_per_second)
        );
        println!(
            "{:<52} {:>12} {:>10}",
            "objects written by more than one shard", self.objects_written_by_several_shards, "0"
        );
        println!(
            "{:<52} {:>12} {:>10}",
            "objects written by a shard not labelled for them",
            self.objects_written_by_another_shard,
            "0"
        );
        println!(
            "{:<52} {:>12}",
            "objects written (OpenStackClusters, -Machines, -Servers)", self.objects_written
        );
        println!(
            "{:<52} {:>12.1}",
            "OpenStack requests per cluster created", self.openstack_requests_per_cluster_created
        );
        for (shard, (rss, peak)) in &self.rss_bytes_by_shard {
            println!(
                "  {shard}: RSS {:.1} MiB, peak {:.1} MiB",
                mib(*rss),
                mib(*peak)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clusters_go_to_the_shards_in_turn() {
        let shards: Vec<String> = (0..4).map(|i| shard_of(i, 2)).collect();
        assert_eq!(shards, ["shard-0", "shard-1", "shard-0", "shard-1"]);
    }

    #[test]
    fn an_object_written_by_two_shards_or_the_wrong_one_is_counted() {
        let labelled = BTreeMap::from([("scale-0001", "shard-1"), ("scale-0010", "shard-0")]);
        let writers = json!({
            "openstackclusters default/scale-0001": ["shard-1"],
            "openstackmachines default/scale-0010-md-0-abcde": ["shard-1"],
            "openstackservers default/scale-0001-control-plane-x": ["shard-0", "shard-1"],
            "openstackclusters default/other": ["test-client"],
        });
        let mut report = ShardReport::default();
        count_writers(&mut report, &writers, &labelled);
        assert_eq!(report.objects_written, 3);
        assert_eq!(report.objects_written_by_several_shards, 1);
        assert_eq!(report.objects_written_by_another_shard, 2);
    }
}
