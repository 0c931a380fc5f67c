//! The HTTP face of the simulator: URL routing like kube-apiserver's, query parameters,
//! content negotiation (the object, `Table` or `PartialObjectMetadata`, see [`output`]),
//! and watch streams.
//!
//! [`output`]: super::output

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::admission::{self, Write};
use super::errors::ApiError;
use super::output::{self, Output};
use super::patch::Patch;
use super::resources::{Registry, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{
    Change, DeleteOptions, Deletion, EventType, FieldValidation, ListQuery, Propagation, Store,
    Target, WatchStart, WriteOptions, present,
};
use super::table::{self, IncludeObject};

/// State shared by all requests.
pub struct Shared {
    /// Everything stored.
    pub store: Mutex<Store>,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Ends watches when the server stops.
    pub shutdown: CancellationToken,
    /// Every resource request, as an authorizer sees it.
    pub requests: Mutex<Vec<RequestRecord>>,
    /// Calls CRDs' conversion webhooks.
    pub converter: super::conversion::Converter,
    /// Status writes still to fail (`KubeSim::fail_status_writes`), and after how long.
    pub status_write_faults: Mutex<(u32, Duration)>,
}

/// One resource request as kube-apiserver's authorizer sees it (its RequestInfo), and who
/// sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// get, list, watch, create, update, patch, delete or deletecollection.
    pub verb: String,
    /// API group, "" for core.
    pub group: String,
    /// Plural resource, with `/subresource` when there is one (`openstackservers/status`).
    pub resource: String,
    /// Namespace, "" for cluster-scoped and all-namespace requests.
    pub namespace: String,
    /// Object name, "" for collections.
    pub name: String,
    /// The client's User-Agent.
    pub user_agent: String,
    /// The answer's HTTP status.
    pub status: u16,
    /// When it was answered.
    pub at: std::time::Instant,
}

/// The authorizer's attributes of a resource request: (verb, group, resource, namespace,
/// name); `None` for discovery and other non-resource paths.
pub fn authorization_attributes(
    method: &Method,
    path: &str,
    query: &Query,
) -> Option<(String, String, String, String, String)> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (*ns, more),
        other => ("", other),
    };
    let (resource, name) = match rest {
        [] => return None,
        [plural] => ((*plural).to_owned(), ""),
        [plural, name] => ((*plural).to_owned(), *name),
        [plural, name, sub, ..] => (format!("{plural}/{sub}"), *name),
    };
    // `namespaces/NAME` is the Namespace itself.
    let (namespace, resource, name) = match (namespace, rest) {
        (ns, ["status" | "finalize"]) if !ns.is_empty() => {
            ("", format!("namespaces/{}", rest[0]), ns)
        }
        _ => (namespace, resource, name),
    };
    // As k8s.io/apiserver's RequestInfoFactory: a collection GET is a watch when `watch` is
    // given as anything but false or 0; a GET by name stays a get.
    let watch = query
        .get("watch")
        .is_some_and(|value| !matches!(value.to_lowercase().as_str(), "false" | "0"));
    let verb = match (method.as_str(), name.is_empty()) {
        ("GET", true) if watch => "watch",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => return None,
    };
    Some((
        verb.to_owned(),
        group.to_owned(),
        resource,
        namespace.to_owned(),
        name.to_owned(),
    ))
}

impl Shared {
    /// Whether this request is a status write that is to fail, and after how long (one of
    /// the faults still to come is used up).
    fn failing_status_write(&self, method: &Method, path: &str, query: &Query) -> Option<Duration> {
        let write = matches!(*method, Method::PATCH | Method::PUT);
        let status = authorization_attributes(method, path, query)
            .is_some_and(|(_, _, resource, _, _)| resource.ends_with("/status"));
        if !write || !status {
            return None;
        }
        let mut faults = self
            .status_write_faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (left, delay) = &mut *faults;
        (*left > 0).then(|| {
            *left -= 1;
            *delay
        })
    }

