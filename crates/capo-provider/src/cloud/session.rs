//! Sessions: where each service lives and how one authenticated request is sent.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use openstack_sdk::AsyncOpenStack;
use openstack_sdk::api::AsyncClient;
use openstack_sdk::types::ServiceType;
use url::Url;

use super::Service;

/// The scope a session belongs to: which limiter gates its requests (`auth_url`, `region`),
/// and who asks (`identity`: sessions of one identity see the same objects, so one list of
/// them serves all; a hash or label, never a secret).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionScope {
    /// Keystone's URL (`noauth:<endpoint>` for a no-auth session); with `region`, picks the gates.
    pub auth_url: String,
    /// The region; empty when none is named (always, for a no-auth session).
    pub region: String,
    /// Who asks: the credential's digest, or a no-auth session's project ID (or empty).
    pub identity: String,
}

/// Why a request got no HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made to the endpoint.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The HTTP client's own timeout expired (connecting, or waiting for the answer).
    #[error("timed out: {0}")]
    Timeout(String),
    /// Keystone refused the credentials while re-authenticating.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Anything else: no endpoint for the service, a request that could not be built or sent,
    /// a failed token renewal that was not a refusal.
    #[error("{0}")]
    Other(String),
}

/// What the request path needs from a cloud connection.
#[async_trait]
pub trait Session: Send + Sync + 'static {
    /// The cloud, region and identity this session belongs to.
    fn scope(&self) -> &SessionScope;

    /// The versioned base URL of `service`, ending in `/`.
    async fn service_url(&self, service: Service) -> Result<Url, SendError>;

    /// Sends one request with the session's credentials.
    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError>;
}

/// Appends the service's version segment unless the catalog URL already names a version, and
/// ends the path with `/` so relative paths join under it.
pub fn versioned_base(mut url: Url, service: Service) -> Url {
    let path = url.path().trim_end_matches('/').to_owned();
    let has_version = path.rsplit('/').take(2).any(is_version_segment);
    let path = if has_version {
        format!("{path}/")
    } else {
        format!("{path}/{}/", service.version_segment())
    };
    url.set_path(&path);
    url
}

fn is_version_segment(segment: &str) -> bool {
    let mut chars = segment.chars();
    chars.next() == Some('v') && chars.next().is_some_and(|c| c.is_ascii_digit())
}

/// The production session: `openstack_sdk` holds the token (renewed before expiry,
/// re-issued once on a 401) and the catalog.
pub struct SdkSession {
    client: AsyncOpenStack,
    scope: SessionScope,
    _renewal: openstack_sdk::RenewHandle,
    /// The CA bundle from the Secret, written to a private file for the SDK; removed on drop.
    _cacert: Option<tempfile::NamedTempFile>,
}

impl SdkSession {
    pub(crate) fn new(
        client: AsyncOpenStack,
        scope: SessionScope,
        renewal: openstack_sdk::RenewHandle,
        cacert: Option<tempfile::NamedTempFile>,
    ) -> Self {
        SdkSession {
            client,
            scope,
            _renewal: renewal,
            _cacert: cacert,
        }
    }
}

fn service_type(service: Service) -> ServiceType {
    match service {
        Service::Identity => ServiceType::Identity,
        Service::Compute => ServiceType::Compute,
        Service::Network => ServiceType::Network,
        Service::Image => ServiceType::Image,
        Service::LoadBalancer => ServiceType::LoadBalancer,
        Service::BlockStorage => ServiceType::BlockStorage,
    }
}

#[async_trait]
impl Session for SdkSession {
    fn scope(&self) -> &SessionScope {
        &self.scope
    }

    async fn service_url(&self, service: Service) -> Result<Url, SendError> {
        let endpoint = self
            .client
            .get_service_endpoint(&service_type(service), None)
            .await
            .map_err(|e| SendError::Other(e.to_string()))?;
        Ok(versioned_base(endpoint.url().clone(), service))
    }

    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError> {
        let (parts, body) = request.into_parts();
        let mut builder = Request::builder()
            .method(parts.method)
            .uri(parts.uri)
            .version(parts.version);
        if let Some(headers) = builder.headers_mut() {
            *headers = parts.headers;
        }
        self.client
            .rest_async(builder, body)
            .await
            .map_err(sdk_send_error)
    }
}

/// Classifies the SDK's error by the reqwest error inside it, if any.
fn sdk_send_error(error: openstack_sdk::api::ApiError<openstack_sdk::RestError>) -> SendError {
    use openstack_sdk::RestError;
    match error {
        openstack_sdk::api::ApiError::Client {
            source: RestError::Communication { source },
        } => reqwest_send_error(&source),
        openstack_sdk::api::ApiError::Client {
            source: RestError::AuthError { source },
        } => {
            // Renewing the token can fail because Keystone is down (a 503 during version
            // discovery): that passes. Only a refusal waits for new credentials.
            let message = source.to_string();
            if is_refusal(&message) {
                SendError::Auth(message)
            } else {
                SendError::Other(message)
            }
        }
        other => SendError::Other(other.to_string()),
    }
}

