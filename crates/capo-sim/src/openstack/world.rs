//! The simulated cloud: the services it owns, their shared [`Env`], and the request log. The
//! world is the one place that knows every service: it hands each one its own state and the
//! `Env` ([`World::with_nova`] and the like), and carries what one service does to another
//! through [`Neighbours`]. No service imports another, nor this module.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::env::{CloudSettings, Env, Images, Neighbours, Timer};
use super::faults::Scenario;
use super::{cinder, glance, keystone, neutron, nova, octavia};

/// One simulator request, for the admin request log.
#[derive(Clone, Debug, Serialize)]
pub struct LoggedRequest {
    /// Seconds since the simulator started (virtual time when the clock is paused).
    pub at: f64,
    pub service: String,
    pub operation: String,
    pub status: u16,
}

/// Counts of requests served, kept as aggregates so a long benchmark does not grow memory.
#[derive(Debug, Default, Serialize)]
pub struct RequestLog {
    pub total: u64,
    /// `"<service> <operation>"` -> count.
    pub by_operation: BTreeMap<String, u64>,
    /// Status code -> count.
    pub by_status: BTreeMap<u16, u64>,
    /// Whole seconds since start -> count.
    pub per_second: BTreeMap<u64, u64>,
    /// The same per service: a client's rate limit is per endpoint.
    pub per_service_second: BTreeMap<String, BTreeMap<u64, u64>>,
    /// The last requests, newest last.
    pub recent: std::collections::VecDeque<LoggedRequest>,
    /// Per service: the current second and how many requests arrived in it.
    #[serde(skip)]
    current: BTreeMap<String, (u64, u32)>,
    /// Load balancers watched for ([`RequestLog::watch_load_balancers`]), by id and name:
    /// whether a request has read each since.
    #[serde(skip)]
    watched: Vec<(WatchedLoadBalancer, bool)>,
}

/// A load balancer a benchmark waits to see read.
#[derive(Clone, Debug)]
pub struct WatchedLoadBalancer {
    pub id: String,
    pub name: String,
}

const RECENT: usize = 200;

impl RequestLog {
    /// Counts an arrival for rate limiting; returns how many arrived this second, this one
    /// included.
    pub fn arrive(&mut self, service: &str, at: f64) -> u32 {
        let second = at as u64;
        let slot = self
            .current
            .entry(service.to_owned())
            .or_insert((second, 0));
        if slot.0 != second {
            *slot = (second, 0);
        }
        slot.1 += 1;
        slot.1
    }

    pub fn record(&mut self, request: LoggedRequest) {
        self.total += 1;
        *self
            .by_operation
            .entry(format!("{} {}", request.service, request.operation))
            .or_default() += 1;
        *self.by_status.entry(request.status).or_default() += 1;
        *self.per_second.entry(request.at as u64).or_default() += 1;
        *self
            .per_service_second
            .entry(request.service.clone())
            .or_default()
            .entry(request.at as u64)
            .or_default() += 1;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(request);
    }

    /// Starts watching for requests that read each of `balancers`, forgetting what was
    /// watched before.
    pub fn watch_load_balancers(&mut self, balancers: Vec<WatchedLoadBalancer>) {
        self.watched = balancers.into_iter().map(|lb| (lb, false)).collect();
    }

    /// Notes which watched load balancers a request reads: its id in the path, a listing
    /// filtered by its name, or a listing of every load balancer (unfiltered by name or id).
    pub fn note_read(&mut self, path: &str, query: &[(String, String)]) {
        if self.watched.is_empty() {
            return;
        }
        let listing = path.trim_end_matches('/').ends_with("/lbaas/loadbalancers");
        let filter = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let every = listing && filter("name").is_none() && filter("id").is_none();
        for (lb, seen) in self.watched.iter_mut().filter(|(_, seen)| !*seen) {
            *seen = every
                || path.contains(lb.id.as_str())
                || (listing && filter("name") == Some(&lb.name));
        }
    }

    /// The ids of the watched load balancers no request has read yet.
    pub fn unread(&self) -> Vec<String> {
        (self.watched.iter())
            .filter(|(_, seen)| !*seen)
            .map(|(lb, _)| lb.id.clone())
            .collect()
    }

    pub fn reset(&mut self) {
        *self = RequestLog::default();
    }
}

/// The cloud's state: the services, the environment they share, and the request log.
pub struct World {
    pub env: Env,
    pub requests: RequestLog,
    pub keystone: keystone::Keystone,
    pub octavia: octavia::Octavia,
    pub neutron: neutron::Neutron,
    pub nova: nova::Nova,
    pub glance: glance::Glance,
    pub cinder: cinder::Cinder,
}