    /// What admission needs of the server.
    pub fn admission(&self) -> admission::Server<'_> {
        admission::Server {
            store: &self.store,
            converter: &self.converter,
        }
    }

    /// The store, even if a panicking request poisoned the lock (every write is applied
    /// whole or not at all, so the data stays consistent).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes a request in the log.
    pub fn log(&self, record: RequestRecord) {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(record);
    }

    /// Requests so far, counted by client (its User-Agent's product name) and verb: what
    /// `GET /_sim/requests` answers, for a benchmark in another process.
    pub fn request_summary(&self) -> serde_json::Value {
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        let mut by_resource: std::collections::BTreeMap<String, u64> = Default::default();
        let mut writers: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for record in requests.iter() {
            if is_provider_write(record) {
                let kind = record.resource.split('/').next().unwrap_or_default();
                writers
                    .entry(format!("{kind} {}/{}", record.namespace, record.name))
                    .or_default()
                    .insert(instance_of(&record.user_agent).to_owned());
            }
            let client = record.user_agent.split('/').next().unwrap_or_default();
            *counts
                .entry(format!("{client} {}", record.verb))
                .or_default() += 1;
            let group = if record.group.is_empty() {
                "core"
            } else {
                record.group.as_str()
            };
            *by_resource
                .entry(format!(
                    "{client} {} {group}/{}",
                    record.verb, record.resource
                ))
                .or_default() += 1;
        }
        serde_json::json!({
            "total": requests.len(),
            "by_client_verb": counts,
            "by_client_verb_resource": by_resource,
            "writers_by_object": writers,
        })
    }

    /// The request log so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// A write to one of the infrastructure provider's objects (what tells which replica works on
/// an object).
fn is_provider_write(record: &RequestRecord) -> bool {
    record.group == "infrastructure.cluster.x-k8s.io"
        && !record.name.is_empty()
        && !matches!(record.verb.as_str(), "get" | "list" | "watch")
}

/// The instance a User-Agent names, as capo-rs writes it: `capo-rs/<version> (<instance>_<id>)`;
/// the whole agent when it has no such part.
fn instance_of(user_agent: &str) -> &str {
    user_agent
        .split_once('(')
        .and_then(|(_, rest)| rest.split(['_', ')']).next())
        .unwrap_or(user_agent)
}

/// The router: every path goes through one dispatcher, as kube-apiserver's paths are
/// data-dependent (CRDs add them at run time).
/// Where the simulator's own request counts are served (not a Kubernetes path).
pub const REQUEST_SUMMARY_PATH: &str = "/_sim/requests";

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// A request's query parameters.
pub type Query = HashMap<String, String>;

fn parse_query(raw: Option<&str>) -> Query {
    raw.map(|q| {
        form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    })
    .unwrap_or_default()
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path() == REQUEST_SUMMARY_PATH {
        return axum::Json(shared.request_summary()).into_response();
    }
    let query = parse_query(uri.query());
    let request = Request {
        method: &method,
        path: uri.path(),
        query: &query,
        headers: &headers,
        body: &body,
    };
    if let Some(delay) = shared.failing_status_write(&method, uri.path(), &query) {
        tokio::time::sleep(delay).await;
        let response = error_response(&ApiError::write_timed_out());
        log_request(&shared, &method, &uri, &query, &headers, &response);
        return response;
    }
    let response = match dispatch(&shared, &request).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    };
    tracing::debug!(method = %method, path = uri.path(), status = response.status().as_u16(), "sim kube request");
    log_request(&shared, &method, &uri, &query, &headers, &response);
    response
}

fn log_request(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    query: &Query,
    headers: &HeaderMap,
    response: &Response,
) {
    if let Some((verb, group, resource, namespace, name)) =
        authorization_attributes(method, uri.path(), query)
    {
        let user_agent = headers
            .get(header::USER_AGENT)
            .and_then(|ua| ua.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        shared.log(RequestRecord {
            verb,
            group,
            resource,
            namespace,
            name,
            user_agent,
            status: response.status().as_u16(),
            at: std::time::Instant::now(),
        });
    }
}

struct Request<'a> {
    method: &'a Method,
    path: &'a str,
    query: &'a Query,
    headers: &'a HeaderMap,
    body: &'a Bytes,
}

