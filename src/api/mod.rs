//! The application API (API.md) and SPEC §11's status, over HTTP/1.1 on the
//! node's admin address: axum's router on hyper's connections, bounded by
//! tower and tower-http layers and by the constants below.
//!
//! - Public: SPEC §11's `GET /v1/identity`, `GET /v1/scopes/{scope}` and
//!   `GET /metrics`, and `GET /v1/health`, `GET /v1/ready`.
//! - Everything else needs `Authorization: Bearer <token>` ([`ApiState`]'s
//!   token, from [`load_or_create_token`]), checked in constant time;
//!   each module hands its authenticated routes in as `routes()`
//!   (`reads`, `events`).
//! - Every error is `{"error": {"code", "message"}}` ([`ApiError`]), those
//!   of axum's extractors and tower-http's layers included
//!   ([`error_body`]).
//!
//! Handlers never block the pipeline's threads: statuses and the
//! governance replica are read under short read locks, the store through
//! its [`StoreReader`](crate::store::rocks::StoreReader) on tokio's blocking
//! pool.

pub mod events;
pub mod reads;
pub mod writes;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::limits::{API_BODY_BYTES_MAX, API_TOKEN_BYTES};
use crate::node::NodeShared;
use crate::protocol::Hash;

/// HTTP connections open at once. Each holds a task and a few KiB; an
/// event stream holds its connection for as long as it follows, so this is
/// the event streams' bound (`API_EVENT_STREAMS_MAX`) plus room for the
/// requests of the application and a scraper or two. Past it, connections
/// wait in the kernel's backlog.
pub const API_CONNECTIONS_MAX: usize = 256;

/// Reads handled at once over all connections (a response's body is sent
/// after): their store reads run on tokio's blocking pool, and this keeps a
/// burst from queueing more of them than a 2-core node works through at
/// once. Past it a read waits for a turn (tower's concurrency limit), it is
/// not refused. Writes, which mostly wait for their commit, are bounded by
/// `node::author::WRITES_IN_PROGRESS_MAX` instead, event streams by
/// `API_EVENT_STREAMS_MAX`.
pub const API_REQUESTS_CONCURRENT_MAX: usize = 32;

/// Time for a request's head to arrive once its connection is open or its
/// previous response was sent (hyper's header read timeout, which also
/// closes a keep-alive connection idle this long: measured, 5.0 s). A
/// client on the same host sends a head in one packet; 5 s tolerates a
/// slow link while closing slow-loris and idle connections quickly.
pub const API_HEADER_READ_TIMEOUT_MS: u64 = 5_000;

/// Bytes of a request's head that hyper buffers at most (its minimum is
/// 8 KiB, what common servers allow per header line). Our requests carry a
/// token and a few short headers.
pub const API_HEAD_BYTES_MAX: usize = 16 * 1024;

/// Time a handler has to produce its response's head (tower-http's
/// timeout; 408 after it). A listing reads at most 1,000 cells; 10 s
/// covers a slow disk without holding a slot forever. An event stream's
/// head is sent at once, its events after: they are not bounded by this.
pub const API_REQUEST_TIMEOUT_MS: u64 = 10_000;

/// Time one write of a response may wait for the client to read: metrics
/// text of a large node is some hundred KiB and a scraper reads it at
/// once; a client that stops reading (an event stream's included) has its
/// connection closed after this.
pub const API_RESPONSE_WRITE_TIMEOUT_MS: u64 = 10_000;

/// Time the connections have to finish once the node drains (event
/// streams end at once; a request in flight gets its answer).
pub const API_DRAIN_MS: u64 = 2_000;

/// Back-off after a failed `accept` (e.g. out of file descriptors), so the
/// loop does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;

/// What the handlers share.
pub struct ApiState {
    pub node: Arc<NodeShared>,
    /// The bearer token, as its hex text's bytes.
    token: Vec<u8>,
    /// The store is open and restored, and the QUIC endpoint listens.
    ready: AtomicBool,
    /// The node began to drain (SIGTERM or SIGINT): not ready any more.
    draining: AtomicBool,
    /// Turns true when the node begins to drain: event streams end (the
    /// server itself stops later, `serve`'s own signal).
    shutdown: watch::Receiver<bool>,
    /// Event streams open at once (`API_EVENT_STREAMS_MAX`).
    event_streams: Arc<Semaphore>,
}

