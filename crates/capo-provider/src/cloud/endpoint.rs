//! One generic `openstack_sdk` endpoint for all our calls, and the helpers that run it on the
//! request path: the SDK builds the URL, unwraps the response key and follows pagination links;
//! our path sends.

use std::borrow::Cow;

use http::{HeaderMap, HeaderValue, Method};
use openstack_sdk_core::api::rest_endpoint_prelude::{BodyError, QueryParams, RestEndpoint};
use openstack_sdk_core::api::{Pageable, Pagination, QueryAsync, ignore, paged};
use openstack_sdk_core::types::{ApiVersion, ServiceType};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::path::{OpClient, from_sdk};
use super::{CloudError, Operation, RequestPath};

/// A request relative to its service's versioned base URL.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    op: Operation,
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Value>,
    key: Option<&'static str>,
    headers: Option<HeaderMap>,
}

impl Call {
    fn new(method: Method, op: Operation, path: impl Into<String>) -> Self {
        Call {
            op,
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            key: None,
            headers: None,
        }
    }

    pub(crate) fn get(op: Operation, path: impl Into<String>) -> Self {
        Call::new(Method::GET, op, path)
    }

    pub(crate) fn post(op: Operation, path: impl Into<String>, body: Value) -> Self {
        Call::new(Method::POST, op, path).body(body)
    }

    pub(crate) fn put(op: Operation, path: impl Into<String>, body: Value) -> Self {
        Call::new(Method::PUT, op, path).body(body)
    }

    pub(crate) fn delete(op: Operation, path: impl Into<String>) -> Self {
        Call::new(Method::DELETE, op, path)
    }

    /// The key the answer is wrapped in (`{"member": {...}}`).
    pub(crate) fn key(mut self, key: &'static str) -> Self {
        self.key = Some(key);
        self
    }

    pub(crate) fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    pub(crate) fn query(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.query.push((name, value.into()));
        self
    }

    pub(crate) fn query_opt(self, name: &'static str, value: Option<impl Into<String>>) -> Self {
        match value {
            Some(value) => self.query(name, value),
            None => self,
        }
    }

    pub(crate) fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers
            .get_or_insert_with(HeaderMap::new)
            .insert(name, HeaderValue::from_static(value));
        self
    }
}

impl RestEndpoint for Call {
    fn method(&self) -> Method {
        self.method.clone()
    }

    fn endpoint(&self) -> Cow<'static, str> {
        Cow::Owned(self.path.clone())
    }

    fn service_type(&self) -> ServiceType {
        ServiceType::from(self.op.service.as_str())
    }

    fn parameters(&self) -> QueryParams<'_> {
        let mut params = QueryParams::default();
        for (name, value) in &self.query {
            params.push(*name, value.as_str());
        }
        params
    }

    fn body(&self) -> Result<Option<(&'static str, Vec<u8>)>, BodyError> {
        match &self.body {
            Some(body) => Ok(Some(("application/json", serde_json::to_vec(body)?))),
            None => Ok(None),
        }
    }

    fn response_key(&self) -> Option<Cow<'static, str>> {
        self.key.map(Cow::Borrowed)
    }

    fn request_headers(&self) -> Option<&HeaderMap> {
        self.headers.as_ref()
    }

    /// Unversioned: the SDK sends no microversion header; calls that need one set it.
    fn api_version(&self) -> Option<ApiVersion> {
        Some(ApiVersion::new(0, 0))
    }
}

impl Pageable for Call {}

/// The most objects one listing may hold. The lists capo-rs makes are narrowed by name, tag,
/// network or project and hold a few hundred at most; a cloud that pages on past this (a
/// broken or hostile endpoint sending `next` links forever) gets its listing refused instead
/// of an endless loop or unbounded memory. Refused, not truncated: a truncated list could make
/// something present look absent.
pub const MAX_LISTED: usize = 50_000;

/// A listing longer than [`MAX_LISTED`], as the error that refuses it.
pub(crate) fn too_long(op: Operation, listed: usize) -> Result<(), CloudError> {
    if listed <= MAX_LISTED {
        return Ok(());
    }
    Err(CloudError::Decode(super::ErrorContext {
        service: op.service,
        operation: op.name.to_owned(),
        message: format!("the listing goes on past {MAX_LISTED} objects; refused"),
    }))
}

impl RequestPath {
    /// Runs `call` and decodes the (unwrapped) answer.
    pub(crate) async fn fetch<T: DeserializeOwned + Send + 'static>(
        &self,
        call: Call,
    ) -> Result<T, CloudError> {
        let op = call.op;
        let client = OpClient { path: self, op };
        call.query_async(&client).await.map_err(|e| from_sdk(op, e))
    }

    /// Runs a list call, following the service's pagination links to the end, or to
    /// [`MAX_LISTED`] objects: a listing longer than that is refused, never cut short.
    pub(crate) async fn fetch_all<T: DeserializeOwned + Send + 'static>(
        &self,
        call: Call,
    ) -> Result<Vec<T>, CloudError> {
        let op = call.op;
        let client = OpClient { path: self, op };
        let listed: Vec<T> = paged(call, Pagination::Limit(MAX_LISTED + 1))
            .query_async(&client)
            .await
            .map_err(|e| from_sdk(op, e))?;
        too_long(op, listed.len())?;
        Ok(listed)
    }

    /// Runs a call whose answer has no body worth reading (DELETE's 204, PUT's 202).
    pub(crate) async fn run(&self, call: Call) -> Result<(), CloudError> {
        let op = call.op;
        let client = OpClient { path: self, op };
        ignore(call)
            .query_async(&client)
            .await
            .map_err(|e| from_sdk(op, e))
    }
}
