//! Keystone tokens, asked for and renewed by capo-rs itself through the bounded transport.
//!
//! `openstack_sdk` authenticates with an HTTP client of its own that reads every answer whole,
//! so a hostile `auth_url` could answer a token request with a body of any size. Here the
//! token request goes through [`execute`], whose answers are capped like every other cloud
//! answer; the SDK's own types and catalog code (no I/O) read the answer.
//!
//! What the SDK did besides, and why it is not needed: identity version discovery (its result
//! was never used: the identity endpoint is named explicitly, see `credentials.rs`), and a
//! `/auth/catalog` refresh when a service is missing (a scoped token carries the whole catalog;
//! a service it lacks is a cloud that does not offer it).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{Response, StatusCode};
use openstack_sdk_auth_core::types::{AuthResponse, Project};
use openstack_sdk_core::auth::authtoken_scope::AuthTokenScope;
use openstack_sdk_core::catalog::Catalog;
use openstack_sdk_core::config::CloudConfig;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};
use url::Url;

use super::transport::{SendError, execute};

/// How long a failed renewal waits before the next try, as the SDK waited.
const RETRY_RENEWAL_AFTER: Duration = Duration::from_secs(30);

/// Keystone's error messages are cut to this many bytes in our errors and conditions.
const MESSAGE_LIMIT: usize = 512;

/// One token Keystone issued, and the service catalog that came with it.
pub(crate) struct Issued {
    token: SecretString,
    expires_at: DateTime<Utc>,
    catalog: Catalog,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

impl Issued {
    pub(crate) fn token(&self) -> &SecretString {
        &self.token
    }

    /// The catalog's endpoint of `service_type` (`compute`, `load-balancer`, ...) for the
    /// cloud's region and interface, or an explicit `*_endpoint_override`.
    pub(crate) fn endpoint(&self, service_type: &str, config: &CloudConfig) -> Result<Url, String> {
        self.catalog
            .get_service_endpoint(
                service_type,
                None,
                config.region_name.as_deref(),
                config.interface.as_deref(),
            )
            .map(|endpoint| endpoint.url().clone())
            .map_err(|e| e.to_string())
    }
}

/// Where and how to ask Keystone for a token.
pub(crate) struct Keystone {
    http: reqwest::Client,
    config: CloudConfig,
    token_url: Url,
}

impl Keystone {
    pub(crate) fn new(http: reqwest::Client, config: CloudConfig) -> Result<Self, String> {
        let token_url = token_url(&config)?;
        Ok(Keystone {
            http,
            config,
            token_url,
        })
    }

    pub(crate) fn config(&self) -> &CloudConfig {
        &self.config
    }

