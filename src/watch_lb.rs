//! `capo-rs watch-lb`: the membership engine against a real cloud (or `capo-rs sim openstack`),
//! printing each member's transitions and the gate's verdict as they happen.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use capo_provider::cloud::octavia::LoadBalancerFilter;
use capo_provider::cloud::{
    CloudClient, CloudCredentials, CloudError, CloudOptions, Clouds, NoAuthSession, Service,
};
use capo_provider::membership::{
    DesiredLb, DesiredMember, Engine, EngineConfig, MemberVerdictKind, Notice, ObjectName, Reason,
    ScheduleConfig,
};

/// Where the load balancers live.
#[derive(Debug)]
pub enum Target {
    Cloud {
        clouds_yaml: PathBuf,
        cacert: Option<PathBuf>,
        cloud: String,
        region: Option<String>,
    },
    /// A test stack's Octavia with `auth_strategy = noauth`: no Keystone, a project header.
    NoAuthOctavia { url: url::Url, project_id: String },
}

#[derive(Debug)]
pub struct WatchArgs {
    pub target: Target,
    pub load_balancers: Vec<String>,
    pub until_ready: bool,
    pub stuck_after: Duration,
    pub options: CloudOptions,
}

async fn connect(clouds: &Clouds, target: &Target) -> anyhow::Result<CloudClient> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
    };
    match target {
        Target::Cloud {
            clouds_yaml,
            cacert,
            cloud,
            region,
        } => {
            let credentials = CloudCredentials {
                clouds_yaml: read(clouds_yaml)?,
                cacert: cacert.as_ref().map(read).transpose()?,
                cloud_name: cloud.clone(),
                region: region.clone(),
            };
            Ok(clouds.connect(&credentials).await?)
        }
        Target::NoAuthOctavia { url, project_id } => {
            let session = NoAuthSession::new(
                [(Service::LoadBalancer, url.clone())],
                Some(project_id.clone()),
            )?;
            Ok(clouds.client(Arc::new(session)))
        }
    }
}

/// Watches until a verdict ends it; what it ended with, as a process exit code: 0 ready
/// (with `until_ready`), 2 stuck, 3 member ERROR, 4 load balancer ERROR, 130 interrupted.
pub async fn watch(args: WatchArgs) -> anyhow::Result<u8> {
    let registry = prometheus::Registry::new();
    let cancel = CancellationToken::new();
    let qps = args.options.rate_limit.qps.get();
    let clouds = Clouds::new(args.options.clone(), &registry, cancel.clone())?;
    let client = connect(&clouds, &args.target).await?;
    let config = EngineConfig {
        stuck_after: args.stuck_after,
        schedule: ScheduleConfig {
            budget_qps: f64::from(qps),
            burst: f64::from(qps),
            ..ScheduleConfig::default()
        },
        ..EngineConfig::default()
    };
    let engine = Engine::new(config, &registry, cancel.clone())?;
    let mut changes = engine.subscribe();
    let mut names = BTreeMap::new();
    for wanted in &args.load_balancers {
        let desired = desired_from_cloud(&client, wanted).await?;
        println!(
            "watching load balancer {} ({}): {} members in {} pools",
            wanted,
            desired.lb_id,
            desired.members.len(),
            desired.pools.len()
        );
        names.insert(desired.lb_id.clone(), wanted.clone());
        engine.ensure(desired, &client);
    }
    let started = Instant::now();
    let mut last_member: BTreeMap<(String, String), MemberVerdictKind> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, Reason> = BTreeMap::new();
    loop {
        let notice = tokio::select! {
            notice = changes.recv() => notice,
            _ = tokio::signal::ctrl_c() => { engine.shutdown().await; return Ok(130); }
        };
        // A change names its LB and the reason it was published with; after a re-sync every
        // LB is shown as it is now.
        let updates: Vec<(String, Option<Reason>)> = match notice {
            Some(Notice::Changed(change)) => vec![(change.lb_id, Some(change.reason))],
            Some(Notice::Resync { .. }) => names.keys().map(|lb| (lb.clone(), None)).collect(),
            None => anyhow::bail!("the membership engine stopped"),
        };
        for (lb_id, reason) in updates {
            let Some(snapshot) = engine.snapshot(&lb_id) else {
                continue;
            };
            let reason = reason.unwrap_or(snapshot.verdict.reason);
            let at = started.elapsed().as_secs_f64();
            let name = names.get(&lb_id).cloned().unwrap_or_default();
            for (member, port, verdict) in &snapshot.verdict.members {
                let key = (lb_id.clone(), format!("{member}:{port}"));
                if last_member.insert(key, verdict.kind()) != Some(verdict.kind()) {
                    println!(
                        "{at:8.1}s  {name}  member {member}:{port} -> {}",
                        verdict.name()
                    );
                }
            }
            println!(
                "{at:8.1}s  {name}  gate {}: {}",
                reason.as_str(),
                snapshot.verdict.message(Instant::now())
            );
            verdicts.insert(lb_id.clone(), reason);
            let code = match reason {
                Reason::MemberStuck => Some(2),
                Reason::MemberError => Some(3),
                Reason::LoadBalancerError => Some(4),
                _ => None,
            };
            if let Some(code) = code {
                eprintln!("{name}: {}", snapshot.verdict.message(Instant::now()));
                engine.shutdown().await;
                return Ok(code);
            }
        }
        let all_ready = names
            .keys()
            .all(|lb| verdicts.get(lb) == Some(&Reason::Ready));
        if args.until_ready && all_ready {
            engine.shutdown().await;
            return Ok(0);
        }
    }
}

/// The LB by id or name; every member it has now is desired (an operator watches what is there).
async fn desired_from_cloud(client: &CloudClient, wanted: &str) -> anyhow::Result<DesiredLb> {
    let lb = match client.octavia().get_load_balancer(wanted).await {
        Ok(lb) => lb,
        Err(CloudError::NotFound(_)) => {
            let filter = LoadBalancerFilter {
                name: Some(wanted.to_owned()),
                tags: Vec::new(),
            };
            let mut found = client.octavia().list_load_balancers(&filter).await?;
            match found.len() {
                1 => found.remove(0),
                0 => anyhow::bail!("no load balancer has id or name {wanted:?}"),
                n => anyhow::bail!("{n} load balancers are named {wanted:?}: give an id"),
            }
        }
        Err(error) => return Err(error.into()),
    };
    let now = Instant::now();
    let mut pools = BTreeMap::new();
    let mut members = Vec::new();
    for pool in client.octavia().list_pools(&lb.id, None).await? {
        let listed = client.octavia().list_members(&pool.id).await?;
        let port = listed.first().map(|m| m.protocol_port).unwrap_or(0);
        for member in listed {
            pools
                .entry(member.protocol_port)
                .or_insert_with(|| pool.id.clone());
            members.push(DesiredMember {
                owner: ObjectName::new("watch-lb", member.name.clone()),
                name: if member.name.is_empty() {
                    member.address.clone()
                } else {
                    member.name
                },
                address: member.address,
                port: member.protocol_port,
                requested_at: now,
                member_id: Some(member.id),
                served: false,
            });
        }
        pools.entry(port).or_insert(pool.id);
    }
    Ok(DesiredLb {
        lb_id: lb.id,
        cluster: ObjectName::new("watch-lb", lb.name),
        pools,
        members,
        rollout_waiting: false,
        leaving: Vec::new(),
    })
}