impl World {
    /// A cloud with the objects a fresh DevStack has (networks, flavors, images, volume types).
    pub fn new(settings: CloudSettings, scenario: Scenario) -> Self {
        let mut world = World {
            env: Env::new(settings, scenario),
            requests: RequestLog::default(),
            keystone: keystone::Keystone::default(),
            octavia: octavia::Octavia::default(),
            neutron: neutron::Neutron::default(),
            nova: nova::Nova::default(),
            glance: glance::Glance::default(),
            cinder: cinder::Cinder::default(),
        };
        world.with_neutron(neutron::seed);
        if world.env.settings.tenant_network {
            world.with_neutron(neutron::seed_tenant_network);
        }
        world.with_nova(nova::seed);
        world.with_glance(glance::seed);
        world.with_cinder(cinder::seed);
        world
    }

    /// Keystone, with the environment.
    pub fn with_keystone<R>(&mut self, f: impl FnOnce(&mut keystone::Cx<'_>) -> R) -> R {
        f(&mut keystone::Cx {
            keystone: &mut self.keystone,
            env: &mut self.env,
        })
    }

    /// Glance, with the environment.
    pub fn with_glance<R>(&mut self, f: impl FnOnce(&mut glance::Cx<'_>) -> R) -> R {
        f(&mut glance::Cx {
            glance: &mut self.glance,
            env: &mut self.env,
        })
    }

    /// Neutron, with the environment.
    pub fn with_neutron<R>(&mut self, f: impl FnOnce(&mut neutron::Cx<'_>) -> R) -> R {
        f(&mut neutron::Cx {
            neutron: &mut self.neutron,
            env: &mut self.env,
        })
    }

    /// Cinder, with the environment and Glance's images.
    pub fn with_cinder<R>(&mut self, f: impl FnOnce(&mut cinder::Cx<'_>) -> R) -> R {
        f(&mut cinder::Cx {
            cinder: &mut self.cinder,
            env: &mut self.env,
            images: &self.glance,
        })
    }

    /// Nova, with the environment and its neighbours (ports, volumes, images).
    pub fn with_nova<R>(&mut self, f: impl FnOnce(&mut nova::Cx<'_>) -> R) -> R {
        let mut others = Neighbourhood {
            neutron: &mut self.neutron,
            glance: &self.glance,
            cinder: &mut self.cinder,
        };
        f(&mut nova::Cx {
            nova: &mut self.nova,
            env: &mut self.env,
            others: &mut others,
        })
    }

    /// Octavia, with the environment and its neighbours (VIP ports).
    pub fn with_octavia<R>(&mut self, f: impl FnOnce(&mut octavia::Cx<'_>) -> R) -> R {
        let mut others = Neighbourhood {
            neutron: &mut self.neutron,
            glance: &self.glance,
            cinder: &mut self.cinder,
        };
        f(&mut octavia::Cx {
            octavia: &mut self.octavia,
            env: &mut self.env,
            others: &mut others,
        })
    }

    /// Runs every timer that is due. Called before each request is served, so state is always
    /// current without a background task (and follows tokio's paused clock in tests).
    pub fn settle(&mut self) {
        while let Some(timer) = self.env.pop_due() {
            match timer {
                Timer::LoadBalancer(id) => self.with_octavia(|cx| octavia::on_lb_timer(cx, &id)),
                Timer::Member(id) => self.with_octavia(|cx| octavia::on_member_timer(cx, &id)),
                Timer::MemberOnline(id) => {
                    self.with_octavia(|cx| octavia::on_member_online(cx, &id))
                }
                Timer::Server(id) => self.with_nova(|cx| nova::on_server_timer(cx, &id)),
                Timer::Volume(id) => self.with_cinder(|cx| cinder::on_volume_timer(cx, &id)),
            }
        }
    }

    /// When the next transition is due, if any.
    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        self.env.next_due()
    }

    /// Objects held by `Stuck` rules get going again once their rule is gone.
    pub fn release_stuck(&mut self) {
        self.with_octavia(octavia::release_stuck);
        self.with_nova(nova::release_stuck);
        self.with_cinder(cinder::release_stuck);
    }

    /// Seconds since the simulator started (virtual time when the clock is paused).
    pub fn seconds_since_start(&self) -> f64 {
        self.env.seconds_since_start()
    }
}

impl Images for glance::Glance {
    fn image(&self, id: &str) -> Option<&Value> {
        self.find(id)
    }
}

/// The services one service may reach, lent for one call: Neutron, Glance and Cinder.
struct Neighbourhood<'a> {
    neutron: &'a mut neutron::Neutron,
    glance: &'a glance::Glance,
    cinder: &'a mut cinder::Cinder,
}

impl Neighbourhood<'_> {
    fn neutron<'s>(&'s mut self, env: &'s mut Env) -> neutron::Cx<'s> {
        neutron::Cx {
            neutron: self.neutron,
            env,
        }
    }

    fn cinder<'s>(&'s mut self, env: &'s mut Env) -> cinder::Cx<'s> {
        cinder::Cx {
            cinder: self.cinder,
            env,
            images: self.glance,
        }
    }
}

impl Images for Neighbourhood<'_> {
    fn image(&self, id: &str) -> Option<&Value> {
        self.glance.find(id)
    }
}

impl Neighbours for Neighbourhood<'_> {
    fn ports_in_use(&self) -> usize {
        self.neutron.all("ports").len()
    }

    fn port(&self, id: &str) -> Option<&Value> {
        self.neutron.find("ports", id)
    }

    fn network(&self, id: &str) -> Option<&Value> {
        self.neutron.find("networks", id)
    }

    fn create_port(&mut self, env: &mut Env, request: Value) -> Value {
        neutron::create_object(&mut self.neutron(env), "ports", request)
    }

    fn bind_port(&mut self, env: &mut Env, port: &str, device: &str) {
        neutron::bind_port(&mut self.neutron(env), port, device);
    }

    fn release_port(&mut self, env: &mut Env, port: &str) {
        neutron::release_port(&mut self.neutron(env), port);
    }

    fn vip_port(
        &mut self,
        env: &mut Env,
        network: Option<&str>,
        subnet: Option<&str>,
        address: Option<String>,
    ) -> (String, String, Option<String>) {
        neutron::vip_port(&mut self.neutron(env), network, subnet, address)
    }

    fn volume(&self, id: &str) -> Option<&Value> {
        self.cinder.get(id)
    }

    fn create_volume_for_server(
        &mut self,
        env: &mut Env,
        name: &str,
        size: u64,
        image: Option<&str>,
    ) -> String {
        cinder::create_for_server(&mut self.cinder(env), name, size, image)
    }

    fn attach_volume(&mut self, env: &mut Env, volume: &str, server: &str, device: &str) {
        cinder::attach(&mut self.cinder(env), volume, server, device);
    }

    fn detach_volume(&mut self, env: &mut Env, volume: &str, server: &str) {
        cinder::detach(&mut self.cinder(env), volume, server);
    }

    fn delete_volume_for_server(&mut self, env: &mut Env, volume: &str, server: &str) {
        cinder::delete_for_server(&mut self.cinder(env), volume, server);
    }
}

#[cfg(test)]
mod tests {
    use super::{RequestLog, WatchedLoadBalancer};