impl Request<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    /// The form the client accepts the answer in (`Accept`), or 406.
    fn output(&self, custom: bool) -> Result<Output, ApiError> {
        let accept = self
            .headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|a| a.to_str().ok())
            .collect::<Vec<_>>()
            .join(",");
        output::negotiate(Some(&accept), custom)
    }

    fn include_object(&self) -> IncludeObject {
        IncludeObject::parse(self.param("includeObject"))
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .unwrap_or("application/json")
    }

    fn json_body(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Ok(Value::Null);
        }
        if self.content_type().contains("protobuf") {
            return super::protobuf::decode(self.body);
        }
        if self.content_type().contains("yaml") {
            return serde_saphyr::from_slice(self.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
        }
        serde_json::from_slice(self.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
    }

    fn write_options(&self) -> Result<WriteOptions, ApiError> {
        let field_validation = match self.param("fieldValidation") {
            None | Some("Warn") => FieldValidation::Warn,
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation must be one of Ignore, Warn or Strict, not {other:?}"
                )));
            }
        };
        Ok(WriteOptions {
            dry_run: self.dry_run()?,
            field_validation,
            field_manager: self.field_manager(),
        })
    }

    /// `fieldManager`, or, as the API server does, the product part of the User-Agent.
    fn field_manager(&self) -> String {
        let name = match self.param("fieldManager") {
            Some(manager) => manager,
            None => self
                .headers
                .get(header::USER_AGENT)
                .and_then(|ua| ua.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .unwrap_or_default(),
        };
        name.chars().filter(|c| !c.is_control()).take(128).collect()
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.param("dryRun") {
            None => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "unsupported dryRun {other:?}"
            ))),
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &error.status())
}

fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let text = format!("299 - {}", serde_json::Value::String(warning.clone()));
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("Warning", value);
        }
    }
    response
}

/// Where a resource request points.
struct ResourcePath<'a> {
    group: &'a str,
    version: &'a str,
    namespace: Option<&'a str>,
    plural: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
}

async fn dispatch(shared: &Arc<Shared>, request: &Request<'_>) -> Result<Response, ApiError> {
    let segments: Vec<&str> = request.path.split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |value: Option<Value>| -> Result<Response, ApiError> {
        if request.method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        value
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(ApiError::no_such_path)
    };
    let registry = shared.store().registry();
    let (group, version, rest) = match segments.as_slice() {
        ["api"] => {
            return get_only(Some(json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default()}],
            })));
        }
        ["apis"] => return get_only(Some(registry.api_group_list())),
        ["apis", group] => return get_only(registry.api_group(group)),
        ["version"] => return get_only(Some(version_info())),
        ["healthz" | "livez" | "readyz"] => {
            return Ok((StatusCode::OK, "ok").into_response());
        }
        ["openapi", "v2"] => return get_only(Some(super::openapi::v2())),
        ["openapi", "v3"] => return get_only(Some(super::openapi::v3_root(&registry))),
        ["openapi", "v3", rest @ ..] => {
            return get_only(super::openapi::v3_group_version(&registry, &rest.join("/")));
        }
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::no_such_path()),
    };
    if rest.is_empty() {
        return get_only(registry.api_resource_list(group, version));
    }
    let namespace_subresource = group.is_empty()
        && rest.len() == 3
        && rest[0] == "namespaces"
        && matches!(rest[2], "status" | "finalize");
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() && !namespace_subresource => {
            (Some(*ns), more)
        }
        other => (None, other),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_such_path()),
    };
    let path = ResourcePath {
        group,
        version,
        namespace,
        plural,
        name,
        subresource,
    };
    resource_request(shared, &registry, request, &path).await
}

fn version_info() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-capo-rs-sim",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

