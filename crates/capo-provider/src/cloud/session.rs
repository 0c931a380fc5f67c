//! Sessions: where each service lives and how one authenticated request is sent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::DropGuard;
use url::Url;

use super::Service;
use super::keystone::Tokens;
pub(crate) use super::transport::{HttpSettings, execute};
pub use super::transport::{MAX_ANSWER_BODY, SendError};

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

/// The production session: a Keystone token of ours (renewed before expiry, asked for again
/// once when a service refuses it) and its catalog; every request, Keystone's included, goes
/// through the bounded transport.
pub struct SdkSession {
    tokens: Arc<Tokens>,
    http: reqwest::Client,
    scope: SessionScope,
    /// Stops the token's renewal when the session goes.
    _renewal: DropGuard,
}

impl SdkSession {
    pub(crate) fn new(
        tokens: Arc<Tokens>,
        http: reqwest::Client,
        scope: SessionScope,
        renewal: DropGuard,
    ) -> Self {
        SdkSession {
            tokens,
            http,
            scope,
            _renewal: renewal,
        }
    }

    /// Sends the request once with `token`.
    async fn send_with(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
        token: &SecretString,
    ) -> Result<Response<Bytes>, SendError> {
        let url =
            Url::parse(&parts.uri.to_string()).map_err(|e| SendError::Other(e.to_string()))?;
        let mut request = reqwest::Request::new(parts.method.clone(), url);
        *request.headers_mut() = parts.headers.clone();
        let mut value = http::HeaderValue::from_str(token.expose_secret())
            .map_err(|_| SendError::Other("the token is not a header value".into()))?;
        value.set_sensitive(true);
        request.headers_mut().insert("x-auth-token", value);
        if !body.is_empty() {
            *request.body_mut() = Some(body.to_vec().into());
        }
        execute(&self.http, request).await
    }
}

#[async_trait]
impl Session for SdkSession {
    fn scope(&self) -> &SessionScope {
        &self.scope
    }

    async fn service_url(&self, service: Service) -> Result<Url, SendError> {
        let endpoint = self
            .tokens
            .current()
            .endpoint(service.as_str(), self.tokens.config())
            .map_err(SendError::Other)?;
        Ok(versioned_base(endpoint, service))
    }

    async fn send(&self, request: Request<Vec<u8>>) -> Result<Response<Bytes>, SendError> {
        let (parts, body) = request.into_parts();
        let token = self.tokens.current().token().clone();
        let answer = self.send_with(&parts, &body, &token).await?;
        if answer.status() != http::StatusCode::UNAUTHORIZED {
            return Ok(answer);
        }
        // The token was revoked or expired early: a new one, and the request once more.
        self.tokens.reissue_unless_renewed(&token).await?;
        let token = self.tokens.current().token().clone();
        self.send_with(&parts, &body, &token).await
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
        execute(&self.http, request).await
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
}
