//! One bounded HTTP exchange with a cloud endpoint: the client every OpenStack request goes
//! through (Keystone's included), and the cap on what an answer may make us hold.

use std::time::Duration;

use bytes::Bytes;
use http::Response;

/// The largest answer body read from a cloud endpoint. A page of 1,000 ports or servers is
/// a few MB; an endpoint that sends more (a 1 GiB body, an endless stream) is cut off here,
/// before the body is held, and the call fails as any transient failure does.
pub const MAX_ANSWER_BODY: usize = 64 << 20;

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
    /// The request is wrong for this cloud (Keystone answered 400 or 404 to the token
    /// request, or issued a token for another project than the one configured): terminal
    /// until someone fixes the clouds.yaml.
    #[error("{0}")]
    Config(String),
    /// The answer's body is larger than [`MAX_ANSWER_BODY`]: not read.
    #[error("the answer's body exceeds {} MiB: not read", MAX_ANSWER_BODY >> 20)]
    TooLarge,
    /// Anything else: no endpoint for the service, a request that could not be built or sent,
    /// a failed token renewal that was not a refusal.
    #[error("{0}")]
    Other(String),
}

/// How the session's own HTTP client reaches the cloud: as the SDK's does (the same CA
/// bundle and verification, timeouts), but with no decompression (no gzip bomb; OpenStack
/// APIs answer uncompressed).
pub(crate) struct HttpSettings<'a> {
    pub(crate) cacert_pem: Option<&'a str>,
    pub(crate) verify: bool,
    pub(crate) request_timeout: Duration,
}

impl HttpSettings<'_> {
    pub(crate) fn client(&self) -> Result<reqwest::Client, SendError> {
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("capo-rs/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5))
            .timeout(self.request_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(10)
            .no_gzip()
            .no_deflate()
            // A redirect would carry the token, or a token request's password, wherever the
            // endpoint points; OpenStack APIs do not redirect their API calls.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = self.cacert_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| SendError::Other(format!("the CA bundle: {e}")))?;
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        if !self.verify {
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
        builder.build().map_err(|e| SendError::Other(e.to_string()))
    }
}

/// Sends `request`, and reads the answer's body up to [`MAX_ANSWER_BODY`].
///
/// A kept-alive connection that the endpoint closes just as a request goes out on it fails that
/// request with no answer: OpenStack's WSGI servers close idle connections after a few seconds
/// (gunicorn after 2 s, Apache after 5 s), while the pool keeps them 30 s. As Go's client does,
/// a request that cannot have changed anything (GET, HEAD) is sent once more, on a new
/// connection; any other method fails, and its caller decides.
pub(crate) async fn execute(
    http: &reqwest::Client,
    request: reqwest::Request,
) -> Result<Response<Bytes>, SendError> {
    let again = is_safe(request.method())
        .then(|| request.try_clone())
        .flatten();
    let response = match http.execute(request).await {
        Ok(response) => response,
        Err(error) => match again {
            Some(again) if unanswered_on_an_open_connection(&error) => {
                tracing::debug!(error = %described(&error), "no answer on a kept-alive connection: sent again");
                http.execute(again)
                    .await
                    .map_err(|e| reqwest_send_error(&e))?
            }
            _ => return Err(reqwest_send_error(&error)),
        },
    };
    into_response(response).await
}

fn is_safe(method: &reqwest::Method) -> bool {
    *method == reqwest::Method::GET || *method == reqwest::Method::HEAD
}

/// The request failed after a connection was had and before any answer came: not a timeout,
/// not a refused connection.
fn unanswered_on_an_open_connection(error: &reqwest::Error) -> bool {
    error.is_request() && !error.is_timeout() && !error.is_connect()
}

/// The answer, its body read up to [`MAX_ANSWER_BODY`].
async fn into_response(mut response: reqwest::Response) -> Result<Response<Bytes>, SendError> {
    if response
        .content_length()
        .is_some_and(|length| length > MAX_ANSWER_BODY as u64)
    {
        return Err(SendError::TooLarge);
    }
    let mut builder = Response::builder()
        .status(response.status())
        .version(response.version());
    if let Some(headers) = builder.headers_mut() {
        *headers = std::mem::take(response.headers_mut());
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| reqwest_send_error(&e))? {
        if body.len() + chunk.len() > MAX_ANSWER_BODY {
            return Err(SendError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    builder
        .body(body.freeze())
        .map_err(|e| SendError::Other(e.to_string()))
}

fn reqwest_send_error(error: &reqwest::Error) -> SendError {
    let what = described(error);
    if error.is_timeout() {
        SendError::Timeout(what)
    } else if error.is_connect() {
        SendError::Connect(what)
    } else {
        SendError::Other(what)
    }
}

/// The error and its causes: reqwest's own message ("error sending request for url ...") says
/// what was asked, its sources why it failed ("connection closed before message completed").
fn described(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