async fn resource_request(
    shared: &Arc<Shared>,
    registry: &Registry,
    request: &Request<'_>,
    path: &ResourcePath<'_>,
) -> Result<Response, ApiError> {
    let def = registry
        .find(path.group, path.version, path.plural)
        .ok_or_else(ApiError::no_such_path)?;
    if path.namespace.is_some() && !def.namespaced {
        return Err(ApiError::no_such_path());
    }
    if def.namespaced && path.namespace.is_none() && path.name.is_some() {
        return Err(ApiError::no_such_path());
    }
    let status = match path.subresource {
        None => false,
        Some("status")
            if def
                .version(path.version)
                .is_some_and(|v| v.status_subresource) =>
        {
            true
        }
        Some(_) => return Err(ApiError::no_such_path()),
    };
    let target = Target {
        def: def.clone(),
        version: path.version.to_owned(),
        namespace: path.namespace.unwrap_or_default().to_owned(),
        asked: None,
    };
    let method = request.method.clone();
    // As the API server's handlers do, every verb settles the answer's form before it
    // acts (406 comes first), and shapes the answer after.
    let negotiate = || request.output(def.custom);
    match (method, path.name) {
        (Method::GET, Some(name)) => {
            let output = negotiate()?;
            let stored = shared.store().get(&target, name)?;
            let object = in_version(shared, &target, &stored).await?;
            Ok(object_response(
                &target,
                &object,
                request,
                output,
                StatusCode::OK,
            ))
        }
        (Method::GET, None) if request.flag("watch") => {
            watch(shared, request, &target, path.namespace, negotiate()?)
        }
        (Method::GET, None) => list(shared, request, &target, path.namespace, negotiate()?).await,
        (Method::POST, None) if def.namespaced && path.namespace.is_none() => {
            Err(ApiError::method_not_allowed())
        }
        (Method::POST, None) => {
            let output = negotiate()?;
            let opts = request.write_options()?;
            let body = request.json_body()?;
            let write = Write {
                target: &target,
                operation: "CREATE",
                object: &body,
                old: None,
                dry_run: opts.dry_run,
                field_manager: request.param("fieldManager"),
            };
            admission::admit(shared.admission(), &write).await?;
            let (stored_as, body) = to_storage(shared, &target, body).await?;
            let written = shared.store().create(&stored_as, body, &opts)?;
            let written = written_in(shared, &target, written).await?;
            Ok(written_response(&target, written, request, output))
        }
        (Method::PUT, Some(name)) => {
            let output = negotiate()?;
            let opts = request.write_options()?;
            reencode(shared, &target, name).await?;
            let body = request.json_body()?;
            if !status {
                let manager = request.param("fieldManager");
                admit_update(shared, &target, name, &body, opts.dry_run, manager).await?;
            }
            let (stored_as, body) = to_storage(shared, &target, body).await?;
            let written = shared
                .store()
                .update(&stored_as, name, body, status, &opts)?;
            let written = written_in(shared, &target, written).await?;
            Ok(written_response(&target, written, request, output))
        }
        (Method::PATCH, Some(name)) => {
            let output = negotiate()?;
            patch(shared, request, &target, name, status, output).await
        }
        (Method::DELETE, Some(name)) => {
            let output = negotiate()?;
            let opts = delete_options(request)?;
            let deletion = shared.store().delete(&target, name, &opts)?;
            Ok(match deletion {
                Deletion::Gone(object) => {
                    json_response(StatusCode::OK, &deleted_status(&def, &object))
                }
                Deletion::Pending(object) => {
                    let object = in_version(shared, &target, &object).await?;
                    // 202 only when the client asked for cascading deletion the old way.
                    let code = if opts.orphan_dependents == Some(false) {
                        StatusCode::ACCEPTED
                    } else {
                        StatusCode::OK
                    };
                    object_response(&target, &object, request, output, code)
                }
            })
        }
        (Method::DELETE, None) if def.namespaced && path.namespace.is_none() => {
            Err(ApiError::method_not_allowed())
        }
        (Method::DELETE, None) => {
            let output = negotiate()?;
            let opts = delete_options(request)?;
            let deleted = {
                let (labels, fields) = selectors(request, &target)?;
                let filter = |o: &Value| labels.matches(o) && fields.matches(o);
                shared
                    .store()
                    .delete_collection(&target, path.namespace, &filter, &opts)?
            };
            let mut items = Vec::with_capacity(deleted.len());
            for object in &deleted {
                items.push(present(
                    &def,
                    &target.version,
                    &in_version(shared, &target, object).await?,
                ));
            }
            let rv = shared.store().resource_version();
            let body = list_body(
                &target,
                items,
                json!({"resourceVersion": rv.to_string()}),
                request,
                output,
            )?;
            Ok(json_response(StatusCode::OK, &body))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// What a DELETE that removed the object answers: a `Status` naming it (its resource in
/// `details.kind`, as the API server has it), not the object.
fn deleted_status(def: &ResourceDef, object: &Value) -> Value {
    let meta = |field: &str| {
        object
            .pointer(&format!("/metadata/{field}"))
            .cloned()
            .unwrap_or_default()
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
           "details": {"name": meta("name"), "group": def.key.group, "kind": def.key.plural, "uid": meta("uid")}})
}

/// One object in the form the client asked for (a `PartialObjectMetadataList` of one
/// object is 406, as the API server has it).
fn object_response(
    target: &Target,
    object: &Value,
    request: &Request<'_>,
    output: Output,
    code: StatusCode,
) -> Response {
    let presented = present(&target.def, &target.version, object);
    let body = match output {
        Output::Object => presented,
        Output::Table => {
            let rv = presented
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or_default();
            table::table(
                &target.def,
                &target.version,
                &[presented],
                json!({"resourceVersion": rv}),
                request.include_object(),
            )
        }
        Output::Metadata(version) => output::partial(&presented, version),
        Output::MetadataList(_) => return error_response(&output::not_a_list(&target.def)),
    };
    json_response(code, &body)
}

fn written_response(
    target: &Target,
    written: super::store::Written,
    request: &Request<'_>,
    output: Output,
) -> Response {
    let code = if written.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    with_warnings(
        object_response(target, &written.object, request, output, code),
        &written.warnings,
    )
}

async fn patch(
    shared: &Arc<Shared>,
    request: &Request<'_>,
    target: &Target,
    name: &str,
    status: bool,
    output: Output,
) -> Result<Response, ApiError> {
    let patch = Patch::parse(request.content_type(), request.body, target.def.custom)?;
    let opts = request.write_options()?;
    reencode(shared, target, name).await?;
    if let Patch::Apply(config) = patch {
        if request.param("fieldManager").is_none() {
            return Err(ApiError::bad_request(
                "PATCH requests with application/apply-patch+yaml must set fieldManager",
            ));
        }
        let force = request.flag("force");
        let (stored_as, config) = to_storage(shared, target, config).await?;
        if !status {
            admit_apply(
                shared,
                request,
                target,
                (&stored_as, name),
                &config,
                &opts,
                force,
            )
            .await?;
        }
        let written = shared
            .store()
            .apply(&stored_as, name, config, status, &opts, force)?;
        let written = written_in(shared, target, written).await?;
        return Ok(written_response(target, written, request, output));
    }
    if request.param("force").is_some() {
        return Err(ApiError::bad_request(
            "force=true is only allowed for server-side apply",
        ));
    }
    if target.version == target.def.storage_version && (status || !target.def.custom) {
        let mut store = shared.store();
        let current = store.get(target, name)?;
        let presented = present(&target.def, &target.version, &current);
        let patched = patch.apply_to(&presented)?;
        let written = store.update(target, name, patched, status, &opts)?;
        drop(store);
        return Ok(written_response(target, written, request, output));
    }
    // In another version than the stored one: the patch applies to the object converted to
    // the request's version, and the result is converted back. As the real server's
    // GuaranteedUpdate, a write that lost a race is tried again on the newer object.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current = shared.store().get(target, name)?;
        let presented = present(
            &target.def,
            &target.version,
            &in_version(shared, target, &current).await?,
        );
        let patched = patch.apply_to(&presented)?;
        if !status {
            let write = Write {
                target,
                operation: "UPDATE",
                object: &patched,
                old: Some(&presented),
                dry_run: opts.dry_run,
                field_manager: request.param("fieldManager"),
            };
            admission::admit(shared.admission(), &write).await?;
        }
        let (stored_as, body) = to_storage(shared, target, patched).await?;
        let updated = shared.store().update(&stored_as, name, body, status, &opts);
        match updated {
            Err(error) if error.code == 409 && attempts < 5 && !patch.sets_resource_version() => {
                continue;
            }
            Err(error) => return Err(error),
            Ok(written) => {
                let written = written_in(shared, target, written).await?;
                return Ok(written_response(target, written, request, output));
            }
        }
    }
}

/// Admits a server-side apply as the real server does any write (recorded: an UPDATE review
/// of the merged object, with the request's fieldManager): the apply tried without storing,
/// its result against the live object, both in the request's version.
async fn admit_apply(
    shared: &Arc<Shared>,
    request: &Request<'_>,
    target: &Target,
    (stored_as, name): (&Target, &str),
    config: &Value,
    opts: &WriteOptions,
    force: bool,
) -> Result<(), ApiError> {
    let trial = WriteOptions {
        dry_run: true,
        ..opts.clone()
    };
    let merged = shared
        .store()
        .apply(stored_as, name, config.clone(), false, &trial, force)?;
    let merged = written_in(shared, target, merged).await?;
    let current = shared.store().get(target, name).ok();
    let old = match current {
        Some(current) => Some(present(
            &target.def,
            &target.version,
            &in_version(shared, target, &current).await?,
        )),
        None => None,
    };
    let write = Write {
        target,
        operation: if old.is_some() { "UPDATE" } else { "CREATE" },
        object: &merged.object,
        old: old.as_ref(),
        dry_run: opts.dry_run,
        field_manager: request.param("fieldManager"),
    };
    admission::admit(shared.admission(), &write).await
}

/// Admits a PUT of `body` over the stored object (a PUT of a missing one fails later, as
/// the real server's does for custom resources).
async fn admit_update(
    shared: &Arc<Shared>,
    target: &Target,
    name: &str,
    body: &Value,
    dry_run: bool,
    field_manager: Option<&str>,
) -> Result<(), ApiError> {
    let Ok(stored) = shared.store().get(target, name) else {
        return Ok(());
    };
    let old = present(
        &target.def,
        &target.version,
        &in_version(shared, target, &stored).await?,
    );
    let write = Write {
        target,
        operation: "UPDATE",
        object: body,
        old: Some(&old),
        dry_run,
        field_manager,
    };
    admission::admit(shared.admission(), &write).await
}

/// A stored object as a client of `target.version` sees it (before defaults).
async fn in_version(
    shared: &Arc<Shared>,
    target: &Target,
    stored: &Value,
) -> Result<Value, ApiError> {
    shared
        .converter
        .convert(target.def.conversion_target(&target.version), stored)
        .await
}

/// A write's result, in the client's version.
async fn written_in(
    shared: &Arc<Shared>,
    target: &Target,
    mut written: super::store::Written,
) -> Result<super::store::Written, ApiError> {
    if written.object["apiVersion"] != target.def.api_version(&target.version).as_str() {
        written.object = Arc::new(in_version(shared, target, &written.object).await?);
    }
    Ok(written)
}

/// A request body of `target.version`, pruned and defaulted by that version's schema (as the
/// server decodes it), converted to the storage version; with the target to store it under.
async fn to_storage(
    shared: &Arc<Shared>,
    target: &Target,
    mut body: Value,
) -> Result<(Target, Value), ApiError> {
    let def = &target.def;
    if target.version == def.storage_version || !body.is_object() {
        return Ok((target.clone(), body));
    }
    if let Some(schema) = def.version(&target.version).and_then(|v| v.schema.as_ref()) {
        crate::structural::drop_nulls(&mut body, schema);
        crate::structural::prune(&mut body, schema);
        crate::structural::apply_defaults(&mut body, schema);
    }
    body["apiVersion"] = Value::String(def.api_version(&target.version));
    body["kind"] = Value::String(def.kind.clone());
    let converted = shared
        .converter
        .convert(def.conversion_target(&def.storage_version), &body)
        .await?;
    let stored_as = Target {
        version: def.storage_version.clone(),
        asked: Some(target.version.clone()),
        ..target.clone()
    };
    Ok((stored_as, converted))
}

/// Before a write, an object still stored in an older version is read into the storage
/// version (the real server decodes it on every update), so the write stores it anew even
/// when nothing else changes: how a no-op write migrates storage.
async fn reencode(shared: &Arc<Shared>, target: &Target, name: &str) -> Result<(), ApiError> {
    let def = &target.def;
    let Ok(stored) = shared.store().get(target, name) else {
        return Ok(());
    };
    if stored["apiVersion"] == def.api_version(&def.storage_version).as_str() {
        return Ok(());
    }
    let converted = shared
        .converter
        .convert(def.conversion_target(&def.storage_version), &stored)
        .await?;
    shared.store().reencode(target, name, &stored, converted);
    Ok(())
}

fn delete_options(request: &Request<'_>) -> Result<DeleteOptions, ApiError> {
    let body = match request.json_body()? {
        Value::Null => json!({}),
        body => body,
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    let policy = text(body.get("propagationPolicy"))
        .or_else(|| request.param("propagationPolicy").map(str::to_owned));
    let body_dry_run = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    let orphan_dependents = body
        .get("orphanDependents")
        .and_then(Value::as_bool)
        .or_else(|| match request.param("orphanDependents") {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        });
    let propagation = match policy.as_deref() {
        None if orphan_dependents == Some(true) => Propagation::Orphan,
        None | Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy must be Orphan, Background or Foreground, not {other:?}"
            )));
        }
    };
    Ok(DeleteOptions {
        uid: text(body.pointer("/preconditions/uid")),
        resource_version: text(body.pointer("/preconditions/resourceVersion")),
        propagation,
        orphan_dependents,
        dry_run: body_dry_run || request.dry_run()?,
    })
}