    /// Asks Keystone for a token with the cloud's credentials.
    pub(crate) async fn issue(&self) -> Result<Issued, SendError> {
        let body = token_request(&self.config).map_err(SendError::Other)?;
        let mut request = reqwest::Request::new(http::Method::POST, self.token_url.clone());
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        *request.body_mut() = Some(body.to_string().into());
        issued(execute(&self.http, request).await?, &self.config)
    }
}

/// Keystone's token endpoint: the identity endpoint the cloud names (`auth_url`, or an
/// `identity_endpoint_override`), as the SDK resolves it, joined with `auth/tokens`.
fn token_url(config: &CloudConfig) -> Result<Url, String> {
    let catalog = identity_only_catalog(config)?;
    let identity = catalog
        .get_service_endpoint(
            "identity",
            None,
            config.region_name.as_deref(),
            config.interface.as_deref(),
        )
        .map_err(|e| e.to_string())?;
    // `auth_url` names the v3 API itself: `…/v3` is a directory, not a file to replace.
    let mut base = identity.url().clone();
    if !base.path().ends_with('/') {
        base.set_path(&format!("{}/", base.path()));
    }
    base.join("auth/tokens")
        .map_err(|e| format!("the identity endpoint: {e}"))
}

/// The catalog before any token: `auth_url` as the public identity endpoint, and the cloud's
/// endpoint overrides.
fn identity_only_catalog(config: &CloudConfig) -> Result<Catalog, String> {
    let auth_url = config
        .auth
        .as_ref()
        .and_then(|auth| auth.auth_url.as_deref())
        .ok_or("auth.auth_url is missing")?;
    let mut catalog = Catalog::default();
    catalog
        .register_catalog_endpoint(
            "identity",
            auth_url,
            config.region_name.as_deref(),
            Some("public"),
        )
        .map_err(|e| e.to_string())?;
    catalog.configure(config).map_err(|e| e.to_string())?;
    Ok(catalog)
}

/// The body of `POST /v3/auth/tokens` for the cloud's auth type. Errors name the missing
/// field, never a value.
fn token_request(config: &CloudConfig) -> Result<Value, String> {
    let auth = config
        .auth
        .as_ref()
        .ok_or("clouds.yaml has no auth section")?;
    let secret = |value: &Option<SecretString>, field: &str| {
        value
            .as_ref()
            .map(|s| s.expose_secret().to_owned())
            .ok_or_else(|| format!("auth.{field} is missing"))
    };
    let (method, identity, scoped) = match config.auth_type.as_deref().unwrap_or("password") {
        "password" | "v3password" => {
            let mut user = user_of(auth, "password")?;
            user["password"] = secret(&auth.password, "password")?.into();
            ("password", json!({"user": user}), true)
        }
        "v3applicationcredential" | "applicationcredential" => {
            let mut credential = json!({"secret": secret(&auth.application_credential_secret, "application_credential_secret")?});
            if let Some(id) = &auth.application_credential_id {
                credential["id"] = id.as_str().into();
            } else if let Some(name) = &auth.application_credential_name {
                credential["name"] = name.as_str().into();
                credential["user"] = user_of(auth, "application credential")?;
            } else {
                return Err("auth.application_credential_id (or _name) is missing".into());
            }
            // Keystone scopes the token to the credential's own project.
            ("application_credential", credential, false)
        }
        "token" | "v3token" => ("token", json!({"id": secret(&auth.token, "token")?}), true),
        other => return Err(format!("auth_type {other:?} is not supported")),
    };
    let mut body = json!({"auth": {"identity": {"methods": [method], method: identity}}});
    if scoped {
        let scope = AuthTokenScope::try_from(config).map_err(|e| e.to_string())?;
        if scope != AuthTokenScope::Unscoped {
            body["auth"]["scope"] = serde_json::to_value(scope).map_err(|e| e.to_string())?;
        }
    }
    Ok(body)
}

/// The user a password or a named application credential belongs to: an ID, or a name in a
/// domain.
fn user_of(auth: &openstack_sdk_core::config::Auth, what: &str) -> Result<Value, String> {
    if let Some(id) = &auth.user_id {
        return Ok(json!({"id": id}));
    }
    let name = auth
        .username
        .as_ref()
        .ok_or_else(|| format!("auth.username or auth.user_id is missing for the {what}"))?;
    let domain = match (&auth.user_domain_id, &auth.user_domain_name) {
        (Some(id), _) => json!({"id": id}),
        (None, Some(name)) => json!({"name": name}),
        (None, None) => {
            return Err("auth.user_domain_name or auth.user_domain_id is missing".into());
        }
    };
    Ok(json!({"name": name, "domain": domain}))
}

/// Reads Keystone's answer to a token request.
fn issued(answer: Response<Bytes>, config: &CloudConfig) -> Result<Issued, SendError> {
    let status = answer.status();
    if !status.is_success() {
        return Err(refused(&answer));
    }
    let token = answer
        .headers()
        .get("x-subject-token")
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| SendError::Other("Keystone's answer has no X-Subject-Token".into()))?;
    let info: AuthResponse = serde_json::from_slice(answer.body())
        .map_err(|e| SendError::Other(format!("Keystone's token answer: {e}")))?;
    check_project(config, info.token.project.as_ref())?;
    let mut catalog = identity_only_catalog(config).map_err(SendError::Other)?;
    if let Some(project) = &info.token.project {
        catalog.set_project_id(project.id.as_deref());
        catalog
            .configure(config)
            .map_err(|e| SendError::Other(e.to_string()))?;
    }
    if let Some(endpoints) = &info.token.catalog {
        catalog
            .process_catalog_endpoints(endpoints)
            .map_err(|e| SendError::Other(e.to_string()))?;
    }
    Ok(Issued {
        token: SecretString::from(token.to_owned()),
        expires_at: info.token.expires_at,
        catalog,
    })
}

/// An application credential's token is always for the credential's own project: one
/// configured beside it that is not that project is a mistake to say, not to ignore (the SDK
/// refused it too).
fn check_project(config: &CloudConfig, issued: Option<&Project>) -> Result<(), SendError> {
    let Some(auth) = &config.auth else {
        return Ok(());
    };
    let differs = |wanted: &Option<String>, got: Option<&String>| {
        wanted.as_ref().is_some_and(|wanted| Some(wanted) != got)
    };
    let (id, name) = (
        issued.and_then(|p| p.id.as_ref()),
        issued.and_then(|p| p.name.as_ref()),
    );
    if differs(&auth.project_id, id)
        || (auth.project_id.is_none() && differs(&auth.project_name, name))
    {
        return Err(SendError::Config(
            "Keystone issued a token for another project than the clouds.yaml names (an \
             application credential works in its own project: remove project_id and \
             project_name, or name that project)"
                .into(),
        ));
    }
    Ok(())
}

