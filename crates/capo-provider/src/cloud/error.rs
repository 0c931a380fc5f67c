//! What can go wrong talking to OpenStack, classified so callers know whether to retry.
//!
//! Every error carries the service, the operation (`member_create`, ...) and the server's own
//! message, so an operator reading a condition or an event can tell what the cloud said.

use std::fmt;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::Service;

/// The call an error belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorContext {
    /// The service that was called.
    pub service: Service,
    /// `<resource>_<verb>`, the same string as the metrics' `request` label.
    pub operation: String,
    /// The server's message (Octavia's `faultstring`, Neutron's `NeutronError.message`, ...),
    /// or a description of the local failure.
    pub message: String,
}

impl fmt::Display for ErrorContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.service, self.operation, self.message)
    }
}

/// The one error type of the `cloud` module.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// 404: the object does not exist (or no longer does).
    #[error("not found: {0}")]
    NotFound(ErrorContext),
    /// 409 "immutable": the object or its load balancer is PENDING_*; try again later.
    #[error("busy: {0}")]
    Busy(ErrorContext),
    /// Any other 409, e.g. a member with the same address and port already exists.
    #[error("conflict: {0}")]
    Conflict(ErrorContext),
    /// 429, or 503 with Retry-After: the cloud asks us to slow down.
    #[error("rate limited (retry after {retry_after:?}): {ctx}")]
    RateLimited {
        /// The call, and the server's message or why our own gate did not send it.
        ctx: ErrorContext,
        /// How long to wait before trying again: the cloud's Retry-After (one second after a 429
        /// without one), or how long our own gate would have held the call.
        retry_after: Duration,
    },
    /// 401 that re-authentication did not cure, or authentication itself failed.
    #[error("unauthorized: {0}")]
    Unauthorized(ErrorContext),
    /// 403, including quota exhaustion (Neutron and Nova answer 403 or 409 "Quota exceeded").
    #[error("forbidden: {0}")]
    Forbidden(ErrorContext),
    /// 400 and other 4xx: the request is wrong and repeating it will not help.
    #[error("bad request: {0}")]
    BadRequest(ErrorContext),
    /// 501: this cloud (or the Octavia provider serving the object) does not implement what
    /// was asked, and will not next time either.
    #[error("not implemented: {0}")]
    NotImplemented(ErrorContext),
    /// 5xx, connection failures, timeouts: the cloud may answer next time.
    #[error("transient: {0}")]
    Transient(ErrorContext),
    /// The answer did not have the shape we expected.
    #[error("cannot decode response: {0}")]
    Decode(ErrorContext),
    /// The credentials or clouds.yaml are unusable (unknown cloud, unsupported auth type, ...).
    #[error("invalid cloud configuration: {0}")]
    Config(String),
    /// The caller's cancellation token fired.
    #[error("cancelled: {0}")]
    Cancelled(ErrorContext),
}

impl CloudError {
    /// Whether the same call may succeed later without anyone changing the spec.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CloudError::Busy(_) | CloudError::RateLimited { .. } | CloudError::Transient(_)
        )
    }

    /// Whether the cloud refused for want of quota (a person must raise it or free room).
    pub fn is_quota(&self) -> bool {
        matches!(self, CloudError::Forbidden(ctx) if is_quota(&ctx.message))
    }

    /// Whether the object does not exist (a 404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, CloudError::NotFound(_))
    }

    /// The server's message or the local description.
    pub fn message(&self) -> &str {
        match self.context() {
            Some(ctx) => &ctx.message,
            None => match self {
                CloudError::Config(message) => message,
                _ => "",
            },
        }
    }

    /// The call the error belongs to; None for `Config`, which fails before any call.
    pub fn context(&self) -> Option<&ErrorContext> {
        match self {
            CloudError::NotFound(ctx)
            | CloudError::Busy(ctx)
            | CloudError::Conflict(ctx)
            | CloudError::RateLimited { ctx, .. }
            | CloudError::Unauthorized(ctx)
            | CloudError::Forbidden(ctx)
            | CloudError::BadRequest(ctx)
            | CloudError::NotImplemented(ctx)
            | CloudError::Transient(ctx)
            | CloudError::Decode(ctx)
            | CloudError::Cancelled(ctx) => Some(ctx),
            CloudError::Config(_) => None,
        }
    }

    /// A short machine-readable name, used as a metrics label and in logs.
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::NotFound(_) => "not_found",
            CloudError::Busy(_) => "busy",
            CloudError::Conflict(_) => "conflict",
            CloudError::RateLimited { .. } => "rate_limited",
            CloudError::Unauthorized(_) => "unauthorized",
            CloudError::Forbidden(_) => "forbidden",
            CloudError::BadRequest(_) => "bad_request",
            CloudError::NotImplemented(_) => "not_implemented",
            CloudError::Transient(_) => "transient",
            CloudError::Decode(_) => "decode",
            CloudError::Config(_) => "config",
            CloudError::Cancelled(_) => "cancelled",
        }
    }
}