fn selectors(
    request: &Request<'_>,
    target: &Target,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(request.param("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(
        request.param("fieldSelector").unwrap_or_default(),
        &target.def.selectable_fields(&target.version),
    )?;
    Ok((labels, fields))
}

fn list_json(def: &ResourceDef, version: &str, items: Vec<Value>, metadata: Value) -> Value {
    json!({"kind": def.list_kind, "apiVersion": def.api_version(version), "metadata": metadata, "items": items})
}

/// A list (of presented objects) in the form the client asked for (a
/// `PartialObjectMetadata` of a list is 406, as the API server has it).
fn list_body(
    target: &Target,
    items: Vec<Value>,
    metadata: Value,
    request: &Request<'_>,
    output: Output,
) -> Result<Value, ApiError> {
    let (def, version) = (&target.def, target.version.as_str());
    Ok(match output {
        Output::Object => list_json(def, version, items, metadata),
        Output::Table => table::table(def, version, &items, metadata, request.include_object()),
        Output::Metadata(_) => return Err(output::a_list(def)),
        Output::MetadataList(meta) => output::partial_list(&items, metadata, meta),
    })
}

async fn list(
    shared: &Arc<Shared>,
    request: &Request<'_>,
    target: &Target,
    namespace: Option<&str>,
    output: Output,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(request, target)?;
    let limit = match request.param("limit") {
        None => None,
        Some(text) => Some(
            text.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {text:?}")))?,
        ),
    };
    let page = {
        let filter = |o: &Value| labels.matches(o) && fields.matches(o);
        let query = ListQuery {
            namespace,
            filter: &filter,
            limit,
            continue_token: request.param("continue"),
            resource_version: request.param("resourceVersion"),
            exact: request.param("resourceVersionMatch") == Some("Exact"),
        };
        shared.store().list(&target.def.key, &query)?
    };
    // One conversion per object stored in another version, as the real server decodes a
    // list item by item.
    let mut items = Vec::with_capacity(page.items.len());
    for object in &page.items {
        items.push(present(
            &target.def,
            &target.version,
            &in_version(shared, target, object).await?,
        ));
    }
    let mut metadata = json!({"resourceVersion": page.rv.to_string()});
    if let Some(token) = page.continue_token {
        metadata["continue"] = token.into();
    } else if target.def.custom {
        // A custom resource's list is unstructured on a real server: an empty `continue` is
        // written, not left out as a built-in's typed list does (recorded from v1.35).
        metadata["continue"] = "".into();
    }
    if let Some(remaining) = page.remaining {
        metadata["remainingItemCount"] = remaining.into();
    }
    let body = list_body(target, items, metadata, request, output)?;
    Ok(json_response(StatusCode::OK, &body))
}

/// What one watch shows and how.
struct WatchView {
    def: Arc<ResourceDef>,
    version: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    output: Output,
    include: IncludeObject,
}

impl WatchView {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    /// The event type a change becomes for this watcher, if any: objects moving into the
    /// selection are ADDED, moving out are DELETED.
    fn event_type(&self, change: &Change) -> Option<EventType> {
        if change.key != self.def.key
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != change.namespace)
        {
            return None;
        }
        let now = self.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.matches(p));
        Some(match change.kind {
            EventType::Added if now => EventType::Added,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            EventType::Deleted if now || before => EventType::Deleted,
            _ => return None,
        })
    }

    fn event(&self, kind: &str, object: &Value) -> Value {
        let presented = present(&self.def, &self.version, object);
        let object = match self.output {
            Output::Object => presented,
            Output::Table => {
                let rv = presented
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or_default();
                table::table(
                    &self.def,
                    &self.version,
                    &[presented],
                    json!({"resourceVersion": rv}),
                    self.include,
                )
            }
            // Each event carries one object, so a watch asking for a list of metadata
            // gets the metadata of each.
            Output::Metadata(version) | Output::MetadataList(version) => {
                output::partial(&presented, version)
            }
        };
        json!({"type": kind, "object": object})
    }

    /// A BOOKMARK: the kind with only a resourceVersion (and the initial-events-end
    /// annotation), as `PartialObjectMetadata` to a watch of metadata, which the API server
    /// transforms bookmarks for as it does every event.
    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({
            "kind": self.def.kind, "apiVersion": self.def.api_version(&self.version), "metadata": metadata,
        });
        let object = match self.output {
            Output::Metadata(version) | Output::MetadataList(version) => {
                output::partial(&object, version)
            }
            Output::Object | Output::Table => object,
        };
        json!({"type": "BOOKMARK", "object": object})
    }
}