    fn watched(id: &str, name: &str) -> WatchedLoadBalancer {
        WatchedLoadBalancer {
            id: id.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_load_balancer_is_read_by_its_id_its_name_or_a_listing_of_every_one() {
        let mut log = RequestLog::default();
        log.watch_load_balancers(vec![watched("id-1", "one"), watched("id-2", "two")]);
        log.note_read("/load-balancer/v2/lbaas/loadbalancers/id-1/status", &[]);
        assert_eq!(log.unread(), ["id-2"]);
        // A listing filtered by another name, or of pools, reads nothing of it.
        let named = |name: &str| vec![("name".to_owned(), name.to_owned())];
        log.note_read("/load-balancer/v2/lbaas/loadbalancers", &named("twos"));
        log.note_read("/load-balancer/v2/lbaas/pools", &[]);
        assert_eq!(log.unread(), ["id-2"]);
        log.note_read("/load-balancer/v2/lbaas/loadbalancers", &named("two"));
        assert!(log.unread().is_empty());

        log.watch_load_balancers(vec![watched("id-1", "one"), watched("id-2", "two")]);
        let page = vec![("limit".to_owned(), "1000".to_owned())];
        log.note_read("/load-balancer/v2/lbaas/loadbalancers", &page);
        assert!(log.unread().is_empty());
        log.watch_load_balancers(vec![watched("id-1", "one")]);
        log.reset();
        assert!(log.unread().is_empty());
    }
}