impl ApiState {
    pub fn new(node: Arc<NodeShared>, token: String, shutdown: watch::Receiver<bool>) -> ApiState {
        ApiState {
            node,
            token: token.into_bytes(),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            shutdown,
            event_streams: Arc::new(Semaphore::new(crate::limits::API_EVENT_STREAMS_MAX)),
        }
    }

    /// The store is open and restored and the QUIC endpoint listens.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// The node drains: `/v1/ready` answers 503 from now on.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// The node drains: writes are refused (503).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining.load(Ordering::Acquire)
    }

    /// Whether `authorization` is `Bearer <token>`, compared in constant
    /// time (in the token's length, which is public).
    fn authenticates(&self, authorization: Option<&HeaderValue>) -> bool {
        use subtle::ConstantTimeEq;
        let Some(given) = authorization.and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")) else { return false };
        given.len() == self.token.len() && bool::from(given.ct_eq(&self.token))
    }
}

/// An answer other than success: a status, a code of API.md ("Encoding")
/// and a message for a person. The JSON is
/// `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthenticated() -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", "missing or wrong bearer token")
    }

    /// 403 with one of `not_an_admin`, `not_a_writer`, `not_a_member`.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn unknown_scope(scope: &Hash) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "unknown_scope", format!("no scope {} here", hex::encode(scope)))
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    /// 422: the receive path dropped the authored op; `reason` is SPEC §6's.
    pub fn rejected(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "rejected", reason)
    }

    /// 503, retryable: say which of the store, the drain or a bound.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// A failure of the node itself (a store read that failed).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, axum::Json(body)).into_response()
    }
}

/// A JSON request body: what does not parse (or is no JSON object of `T`)
/// is 400 `bad_request`, over `API_BODY_BYTES_MAX` 413 `too_large`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    /// The body is read as JSON whatever its `content-type` says (a client
    /// such as `curl -d` sends another): what matters is that it parses.
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(ApiError::too_large(e.body_text())),
            Err(e) => return Err(ApiError::bad_request(e.body_text())),
        };
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| ApiError::bad_request(format!("the body is not the JSON expected: {e}")))
    }
}

/// A byte string field `name` of a request object (API.md, "Encoding"):
/// `"name": "text"` (its UTF-8 bytes) or `"name_hex": "…"`, exactly one.
/// `None` when neither is there.
pub fn bytes_field_opt(obj: &serde_json::Map<String, serde_json::Value>, name: &str) -> Result<Option<Vec<u8>>, ApiError> {
    let hex_name = format!("{name}_hex");
    match (obj.get(name), obj.get(&hex_name)) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!("give one of `{name}` and `{hex_name}`, not both"))),
        (Some(serde_json::Value::String(text)), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, Some(serde_json::Value::String(h))) => Ok(Some(parse_hex(&hex_name, h)?)),
        (Some(_), None) | (None, Some(_)) => Err(ApiError::bad_request(format!("`{name}` and `{hex_name}` are strings"))),
        (None, None) => Ok(None),
    }
}

/// [`bytes_field_opt`] for a field that must be there.
pub fn bytes_field(obj: &serde_json::Map<String, serde_json::Value>, name: &str) -> Result<Vec<u8>, ApiError> {
    bytes_field_opt(obj, name)?.ok_or_else(|| ApiError::bad_request(format!("`{name}` or `{name}_hex` is missing")))
}

/// Puts the byte string `bytes` in a response object as API.md says:
/// `name_hex` always, `name` too when the bytes are valid UTF-8.
pub fn put_bytes_field(obj: &mut serde_json::Map<String, serde_json::Value>, name: &str, bytes: &[u8]) {
    obj.insert(format!("{name}_hex"), hex::encode(bytes).into());
    if let Ok(text) = std::str::from_utf8(bytes) {
        obj.insert(name.to_owned(), text.into());
    }
}

/// Bytes from hex (either case); `what` names the field or parameter.
pub fn parse_hex(what: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    hex::decode(text).map_err(|_| ApiError::bad_request(format!("`{what}` is not hex")))
}