fn watch(
    shared: &Arc<Shared>,
    request: &Request<'_>,
    target: &Target,
    namespace: Option<&str>,
    output: Output,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(request, target)?;
    let send_initial = request.flag("sendInitialEvents");
    let bookmarks = request.flag("allowWatchBookmarks");
    let timeout = request
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let view = WatchView {
        def: target.def.clone(),
        version: target.version.clone(),
        namespace: namespace.map(str::to_owned),
        labels,
        fields,
        output,
        include: request.include_object(),
    };
    let start = shared.store().watch(
        &target.def.key,
        namespace,
        request.param("resourceVersion"),
        send_initial,
    )?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = WatchStream {
        shared: shared.clone(),
        view,
        tx,
        bookmarks,
        send_initial,
        interval: shared.bookmark_interval,
        shutdown: shared.shutdown.clone(),
    };
    tokio::spawn(stream.run(start, timeout));
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    }));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

struct WatchStream {
    shared: Arc<Shared>,
    view: WatchView,
    tx: mpsc::Sender<Bytes>,
    bookmarks: bool,
    send_initial: bool,
    interval: Duration,
    shutdown: CancellationToken,
}

impl WatchStream {
    async fn send(&self, event: &Value) -> bool {
        let mut line = event.to_string();
        line.push('\n');
        self.tx.send(Bytes::from(line)).await.is_ok()
    }