/// A refusal (401, 403) is terminal until someone fixes the credentials; anything else may
/// pass.
fn refused(answer: &Response<Bytes>) -> SendError {
    let status = answer.status();
    let message = keystone_message(answer.body());
    if status == StatusCode::UNAUTHORIZED && answer.headers().contains_key("openstack-auth-receipt")
    {
        return SendError::Auth(
            "Keystone asks for a further authentication factor, which capo-rs cannot give \
             (use an application credential)"
                .into(),
        );
    }
    let said = format!("Keystone answered {}: {message}", status.as_u16());
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => SendError::Auth(said),
        // A malformed request (a project name without its domain) or a wrong path (an
        // auth_url without /v3) does not mend itself.
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND => SendError::Config(format!(
            "{said} (is auth_url Keystone's v3 API, and is every name given its domain?)"
        )),
        _ => SendError::Other(said),
    }
}

/// Keystone's `{"error": {"message": ...}}`, cut short; of any other body only its size:
/// a page that echoes the request (a proxy's, a firewall's) would echo the password.
fn keystone_message(body: &[u8]) -> String {
    let Some(message) = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
    else {
        return format!(
            "a body of {} bytes that is not Keystone's error",
            body.len()
        );
    };
    let mut end = message.len().min(MESSAGE_LIMIT);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_owned()
}

/// A session's current token, renewed before it expires, and asked for again when a service
/// refuses it.
pub(crate) struct Tokens {
    keystone: Keystone,
    current: RwLock<Arc<Issued>>,
    /// One re-issue at a time: the callers a revoked token failed wait for the first.
    reissuing: tokio::sync::Mutex<()>,
}

impl Tokens {
    /// The first token.
    pub(crate) async fn obtain(keystone: Keystone) -> Result<Arc<Tokens>, SendError> {
        let issued = keystone.issue().await?;
        Ok(Arc::new(Tokens {
            keystone,
            current: RwLock::new(Arc::new(issued)),
            reissuing: tokio::sync::Mutex::new(()),
        }))
    }

    pub(crate) fn current(&self) -> Arc<Issued> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn config(&self) -> &CloudConfig {
        self.keystone.config()
    }

    fn replace(&self, issued: Issued) {
        *self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(issued);
    }

    /// A new token, unless another caller got one since `refused` was refused.
    pub(crate) async fn reissue_unless_renewed(
        &self,
        refused: &SecretString,
    ) -> Result<(), SendError> {
        let _one_at_a_time = self.reissuing.lock().await;
        if self.current().token.expose_secret() != refused.expose_secret() {
            return Ok(());
        }
        let issued = self.keystone.issue().await?;
        self.replace(issued);
        Ok(())
    }

    /// Renews the token `margin` before it expires (at most a fifth of its lifetime before),
    /// until the returned guard is dropped or `cancel` fires.
    pub(crate) fn renew_in_background(
        self: &Arc<Self>,
        margin: Duration,
        cancel: CancellationToken,
    ) -> DropGuard {
        let tokens = Arc::clone(self);
        let stop = cancel.clone();
        tokio::spawn(async move {
            stop.run_until_cancelled(tokens.keep_renewing(margin)).await;
        });
        cancel.drop_guard()
    }

