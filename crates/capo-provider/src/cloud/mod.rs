//! OpenStack access: credentials, the one rate-limited request path, typed calls, typed errors.
//!
//! Layers, bottom up:
//! - [`Session`]: where a service lives and how to send one authenticated request. The
//!   production session wraps `openstack_sdk` (clouds.yaml, Keystone, token renewal, 401
//!   re-authentication, the catalog); tests and the no-auth test stack plug in their own.
//! - [`RequestPath`]: every call goes through it. It waits for the endpoint's
//!   rate limiter (and any Retry-After pause), sends with a timeout and the caller's cancellation,
//!   classifies the answer into a [`CloudError`], retries what is safe to retry, records metrics
//!   and logs one debug event per request.
//! - Typed calls: [`octavia`], [`neutron`], [`nova`], [`glance`], [`cinder`], on a
//!   [`CloudClient`].
//!
//! This module knows nothing of Kubernetes.

pub mod capabilities;
pub mod cinder;
mod client;
mod credentials;
mod endpoint;
mod error;
pub mod glance;
mod keystone;
mod limiter;
pub mod lookups;
mod metrics;
pub mod neutron;
pub mod nova;
pub mod octavia;
mod owner;
mod path;
mod retry;
mod session;
mod transport;

use std::fmt;

pub use client::{CloudClient, CloudOptions, Clouds};
pub use credentials::{CloudCredentials, ResolvedCloud};
pub use endpoint::MAX_LISTED;
pub use error::{
    CloudError, ErrorContext, MAX_RETRY_AFTER, classify_response, retry_after, server_message,
};
pub use limiter::{EndpointGate, GateKey, RateLimit};
pub use metrics::ApiMetrics;
pub use owner::{OWNER_KEY, Owner};
pub use path::{PathOptions, RequestPath};
pub use retry::RetryPolicy;
pub use session::{
    MAX_ANSWER_BODY, NoAuthSession, SdkSession, SendError, Session, SessionScope, versioned_base,
};

/// The OpenStack services we call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// Keystone (identity v3): authentication and tokens.
    Identity,
    /// Nova (compute v2.1): servers, flavors, server groups, availability zones.
    Compute,
    /// Neutron (network v2.0): networks, subnets, routers, ports, security groups, floating IPs.
    Network,
    /// Glance (image v2): images.
    Image,
    /// Octavia (load-balancer v2): load balancers and everything under them.
    LoadBalancer,
    /// Cinder (block-storage v3): volumes.
    BlockStorage,
}

impl Service {
    /// The catalog type, also used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Service::Identity => "identity",
            Service::Compute => "compute",
            Service::Network => "network",
            Service::Image => "image",
            Service::LoadBalancer => "load-balancer",
            Service::BlockStorage => "block-storage",
        }
    }

    /// The version segment our paths are written against, appended to a catalog URL that lacks
    /// it (catalogs usually list Octavia, Neutron and Glance unversioned, Nova versioned).
    pub(crate) fn version_segment(self) -> &'static str {
        match self {
            Service::Identity => "v3",
            Service::Compute => "v2.1",
            Service::Network => "v2.0",
            Service::Image | Service::LoadBalancer => "v2",
            Service::BlockStorage => "v3",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One logical call: its service and its `<resource>_<verb>` name, which is the `request`
/// label of the metrics (CAPO's names, so existing alerts keep working).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The service called, which picks the endpoint and its rate-limit gate.
    pub service: Service,
    /// `<resource>_<verb>` (e.g. `loadbalancer_member_create`): the metrics' `request` label.
    pub name: &'static str,
}

impl Operation {
    /// The call `name` on `service`; `const`, so modules declare their operations as constants.
    pub const fn new(service: Service, name: &'static str) -> Self {
        Operation { service, name }
    }
}