    /// Sends the change's event, if this watcher sees it, converted to the watch's version;
    /// `false` when the watch is over (the client left, or a conversion failed: the real
    /// server ends the watch with an ERROR event).
    async fn forward(&self, change: &Change) -> bool {
        let Some(kind) = self.view.event_type(change) else {
            return true;
        };
        let converted = self
            .shared
            .converter
            .convert(
                self.view.def.conversion_target(&self.view.version),
                &change.object,
            )
            .await;
        match converted {
            Ok(object) => self.send(&self.view.event(kind.as_str(), &object)).await,
            Err(error) => {
                self.expire(&ApiError::internal(error.message)).await;
                false
            }
        }
    }

    async fn expire(&self, error: &ApiError) {
        self.send(&json!({"type": "ERROR", "object": error.status()}))
            .await;
    }

    async fn run(self, start: WatchStart, timeout: Duration) {
        let WatchStart {
            initial,
            mut live,
            rv,
            expired,
        } = start;
        if let Some(error) = expired {
            self.expire(&error).await;
            return;
        }
        for change in &initial {
            if !self.forward(change).await {
                return;
            }
        }
        if self.send_initial && self.bookmarks && !self.send(&self.view.bookmark(rv, true)).await {
            return;
        }
        let mut progress = rv;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(self.interval.max(Duration::from_millis(1)));
        ticker.tick().await;
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(change) => {
                        progress = progress.max(change.rv);
                        if !self.forward(&change).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.expire(&ApiError::expired("watcher fell too far behind; too old resource version")).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick(), if self.bookmarks => {
                    if !self.send(&self.view.bookmark(progress, false)).await {
                        return;
                    }
                }
                () = &mut deadline => return,
                () = self.shutdown.cancelled() => return,
                () = self.tx.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod authorization_tests {
    use super::*;

    fn verb(method: Method, path: &str, query: &[(&str, &str)]) -> Option<(String, String)> {
        let query: Query = query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        authorization_attributes(&method, path, &query)
            .map(|(verb, _, resource, ..)| (verb, resource))
    }

    fn pair(verb: &str, resource: &str) -> Option<(String, String)> {
        Some((verb.to_owned(), resource.to_owned()))
    }

    #[test]
    fn requests_read_as_kube_apiservers_authorizer_reads_them() {
        let servers =
            "/apis/infrastructure.cluster.x-k8s.io/v1beta2/namespaces/ns/openstackservers";
        assert_eq!(
            verb(Method::GET, servers, &[]),
            pair("list", "openstackservers")
        );
        assert_eq!(
            verb(Method::GET, servers, &[("watch", "True")]),
            pair("watch", "openstackservers")
        );
        assert_eq!(
            verb(Method::GET, servers, &[("watch", "0")]),
            pair("list", "openstackservers")
        );
        let one = format!("{servers}/a");
        assert_eq!(
            verb(Method::GET, &one, &[("watch", "true")]),
            pair("get", "openstackservers")
        );
        assert_eq!(
            verb(Method::DELETE, servers, &[]),
            pair("deletecollection", "openstackservers")
        );
        assert_eq!(
            verb(Method::PATCH, &format!("{one}/status"), &[]),
            pair("patch", "openstackservers/status")
        );
        assert_eq!(
            verb(Method::PUT, "/api/v1/namespaces/ns/finalize", &[]),
            pair("update", "namespaces/finalize")
        );
        assert_eq!(verb(Method::GET, "/apis", &[]), None);
    }
}