    async fn keep_renewing(&self, margin: Duration) {
        let mut expires_at = self.current().expires_at;
        let Some(mut wait) = renewal_wait(expires_at, Utc::now(), margin) else {
            tracing::warn!(%expires_at, "the keystone token expired as it was issued (are the clocks apart?); no renewal");
            return;
        };
        loop {
            tokio::time::sleep(wait).await;
            // Held until the new token is in place: a caller refused meanwhile finds it.
            let one_at_a_time = self.reissuing.lock().await;
            let next = match self.keystone.issue().await {
                Ok(issued) if issued.expires_at > expires_at => {
                    expires_at = issued.expires_at;
                    tracing::debug!(%expires_at, "keystone token renewed");
                    self.replace(issued);
                    renewal_wait(expires_at, Utc::now(), margin)
                }
                Ok(issued) => {
                    // A token re-issued from a token keeps its expiry: nothing to renew.
                    tracing::warn!(
                        expires_at = %issued.expires_at,
                        "the keystone token cannot be renewed past its expiry (auth_type token); \
                         calls are refused after it"
                    );
                    self.replace(issued);
                    None
                }
                Err(SendError::Auth(error) | SendError::Config(error)) => {
                    // Posting refused credentials again and again could lock the account: the
                    // next call's 401 asks once more, and says why it failed.
                    tracing::warn!(%error, "keystone refused to renew the token; renewal stops");
                    None
                }
                Err(error) => {
                    tracing::warn!(%error, "keystone token renewal failed; trying again in 30 s");
                    // A re-issue on a refusal may have brought a newer token meanwhile.
                    let current = self.current().expires_at;
                    if current > expires_at {
                        expires_at = current;
                        renewal_wait(expires_at, Utc::now(), margin)
                    } else {
                        Some(RETRY_RENEWAL_AFTER)
                    }
                }
            };
            drop(one_at_a_time);
            match next {
                Some(next) => wait = next,
                None => return,
            }
        }
    }
}