/// Maps a non-success HTTP answer to an error. `now` is the wall clock, for HTTP-date
/// Retry-After values; it is a parameter so the mapping stays pure.
pub fn classify_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    service: Service,
    operation: &str,
    now: std::time::SystemTime,
) -> CloudError {
    let ctx = ErrorContext {
        service,
        operation: operation.to_owned(),
        message: server_message(status, body),
    };
    let retry_after = retry_after(headers, now);
    match status.as_u16() {
        404 => CloudError::NotFound(ctx),
        409 if is_immutable(&ctx.message) => CloudError::Busy(ctx),
        409 | 413 if is_quota(&ctx.message) => CloudError::Forbidden(ctx),
        409 => CloudError::Conflict(ctx),
        429 => CloudError::RateLimited {
            ctx,
            retry_after: retry_after.unwrap_or(DEFAULT_RETRY_AFTER),
        },
        503 => match retry_after {
            Some(retry_after) => CloudError::RateLimited { ctx, retry_after },
            None => CloudError::Transient(ctx),
        },
        401 => CloudError::Unauthorized(ctx),
        403 => CloudError::Forbidden(ctx),
        408 => CloudError::Transient(ctx),
        501 => CloudError::NotImplemented(ctx),
        code if code >= 500 => CloudError::Transient(ctx),
        _ => CloudError::BadRequest(ctx),
    }
}

/// How long to pause after a 429 that names no Retry-After.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest pause a Retry-After can ask for. A cloud endpoint is not trusted with more:
/// one answering `Retry-After: 18446744073709551615` would otherwise overflow every deadline
/// computed from it (a panic) or hold its endpoint for ever.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Retry-After as seconds or an HTTP date, at most `MAX_RETRY_AFTER`; a date in the past
/// means "now".
pub fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let asked = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let date = httpdate::parse_http_date(value).ok()?;
            date.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(asked.min(MAX_RETRY_AFTER))
}

fn is_immutable(message: &str) -> bool {
    message.contains("is immutable")
}

/// Quota refusals as the services word them (recorded from the real tier): Neutron's 409
/// "Quota exceeded for resources: ['port']."; Nova's 403 "Quota exceeded for instances: ..." and,
/// when the ports a server needs do not fit Neutron's quota, "Maximum number of ports exceeded";
/// Cinder's 413 "VolumeLimitExceeded: Maximum number of volumes allowed (0) exceeded for quota
/// 'volumes'."
fn is_quota(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("quota exceeded")
        || lower.contains("quota has been met")
        || lower.contains("exceeded for quota")
        || (lower.contains("maximum number of") && lower.contains("exceeded"))
}

/// The human message inside an OpenStack error body. Handles Octavia's two shapes
/// (`faultstring`, and `{code,title,description}`), Neutron's `NeutronError`, Nova's
/// `{"itemNotFound": {"message"}}` style, Keystone's `{"error": {"message"}}`, and plain text.
pub fn server_message(status: StatusCode, body: &[u8]) -> String {
    let fallback = || {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            truncate(text, 512)
        }
    };
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return fallback();
    };
    json_message(&value).unwrap_or_else(fallback)
}