/// A 32-byte id (a scope, a key) from 64 hex characters.
pub fn parse_id(what: &str, text: &str) -> Result<Hash, ApiError> {
    crate::protocol::parse_hash_hex(text).ok_or_else(|| ApiError::bad_request(format!("`{what}` is not 64 hex characters")))
}

/// The id of a scope whose genesis is applied here: 400 `bad_request` for
/// text that is no id, 404 `unknown_scope` for a scope not held.
pub fn known_scope(state: &ApiState, text: &str) -> Result<Hash, ApiError> {
    let scope = parse_id("scope", text)?;
    if state.node.pipeline.status.read().expect("status lock").contains_key(&scope) {
        Ok(scope)
    } else {
        Err(ApiError::unknown_scope(&scope))
    }
}

/// A query string's parameters; what does not parse is 400 `bad_request`.
pub fn query<T>(q: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>) -> Result<T, ApiError> {
    q.map(|axum::extract::Query(q)| q).map_err(|e| ApiError::bad_request(e.body_text()))
}

/// Runs `f` (store reads) on tokio's blocking pool, off the async workers.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(answer) => answer,
        // A panic in a handler is a programmer's error.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The router: the public routes, the authenticated ones of each module
/// (`reads::routes`, `events::routes`) behind the token, and the layers
/// every route shares.
pub fn router(state: Arc<ApiState>) -> Router {
    // Each module's authenticated routes join here, behind the token.
    let authenticated = Router::new()
        .merge(reads::routes().layer(tower::limit::GlobalConcurrencyLimitLayer::new(API_REQUESTS_CONCURRENT_MAX)))
        .merge(events::routes())
        .merge(writes::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/v1/identity", get(identity))
        .route("/v1/scopes/{scope}", get(scope_status))
        .route("/metrics", get(metrics_text))
        .route("/v1/health", get(health))
        .route("/v1/ready", get(ready))
        .merge(authenticated)
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(API_BODY_BYTES_MAX))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(API_BODY_BYTES_MAX))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_millis(API_REQUEST_TIMEOUT_MS)))
        .layer(middleware::map_response(error_body))
        .with_state(state)
}

async fn require_token(State(state): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    if !state.authenticates(req.headers().get(header::AUTHORIZATION)) {
        return ApiError::unauthenticated().into_response();
    }
    next.run(req).await
}

/// Gives an error that is not JSON (axum's 405 and extractor rejections,
/// tower-http's 413 and 408) the body every error has, with the code of its
/// status.
async fn error_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    };
    let message = status.canonical_reason().unwrap_or("error").to_lowercase();
    let (mut parts, _) = response.into_parts();
    let mut fresh = ApiError::new(status, code, message).into_response();
    // Keep what the original said besides its body (`allow` on a 405).
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    for (name, value) in parts.headers {
        if let Some(name) = name {
            fresh.headers_mut().entry(name).or_insert(value);
        }
    }
    fresh
}

fn json_text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// SPEC §11: `{"public_key", "kem_public_key"}`.
async fn identity(State(state): State<Arc<ApiState>>) -> Response {
    json_text(state.node.identity_json.clone())
}

/// SPEC §11: a scope's status; 404 for a scope whose genesis is not applied
/// here, or an id that is not 64 hex characters.
async fn scope_status(State(state): State<Arc<ApiState>>, axum::extract::Path(scope): axum::extract::Path<String>) -> Response {
    let status = crate::protocol::parse_hash_hex(&scope)
        .and_then(|scope| state.node.pipeline.status.read().expect("status lock").get(&scope).map(|s| s.to_json().to_string()));
    match status {
        Some(json) => json_text(json),
        None => ApiError::not_found("no such scope").into_response(),
    }
}

/// SPEC §11: Prometheus text exposition, with the process's resident
/// memory read as it is asked for (`dagfold_memory_bytes{part}` says what
/// of it the node's own structures hold).
async fn metrics_text(State(state): State<Arc<ApiState>>) -> Response {
    if let Some(bytes) = resident_bytes() {
        metrics::gauge!("dagfold_process_resident_bytes").set(bytes as f64);
    }
    let text = state.node.metrics.render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The process's resident memory (`VmRSS` of `/proc/self/status`), where
/// there is one.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kb * 1024)
}