/// How long to wait before renewing a token that expires at `expires_at`: until `margin`
/// before expiry, the margin at most a fifth of the remaining lifetime. `None` once expired
/// (a re-issue on refusal takes over).
fn renewal_wait(
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
    margin: Duration,
) -> Option<Duration> {
    let lifetime = (expires_at - now).to_std().ok()?;
    Some(lifetime - margin.min(lifetime / 5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openstack_sdk_core::config::ConfigFile;

    fn config(yaml_auth: &str, auth_type: &str) -> CloudConfig {
        let text = format!(
            "clouds:\n  c:\n    auth_type: {auth_type}\n    region_name: R1\n    auth:\n      auth_url: https://keystone.example/v3\n{yaml_auth}"
        );
        let file: ConfigFile = serde_saphyr::from_str(&text).unwrap();
        file.get_cloud_config("c").unwrap().unwrap()
    }

    #[test]
    fn a_password_by_name_is_sent_with_its_domains_and_project_scope() {
        let config = config(
            "      username: demo\n      password: s3cret\n      user_domain_name: Default\n      project_name: p\n      project_domain_id: default\n",
            "password",
        );
        let body = token_request(&config).unwrap();
        assert_eq!(
            body["auth"]["identity"],
            json!({"methods": ["password"], "password": {"user":
                {"name": "demo", "domain": {"name": "Default"}, "password": "s3cret"}}})
        );
        assert_eq!(body["auth"]["scope"]["project"]["name"], "p");
        assert_eq!(body["auth"]["scope"]["project"]["domain"]["id"], "default");
        assert_eq!(
            token_url(&config).unwrap().as_str(),
            "https://keystone.example/v3/auth/tokens"
        );
    }

    #[test]
    fn an_application_credential_is_sent_unscoped_and_by_name_with_a_nested_domain() {
        let by_id = config(
            "      application_credential_id: ac1\n      application_credential_secret: sec\n      project_id: ignored\n",
            "v3applicationcredential",
        );
        let body = token_request(&by_id).unwrap();
        assert_eq!(
            body["auth"],
            json!({"identity": {"methods": ["application_credential"],
                "application_credential": {"id": "ac1", "secret": "sec"}}})
        );
        let by_name = config(
            "      application_credential_name: ci\n      application_credential_secret: sec\n      username: demo\n      user_domain_id: default\n",
            "v3applicationcredential",
        );
        let credential =
            &token_request(&by_name).unwrap()["auth"]["identity"]["application_credential"];
        assert_eq!(
            credential["user"],
            json!({"name": "demo", "domain": {"id": "default"}})
        );
    }

    #[test]
    fn a_token_is_exchanged_with_its_scope_and_missing_fields_are_named_not_shown() {
        let config_token = config("      token: t0k\n      project_id: p1\n", "v3token");
        let body = token_request(&config_token).unwrap();
        assert_eq!(body["auth"]["identity"]["token"]["id"], "t0k");
        assert_eq!(body["auth"]["scope"]["project"]["id"], "p1");
        let no_domain = config("      username: demo\n      password: s3cret\n", "password");
        let error = token_request(&no_domain).unwrap_err();
        assert!(error.contains("user_domain"), "{error}");
        assert!(!error.contains("s3cret"));
        let unscoped = config("      user_id: u1\n      password: s3cret\n", "password");
        assert!(
            token_request(&unscoped).unwrap()["auth"]
                .get("scope")
                .is_none()
        );
    }

    fn answer(status: u16, headers: &[(&str, &str)], body: Value) -> Response<Bytes> {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Bytes::from(body.to_string())).unwrap()
    }

    #[test]
    fn an_issued_token_brings_its_catalog_for_the_configured_region_and_interface() {
        let config = config(
            "      user_id: u1\n      password: x\n      project_id: p1\n",
            "password",
        );
        let endpoint = |region: &str, interface: &str, url: &str| json!({"id": url, "interface": interface, "region": region, "region_id": region, "url": url});
        let token = json!({"token": {
        "expires_at": "2030-01-01T00:00:00.000000Z",
        "user": {"id": "u1", "name": "demo"},
        "project": {"id": "p1", "name": "p"},
        "catalog": [{"type": "compute", "id": "c", "name": "nova", "endpoints": [
            endpoint("R0", "public", "https://r0.example/compute/v2.1"),
            endpoint("R1", "internal", "https://r1-internal.example/compute/v2.1"),
            endpoint("R1", "public", "https://r1.example/compute/v2.1/p1"),
        ]}]}});
        let issued = issued(answer(201, &[("x-subject-token", "tok")], token), &config).unwrap();
        assert_eq!(issued.token().expose_secret(), "tok");
        assert_eq!(
            issued.endpoint("compute", &config).unwrap().as_str(),
            "https://r1.example/compute/v2.1/p1"
        );
        assert!(issued.endpoint("load-balancer", &config).is_err());
    }

    #[test]
    fn refusals_are_auth_errors_and_keystone_failures_are_not() {
        let config = config("      user_id: u1\n      password: x\n", "password");
        let denied = json!({"error": {"code": 401, "message": "The request you have made requires authentication."}});
        let refusal = issued(answer(401, &[], denied.clone()), &config).unwrap_err();
        assert!(
            matches!(&refusal, SendError::Auth(m) if m.contains("requires authentication")),
            "{refusal:?}"
        );
        let mfa = issued(
            answer(401, &[("openstack-auth-receipt", "r")], denied),
            &config,
        );
        assert!(matches!(mfa, Err(SendError::Auth(m)) if m.contains("factor")));
        let down = issued(answer(503, &[], json!("x".repeat(5_000))), &config).unwrap_err();
        assert!(
            matches!(&down, SendError::Other(m) if m.len() < 600),
            "{down:?}"
        );
        let no_token = issued(answer(201, &[], json!({})), &config).unwrap_err();
        assert!(no_token.to_string().contains("X-Subject-Token"));
        let wrong_path = issued(
            answer(404, &[], json!({"error": {"message": "Not Found"}})),
            &config,
        );
        assert!(matches!(wrong_path, Err(SendError::Config(m)) if m.contains("v3")));
        // A page echoing the request is not repeated: it could hold the password.
        let echo = Response::builder()
            .status(502)
            .body(Bytes::from_static(
                b"<html>POST {\"password\": \"x\"}</html>",
            ))
            .unwrap();
        let echoed = issued(echo, &config).unwrap_err().to_string();
        assert!(!echoed.contains("password"), "{echoed}");
    }

    #[test]
    fn an_application_credential_for_another_project_than_configured_is_a_config_error() {
        let config = config(
            "      application_credential_id: ac1\n      application_credential_secret: s\n      project_name: wanted\n",
            "v3applicationcredential",
        );
        let token = |project: &str| {
            json!({"token": {"expires_at": "2030-01-01T00:00:00Z", "user": {"id": "u", "name": "u"},
                             "project": {"id": "p", "name": project}}})
        };
        let other = issued(
            answer(201, &[("x-subject-token", "t")], token("other")),
            &config,
        );
        assert!(matches!(other, Err(SendError::Config(m)) if m.contains("another project")));
        assert!(
            issued(
                answer(201, &[("x-subject-token", "t")], token("wanted")),
                &config
            )
            .is_ok()
        );
    }

    #[test]
    fn renewal_comes_a_margin_before_expiry_and_never_after_it() {
        let now = Utc::now();
        let hour = now + chrono::TimeDelta::hours(1);
        let five_min = Duration::from_secs(300);
        assert_eq!(
            renewal_wait(hour, now, five_min),
            Some(Duration::from_secs(3300))
        );
        // A short-lived token: a fifth of its lifetime before expiry.
        let ten_s = now + chrono::TimeDelta::seconds(10);
        assert_eq!(
            renewal_wait(ten_s, now, five_min),
            Some(Duration::from_secs(8))
        );
        assert_eq!(
            renewal_wait(now - chrono::TimeDelta::seconds(1), now, five_min),
            None
        );
    }
}