fn json_message(value: &Value) -> Option<String> {
    let text = |v: &Value| v.as_str().map(str::to_owned).filter(|s| !s.is_empty());
    if let Some(message) = value.get("faultstring").and_then(text) {
        return Some(message);
    }
    if let Some(message) = value.get("description").and_then(text) {
        return Some(message);
    }
    if let Some(error) = value.get("NeutronError") {
        return error.get("message").and_then(text).or_else(|| text(error));
    }
    if let Some(message) = value.get("message").and_then(text) {
        return Some(message);
    }
    // Nova and Keystone wrap the message in one object named after the error.
    let object = value.as_object()?;
    if object.len() == 1 {
        let inner = object.values().next()?;
        return inner.get("message").and_then(text);
    }
    None
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn classify(status: u16, body: &str) -> CloudError {
        classify_response(
            StatusCode::from_u16(status).unwrap(),
            &HeaderMap::new(),
            body.as_bytes(),
            Service::LoadBalancer,
            "member_create",
            SystemTime::now(),
        )
    }

    #[test]
    fn octavia_immutable_409_is_busy_and_retryable() {
        let body = r#"{"faultcode":"Client","faultstring":"Load Balancer 7881 is immutable and cannot be updated.","debuginfo":null}"#;
        let err = classify(409, body);
        assert!(matches!(err, CloudError::Busy(_)), "{err:?}");
        assert!(err.is_retryable());
        assert_eq!(
            err.message(),
            "Load Balancer 7881 is immutable and cannot be updated."
        );
    }

    #[test]
    fn duplicate_member_409_is_a_terminal_conflict() {
        let body = r#"{"faultcode":"Client","faultstring":"Another member on this pool is already using ip 192.0.2.10 on protocol_port 8080","debuginfo":null}"#;
        let err = classify(409, body);
        assert!(matches!(err, CloudError::Conflict(_)), "{err:?}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn both_octavia_404_shapes_give_the_message() {
        let fault = classify(
            404,
            r#"{"faultcode":"Client","faultstring":"Member 0 not found.","debuginfo":null}"#,
        );
        let pecan = classify(
            404,
            r#"{"code":404,"title":"Bad Request","description":"Pool 0 not found."}"#,
        );
        assert!(fault.is_not_found() && pecan.is_not_found());
        assert_eq!(fault.message(), "Member 0 not found.");
        assert_eq!(pecan.message(), "Pool 0 not found.");
    }

    #[test]
    fn other_services_error_bodies() {
        let neutron = classify(
            409,
            r#"{"NeutronError":{"type":"OverQuota","message":"Quota exceeded for resources: ['port'].","detail":""}}"#,
        );
        assert!(matches!(neutron, CloudError::Forbidden(_)), "{neutron:?}");
        let nova = classify(
            404,
            r#"{"itemNotFound":{"code":404,"message":"Flavor m1.huge could not be found."}}"#,
        );
        assert_eq!(nova.message(), "Flavor m1.huge could not be found.");
        assert!(neutron.is_quota());
        // Nova and Cinder, as the real tier answers them.
        let nova_ports = classify(
            403,
            r#"{"forbidden":{"code":403,"message":"Maximum number of ports exceeded"}}"#,
        );
        assert!(nova_ports.is_quota(), "{nova_ports:?}");
        let cinder = classify(
            413,
            r#"{"overLimit":{"code":413,"message":"VolumeLimitExceeded: Maximum number of volumes allowed (0) exceeded for quota 'volumes'."}}"#,
        );
        assert!(cinder.is_quota(), "{cinder:?}");
        let policy = classify(
            403,
            r#"{"NeutronError":{"type":"PolicyNotAuthorized","message":"rule:delete_port is disallowed by policy","detail":""}}"#,
        );
        assert!(matches!(policy, CloudError::Forbidden(_)) && !policy.is_quota());
        let plain = classify(502, "<html>Bad Gateway</html>");
        assert!(matches!(plain, CloudError::Transient(_)));
        assert_eq!(plain.message(), "<html>Bad Gateway</html>");
        let empty = classify(500, "");
        assert_eq!(empty.message(), "Internal Server Error");
    }

    #[test]
    fn status_classes() {
        assert!(matches!(classify(400, "{}"), CloudError::BadRequest(_)));
        assert!(matches!(classify(401, "{}"), CloudError::Unauthorized(_)));
        assert!(matches!(classify(403, "{}"), CloudError::Forbidden(_)));
        assert!(matches!(classify(503, "{}"), CloudError::Transient(_)));
        let unimplemented = classify(501, "{}");
        assert!(matches!(unimplemented, CloudError::NotImplemented(_)));
        assert!(
            !unimplemented.is_retryable(),
            "a 501 is not worth repeating"
        );
        assert!(matches!(
            classify(429, "{}"),
            CloudError::RateLimited { retry_after, .. } if retry_after == DEFAULT_RETRY_AFTER
        ));
    }

    #[test]
    fn retry_after_seconds_and_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(42));
        headers.insert(http::header::RETRY_AFTER, later.parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(42)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(42));
        headers.insert(http::header::RETRY_AFTER, past.parse().unwrap());
        assert_eq!(retry_after(&headers, now), Some(Duration::ZERO));
        headers.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers, now), None);
    }

    #[test]
    fn a_retry_after_beyond_reason_is_held_to_the_longest_pause() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for asked in [
            "18446744073709551615",
            "86400",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::RETRY_AFTER, asked.parse().unwrap());
            assert_eq!(retry_after(&headers, now), Some(MAX_RETRY_AFTER), "{asked}");
        }
        // What follows from it cannot overflow.
        let deadline = std::time::Instant::now().checked_add(MAX_RETRY_AFTER);
        assert!(deadline.is_some());
    }

    #[test]
    fn long_plain_bodies_are_truncated() {
        let long = "x".repeat(2000);
        let message = server_message(StatusCode::BAD_GATEWAY, long.as_bytes());
        assert_eq!(message.len(), 515);
    }
}