async fn health() -> Response {
    axum::Json(serde_json::json!({ "status": "serving" })).into_response()
}

async fn ready(State(state): State<Arc<ApiState>>) -> Response {
    if state.is_ready() {
        axum::Json(serde_json::json!({ "status": "ready" })).into_response()
    } else if state.draining.load(Ordering::Acquire) {
        ApiError::unavailable("the node is draining").into_response()
    } else {
        ApiError::unavailable("the node is starting").into_response()
    }
}

/// The API's bearer token from `path`: kept if the file exists (its text,
/// trimmed, must be `API_TOKEN_BYTES` bytes in hex), else made from the
/// OS's randomness and written there with mode 0600 (created only if
/// missing, so two starts never write two tokens).
pub fn load_or_create_token(path: &Path) -> std::io::Result<String> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim();
            if token.len() != 2 * API_TOKEN_BYTES || hex::decode(token).is_err() {
                return Err(invalid(format!("{}: not an API token ({} bytes in hex)", path.display(), API_TOKEN_BYTES)));
            }
            return Ok(token.to_owned());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut bytes = [0u8; API_TOKEN_BYTES];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
    let token = hex::encode(bytes);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    Ok(token)
}

/// Serves the API on `listener` until `shutdown` turns true (or its sender
/// drops), then lets the connections finish for up to `API_DRAIN_MS`.
pub async fn serve(listener: TcpListener, state: Arc<ApiState>, mut shutdown: watch::Receiver<bool>) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let service = router(state);
    let slots = Arc::new(Semaphore::new(API_CONNECTIONS_MAX));
    let mut connections = tokio::task::JoinSet::new();
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);
    let (drain_tx, drain_rx) = watch::channel(false);
    loop {
        // A slot before the accept, so the bound holds at the socket.
        let slot = tokio::select! {
            biased;
            () = &mut stop => break,
            slot = slots.clone().acquire_owned() => slot.expect("the slot semaphore is never closed"),
        };
        let stream = tokio::select! {
            biased;
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(Duration::from_millis(API_RESPONSE_WRITE_TIMEOUT_MS)));
        let io = TokioIo::new(Box::pin(stream));
        let service = hyper_util::service::TowerToHyperService::new(service.clone());
        let mut drain = drain_rx.clone();
        connections.spawn(async move {
            let _slot = slot;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_millis(API_HEADER_READ_TIMEOUT_MS))
                .max_buf_size(API_HEAD_BYTES_MAX)
                .keep_alive(true)
                .serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = drain.wait_for(|d| *d) => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    let _ = drain_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_millis(API_DRAIN_MS), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_fields() {
        let obj = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(bytes_field(&obj(serde_json::json!({"key": "ab"})), "key"), Ok(b"ab".to_vec()));
        assert_eq!(bytes_field(&obj(serde_json::json!({"key_hex": "00ff"})), "key"), Ok(vec![0, 0xff]));
        assert_eq!(bytes_field(&obj(serde_json::json!({"key": "a", "key_hex": "00"})), "key").unwrap_err().code, "bad_request");
        assert_eq!(bytes_field(&obj(serde_json::json!({"key_hex": "zz"})), "key").unwrap_err().code, "bad_request");
        assert_eq!(bytes_field(&obj(serde_json::json!({})), "key").unwrap_err().code, "bad_request");
        assert_eq!(bytes_field_opt(&obj(serde_json::json!({})), "key"), Ok(None));
        let mut out = serde_json::Map::new();
        put_bytes_field(&mut out, "value", b"hi");
        put_bytes_field(&mut out, "key", &[0xff]);
        assert_eq!(serde_json::Value::Object(out), serde_json::json!({"value_hex": "6869", "value": "hi", "key_hex": "ff"}));
    }

    #[test]
    fn a_token_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-token");
        let token = load_or_create_token(&path).unwrap();
        assert_eq!(token.len(), 2 * API_TOKEN_BYTES);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(load_or_create_token(&path).unwrap(), token, "an existing token is kept");
        std::fs::write(&path, "not a token").unwrap();
        assert!(load_or_create_token(&path).is_err());
    }
}