/// Whether an authentication failure is Keystone refusing the credentials (terminal until
/// someone fixes them) rather than Keystone being unreachable or failing (which passes).
pub(crate) fn is_refusal(message: &str) -> bool {
    // Status codes as whole words only: a URL's port (`:40371`) is no 403.
    let status = message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word == "401" || word == "403");
    status
        || ["Unauthorized", "authentication", "Forbidden"]
            .iter()
            .any(|needle| message.contains(needle))
}

fn reqwest_send_error(error: &reqwest::Error) -> SendError {
    if error.is_timeout() {
        SendError::Timeout(error.to_string())
    } else if error.is_connect() {
        SendError::Connect(error.to_string())
    } else {
        SendError::Other(error.to_string())
    }
}

/// A session without Keystone, for test stacks only (Octavia with `auth_strategy = noauth`, the
/// simulator with auth disabled): fixed endpoints and an `X-Project-Id` header. Never used with a
/// real cloud, which would reject it anyway.
pub struct NoAuthSession {
    http: reqwest::Client,
    endpoints: BTreeMap<Service, Url>,
    project_id: Option<String>,
    scope: SessionScope,
}

impl NoAuthSession {
    /// `endpoints` are the services' base URLs, versioned or not.
    pub fn new(
        endpoints: impl IntoIterator<Item = (Service, Url)>,
        project_id: Option<String>,
    ) -> Result<Self, SendError> {
        let endpoints: BTreeMap<Service, Url> = endpoints.into_iter().collect();
        let auth_url = endpoints
            .values()
            .next()
            .map(Url::to_string)
            .unwrap_or_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| SendError::Other(e.to_string()))?;
        Ok(NoAuthSession {
            http,
            endpoints,
            scope: SessionScope {
                auth_url: format!("noauth:{auth_url}"),
                region: String::new(),
                identity: project_id.clone().unwrap_or_default(),
            },
            project_id,
        })
    }
}

#[async_trait]
impl Session for NoAuthSession {
    fn scope(&self) -> &SessionScope {
        &self.scope
    }

    async fn service_url(&self, service: Service) -> Result<Url, SendError> {
        let url = self
            .endpoints
            .get(&service)
            .ok_or_else(|| SendError::Other(format!("no endpoint configured for {service}")))?;
        Ok(versioned_base(url.clone(), service))
    }

    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError> {
        let mut request =
            reqwest::Request::try_from(request).map_err(|e| SendError::Other(e.to_string()))?;
        if let Some(project) = &self.project_id
            && let Ok(value) = http::HeaderValue::from_str(project)
        {
            request.headers_mut().insert("x-project-id", value);
        }
        let response = self
            .http
            .execute(request)
            .await
            .map_err(|e| reqwest_send_error(&e))?;
        let mut builder = Response::builder()
            .status(response.status())
            .version(response.version());
        if let Some(headers) = builder.headers_mut() {
            *headers = response.headers().clone();
        }
        let body = response.bytes().await.map_err(|e| reqwest_send_error(&e))?;
        builder
            .body(body)
            .map_err(|e| SendError::Other(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(url: &str, service: Service) -> String {
        versioned_base(Url::parse(url).unwrap(), service).to_string()
    }

    #[test]
    fn catalog_urls_get_their_version_once() {
        assert_eq!(
            base("http://h:9876", Service::LoadBalancer),
            "http://h:9876/v2/"
        );
        assert_eq!(
            base("http://h/load-balancer/v2/", Service::LoadBalancer),
            "http://h/load-balancer/v2/"
        );
        assert_eq!(
            base("http://h:9696/", Service::Network),
            "http://h:9696/v2.0/"
        );
        assert_eq!(
            base("http://h/compute/v2.1/abc123", Service::Compute),
            "http://h/compute/v2.1/abc123/"
        );
        assert_eq!(base("http://h/image", Service::Image), "http://h/image/v2/");
    }

    #[test]
    fn keystone_down_during_renewal_passes_and_a_refusal_does_not() {
        let down = "`identity` endpoint version discovery error:\n\tUrl: http://127.0.0.1/identity/v3/\n\tMessage: Service is not working.";
        assert!(!is_refusal(down));
        assert!(is_refusal(
            "The request you have made requires authentication. (HTTP 401)"
        ));
        assert!(is_refusal("403 Forbidden"));
        assert!(is_refusal("Request failed with status 401"));
        // A port that happens to hold 401 or 403 is no refusal.
        let on_port = "`identity` endpoint version discovery error:\n\tUrl: http://127.0.0.1:40371/identity/v3/\n\tMessage: Service is not working.";
        assert!(!is_refusal(on_port));
        assert!(!is_refusal("Url: http://127.0.0.1:34019/"));
    }
}
