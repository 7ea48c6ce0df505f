//! A small blocking client of the node's application API (API.md): one
//! method per route, typed answers, and a scope's events as an iterator
//! that follows live and resumes by itself.
//!
//! Plain HTTP/1.1 (the API listens on the node's admin address, loopback by
//! default), over `ureq`. Byte strings are always sent as `X_hex`, so any
//! bytes pass; answers carry `X_hex`, and `X` too when the bytes are UTF-8.
//!
//! ```no_run
//! use dagfold::client::{Action, Client};
//! let client = Client::from_data_dir("./dagfold-data".as_ref())?;
//! let scope = client.create_scope("team")?.scope;
//! client.write(&scope, &[Action::put("notes", "a", "hello")], &[])?;
//! for event in client.events(&scope, 1) {
//!     println!("{:?}", event?);
//! }
//! # Ok::<(), dagfold::client::Error>(())
//! ```

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The file in a node's data directory holding its API address (one line,
/// `HOST:PORT`, the address bound), rewritten at each start of the node.
pub const API_ADDRESS_FILE: &str = "api-address";
/// The file in a node's data directory holding its API token (hex), unless
/// the node was given `--api-token-file`.
pub const API_TOKEN_FILE: &str = "api-token";

/// A request's whole time (connect, send, answer). Every route but the
/// events answers once its op is durable: seconds at the very most.
const REQUEST_TIMEOUT_MS: u64 = 30_000;
/// The events stream's read timeout: the API sends a keep-alive comment
/// every 15 s (`api::events::EVENTS_KEEP_ALIVE_MS`), so three missed ones
/// mean the connection is dead and the stream reconnects.
const EVENTS_READ_TIMEOUT_MS: u64 = 45_000;
/// The wait before reconnecting an events stream, doubled after each failed
/// attempt up to the max, back to the min once an event arrives: a node
/// restarting is found within 5 s of being up, and a node gone costs one
/// request per 5 s.
const EVENTS_BACKOFF_MS_MIN: u64 = 100;
const EVENTS_BACKOFF_MS_MAX: u64 = 5_000;
/// The longest SSE line read: an event's `data:` line holds its data twice
/// (hex and text) within an op of at most `FRAME_BYTES_MAX`, plus a little.
const EVENT_LINE_BYTES_MAX: u64 = 3 * crate::limits::FRAME_BYTES_MAX as u64 + 4096;
/// The longest answer read from a route other than the events.
const ANSWER_BYTES_MAX: u64 = 16 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The API's own error: `{"error": {"code", "message"}}` with its status.
    #[error("{message} ({code}, HTTP {status})")]
    Api { status: u16, code: String, message: String },
    /// No answer: the node is not reachable there, or the connection broke.
    #[error("cannot reach the node's API at {base}: {source}")]
    Transport { base: String, source: Box<ureq::Transport> },
    /// An answer that is not what API.md says (not JSON, other fields).
    #[error("an answer not as API.md says (HTTP {status}): {why}")]
    Unexpected { status: u16, why: String },
    /// The address or token could not be found or read.
    #[error("cannot read {}: {source}", path.display())]
    Config { path: PathBuf, source: std::io::Error },
    /// The events came out of order: the stream stops rather than skip one.
    #[error("event {got} came after event {last}: the stream stops rather than skip or repeat one")]
    OutOfOrder { last: u64, got: u64 },
}

impl Error {
    /// The API error's code (`unknown_scope`, `not_found`, ...), if it is one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Worth trying again as it is: no answer, or 503 `unavailable`.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Transport { .. } | Error::Api { status: 503, .. })
    }
}

/// A member's role in a scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Reader,
    Writer,
    Admin,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "reader" => Ok(Role::Reader),
            "writer" => Ok(Role::Writer),
            "admin" => Ok(Role::Admin),
            _ => Err(format!("a role is reader, writer or admin, not {s:?}")),
        }
    }
}

/// `GET /v1/identity`: the node's keys (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub public_key: String,
    pub kem_public_key: String,
}

/// `GET /v1/health`, `GET /v1/ready`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    pub status: String,
}

/// `GET /v1/scopes/{scope}`: SPEC §11's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeStatus {
    pub scope: String,
    pub root: String,
    pub data_heads: Vec<String>,
    pub governance_heads: Vec<String>,
    pub applied: u64,
    pub pending: u64,
    pub key_waiting: u64,
    pub data_key_waiting: u64,
}

/// `POST /v1/scopes`: the new scope and its genesis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedScope {
    pub scope: String,
    pub op: String,
}

/// `GET /v1/scopes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scopes {
    pub scopes: Vec<ScopeEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeEntry {
    pub scope: String,
    pub name: Option<String>,
    /// The node's own role; `None` if it is not a member.
    pub role: Option<Role>,
}

/// `GET /v1/scopes/{scope}/members`: `G` at the node's governance heads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    pub members: Vec<Member>,
    pub current_key_id: Option<String>,
    pub keys: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub public_key: String,
    pub kem_public_key: Option<String>,
    pub role: Role,
}

/// The op a governance write made (member add, role, remove).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpMade {
    pub op: String,
}

/// `POST /v1/scopes/{scope}/keys/rotate`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotated {
    pub op: String,
    pub key_id: String,
}

/// `POST /v1/scopes/{scope}/ops`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    pub op: String,
    pub root: String,
    /// The first event's sequence number; `None` without events.
    pub first_event_seq: Option<u64>,
}

/// An item: the SPEC §8 cell of one entity and key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub entity: String,
    pub key_hex: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `None` for a tombstone or a counter-only cell.
    pub value_hex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub deleted: bool,
    pub counter: i64,
    /// `None` when no Put or Delete touched the cell (likewise `author`).
    pub hlc: Option<u64>,
    pub author: Option<String>,
}

/// `GET /v1/scopes/{scope}/entities/{entity}/items`: one page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Items {
    pub items: Vec<Item>,
    /// Where the next page starts; `None` at the end.
    pub next_after_hex: Option<String>,
}

/// `GET /v1/scopes/{scope}/entities`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entities {
    pub entities: Vec<String>,
}

/// One event of a scope (SPEC §6.6), as the events stream carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeEvent {
    pub seq: u64,
    pub op: String,
    pub kind: String,
    pub data_hex: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

/// One action of a data op (`Client::write`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Put { entity: String, key: Vec<u8>, value: Vec<u8> },
    Delete { entity: String, key: Vec<u8> },
    Add { entity: String, key: Vec<u8>, amount: i64 },
}

impl Action {
    pub fn put(entity: impl Into<String>, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Action {
        Action::Put { entity: entity.into(), key: key.as_ref().to_vec(), value: value.as_ref().to_vec() }
    }

    pub fn delete(entity: impl Into<String>, key: impl AsRef<[u8]>) -> Action {
        Action::Delete { entity: entity.into(), key: key.as_ref().to_vec() }
    }

    pub fn add(entity: impl Into<String>, key: impl AsRef<[u8]>, amount: i64) -> Action {
        Action::Add { entity: entity.into(), key: key.as_ref().to_vec(), amount }
    }

    fn to_json(&self) -> Value {
        match self {
            Action::Put { entity, key, value } => {
                json!({"put": {"entity": entity, "key_hex": hex::encode(key), "value_hex": hex::encode(value)}})
            }
            Action::Delete { entity, key } => json!({"delete": {"entity": entity, "key_hex": hex::encode(key)}}),
            Action::Add { entity, key, amount } => json!({"add": {"entity": entity, "key_hex": hex::encode(key), "amount": amount}}),
        }
    }
}

/// One event a data op carries (`Client::write`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: String,
    pub data: Vec<u8>,
}

impl Event {
    pub fn new(kind: impl Into<String>, data: impl AsRef<[u8]>) -> Event {
        Event { kind: kind.into(), data: data.as_ref().to_vec() }
    }
}

/// A client of one node's API.
pub struct Client {
    agent: ureq::Agent,
    events_agent: ureq::Agent,
    base: String,
    token: String,
}

impl Client {
    /// `base`: `HOST:PORT` or an `http://` URL; `token`: the API token (hex).
    pub fn new(base: &str, token: &str) -> Client {
        let base = base.trim().trim_end_matches('/');
        let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_millis(REQUEST_TIMEOUT_MS)).build();
        let events_agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .timeout_read(Duration::from_millis(EVENTS_READ_TIMEOUT_MS))
            .build();
        Client { agent, events_agent, base, token: token.trim().to_owned() }
    }

    /// The client of the node whose data directory is `dir`: its address
    /// from `<dir>/api-address`, its token from `<dir>/api-token`.
    pub fn from_data_dir(dir: &Path) -> Result<Client, Error> {
        Client::from_files(&dir.join(API_ADDRESS_FILE), &dir.join(API_TOKEN_FILE))
    }

    /// The address (`HOST:PORT` or URL) and the token, each read from a file.
    pub fn from_files(address_file: &Path, token_file: &Path) -> Result<Client, Error> {
        Ok(Client::new(&read_trimmed(address_file)?, &read_trimmed(token_file)?))
    }

    /// The address or URL with the token read from `token_file`.
    pub fn with_token_file(base: &str, token_file: &Path) -> Result<Client, Error> {
        Ok(Client::new(base, &read_trimmed(token_file)?))
    }

    /// The API's base URL, `http://HOST:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn identity(&self) -> Result<Identity, Error> {
        self.call("GET", "/v1/identity", None)
    }

    pub fn health(&self) -> Result<Serving, Error> {
        self.call("GET", "/v1/health", None)
    }

    /// `Ok` once the node is ready; while it starts or drains, the API's 503.
    pub fn ready(&self) -> Result<Serving, Error> {
        self.call("GET", "/v1/ready", None)
    }

    pub fn scope_status(&self, scope: &str) -> Result<ScopeStatus, Error> {
        self.call("GET", &format!("/v1/scopes/{}", seg(scope)), None)
    }

    pub fn create_scope(&self, name: &str) -> Result<CreatedScope, Error> {
        self.call("POST", "/v1/scopes", Some(json!({ "name": name })))
    }

    pub fn scopes(&self) -> Result<Scopes, Error> {
        self.call("GET", "/v1/scopes", None)
    }

    /// Accept this scope's genesis when it arrives. API.md names no fields
    /// of the answer: it is given as it came.
    pub fn follow(&self, scope: &str) -> Result<Value, Error> {
        self.call("POST", &format!("/v1/scopes/{}/follow", seg(scope)), None)
    }

    pub fn members(&self, scope: &str) -> Result<Members, Error> {
        self.call("GET", &format!("/v1/scopes/{}/members", seg(scope)), None)
    }

    pub fn add_member(&self, scope: &str, public_key: &str, kem_public_key: &str, role: Role) -> Result<OpMade, Error> {
        let body = json!({ "public_key": public_key, "kem_public_key": kem_public_key, "role": role });
        self.call("POST", &format!("/v1/scopes/{}/members", seg(scope)), Some(body))
    }

    pub fn set_role(&self, scope: &str, public_key: &str, role: Role) -> Result<OpMade, Error> {
        self.call("PUT", &format!("/v1/scopes/{}/members/{}", seg(scope), seg(public_key)), Some(json!({ "role": role })))
    }

    pub fn remove_member(&self, scope: &str, public_key: &str) -> Result<OpMade, Error> {
        self.call("DELETE", &format!("/v1/scopes/{}/members/{}", seg(scope), seg(public_key)), None)
    }

    pub fn rotate_key(&self, scope: &str) -> Result<Rotated, Error> {
        self.call("POST", &format!("/v1/scopes/{}/keys/rotate", seg(scope)), None)
    }

    /// One data op with `actions` and `events`, answered once durable.
    pub fn write(&self, scope: &str, actions: &[Action], events: &[Event]) -> Result<Written, Error> {
        let events: Vec<Value> = events.iter().map(|e| json!({"kind": e.kind, "data_hex": hex::encode(&e.data)})).collect();
        let body = json!({ "actions": actions.iter().map(Action::to_json).collect::<Vec<_>>(), "events": events });
        self.call("POST", &format!("/v1/scopes/{}/ops", seg(scope)), Some(body))
    }

    /// The item of `entity` and `key`; the API's 404 `not_found` if no cell.
    pub fn get_item(&self, scope: &str, entity: &str, key: &[u8]) -> Result<Item, Error> {
        self.call("GET", &format!("/v1/scopes/{}/entities/{}/items/{}", seg(scope), seg(entity), hex::encode(key)), None)
    }

    /// One page of `entity`'s items in key-byte order, after `after` (a key),
    /// at most `limit` (the API's default 100 without it).
    pub fn list_items(&self, scope: &str, entity: &str, after: Option<&[u8]>, limit: Option<u32>) -> Result<Items, Error> {
        let mut query = Vec::new();
        if let Some(after) = after {
            query.push(format!("after_hex={}", hex::encode(after)));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
        self.call("GET", &format!("/v1/scopes/{}/entities/{}/items{query}", seg(scope), seg(entity)), None)
    }

    pub fn entities(&self, scope: &str) -> Result<Entities, Error> {
        self.call("GET", &format!("/v1/scopes/{}/entities", seg(scope)), None)
    }

    /// The events of `scope` from sequence number `from` (1: all), then
    /// live, for as long as it is iterated. After a disconnect (the node
    /// restarting, a lag, a dead connection) it reconnects by itself with
    /// `Last-Event-ID`, waiting 0.1 s doubling up to 5 s between attempts:
    /// each event comes once, in order. It ends after an error the API
    /// gives (an unknown scope, a bad token), which it yields.
    pub fn events(&self, scope: &str, from: u64) -> Events<'_> {
        Events { client: self, path: format!("/v1/scopes/{}/events", seg(scope)), from, last: None, stream: None, backoff_ms: 0, done: false }
    }

    fn request(&self, agent: &ureq::Agent, method: &str, path: &str) -> ureq::Request {
        agent.request(method, &format!("{}{path}", self.base)).set("Authorization", &format!("Bearer {}", self.token))
    }

    fn call<T: serde::de::DeserializeOwned>(&self, method: &str, path: &str, body: Option<Value>) -> Result<T, Error> {
        let req = self.request(&self.agent, method, path);
        let sent = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(&b.to_string()),
            None => req.call(),
        };
        let resp = self.answer(sent)?;
        let status = resp.status();
        let mut text = String::new();
        resp.into_reader()
            .take(ANSWER_BYTES_MAX)
            .read_to_string(&mut text)
            .map_err(|e| Error::Unexpected { status, why: format!("reading the answer: {e}") })?;
        // A route answering 200 with no body (API.md names none for some).
        let text = if text.trim().is_empty() { "null" } else { &text };
        serde_json::from_str(text).map_err(|e| Error::Unexpected { status, why: format!("{e}: {}", clip(text)) })
    }

    /// The response of a request sent, or its error: a non-2xx answer
    /// becomes the API's error, read from its body.
    fn answer(&self, sent: Result<ureq::Response, ureq::Error>) -> Result<ureq::Response, Error> {
        match sent {
            Ok(resp) => Ok(resp),
            Err(ureq::Error::Transport(t)) => Err(Error::Transport { base: self.base.clone(), source: Box::new(t) }),
            Err(ureq::Error::Status(status, resp)) => {
                let mut text = String::new();
                let _ = resp.into_reader().take(ANSWER_BYTES_MAX).read_to_string(&mut text);
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                match (v["error"]["code"].as_str(), v["error"]["message"].as_str()) {
                    (Some(code), Some(message)) => Err(Error::Api { status, code: code.to_owned(), message: message.to_owned() }),
                    _ => Err(Error::Unexpected { status, why: format!("no API error in {:?}", clip(&text)) }),
                }
            }
        }
    }
}

/// A scope's events, live: see `Client::events`.
pub struct Events<'a> {
    client: &'a Client,
    path: String,
    from: u64,
    /// The last event yielded: a reconnection resumes after it.
    last: Option<u64>,
    stream: Option<BufReader<Box<dyn Read + Send + Sync + 'static>>>,
    /// The wait before the next connection attempt (0: none).
    backoff_ms: u64,
    done: bool,
}

impl Iterator for Events<'_> {
    type Item = Result<ScopeEvent, Error>;

    fn next(&mut self) -> Option<Result<ScopeEvent, Error>> {
        while !self.done {
            let Some(stream) = self.stream.as_mut() else {
                if let Err(e) = self.connect() {
                    if !e.is_retryable() {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                continue;
            };
            match read_sse_event(stream) {
                Ok(Some(data)) => {
                    let ev: ScopeEvent = match serde_json::from_str(&data) {
                        Ok(ev) => ev,
                        Err(e) => {
                            self.done = true;
                            return Some(Err(Error::Unexpected { status: 200, why: format!("an event that is not API.md's ({e}): {}", clip(&data)) }));
                        }
                    };
                    let expected = self.last.map_or(self.from.max(1), |l| l + 1);
                    if ev.seq < expected {
                        continue; // already yielded
                    }
                    if self.last.is_some() && ev.seq != expected {
                        self.done = true;
                        return Some(Err(Error::OutOfOrder { last: expected - 1, got: ev.seq }));
                    }
                    self.last = Some(ev.seq);
                    self.backoff_ms = 0;
                    return Some(Ok(ev));
                }
                // The end of the stream (the node draining, a lag) or a
                // broken one: resume after the last event.
                Ok(None) | Err(_) => self.stream = None,
            }
        }
        None
    }
}

impl Events<'_> {
    fn connect(&mut self) -> Result<(), Error> {
        if self.backoff_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.backoff_ms));
        }
        self.backoff_ms = (self.backoff_ms * 2).clamp(EVENTS_BACKOFF_MS_MIN, EVENTS_BACKOFF_MS_MAX);
        let req = self.client.request(&self.client.events_agent, "GET", &self.path).set("Accept", "text/event-stream");
        let req = match self.last {
            Some(last) => req.set("Last-Event-ID", &last.to_string()),
            None => req.query("from", &self.from.to_string()),
        };
        let resp = self.client.answer(req.call())?;
        self.stream = Some(BufReader::new(resp.into_reader()));
        Ok(())
    }
}

/// Reads one SSE event and answers its `data` (lines joined by `\n`);
/// `None` at the end of the stream. Comments, `id`, `event` and `retry`
/// are passed over: the data holds the sequence number and the kind.
fn read_sse_event(stream: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut data: Option<String> = None;
    let mut line = String::new();
    loop {
        line.clear();
        let n = stream.by_ref().take(EVENT_LINE_BYTES_MAX).read_line(&mut line)?;
        if n == 0 {
            return Ok(None);
        }
        if !line.ends_with('\n') {
            if n as u64 >= EVENT_LINE_BYTES_MAX {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "an event line over EVENT_LINE_BYTES_MAX"));
            }
            return Ok(None); // cut off by the end of the stream
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            if let Some(d) = data.take() {
                return Ok(Some(d));
            }
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
}

/// A path segment, percent-encoded but for RFC 3986's unreserved bytes.
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn read_trimmed(path: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Config { path: path.to_path_buf(), source })?;
    Ok(text.trim().to_owned())
}

/// At most 200 characters of `text`, for an error message.
fn clip(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_read_whole_with_comments_and_fields_passed_over() {
        let text = ": keep-alive\n\nid: 1\nevent: k\ndata: {\"a\":1}\n\nretry: 5\ndata: x\ndata:y\n\ndata: cut";
        let mut r = BufReader::new(text.as_bytes());
        assert_eq!(read_sse_event(&mut r).unwrap().as_deref(), Some("{\"a\":1}"));
        assert_eq!(read_sse_event(&mut r).unwrap().as_deref(), Some("x\ny"));
        assert_eq!(read_sse_event(&mut r).unwrap(), None, "an event cut off is not one");
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(seg("a b/c%"), "a%20b%2Fc%25");
        assert_eq!(seg("ok-1._~"), "ok-1._~");
    }

    #[test]
    fn actions_send_bytes_as_hex() {
        assert_eq!(Action::put("e", [0xff], "v").to_json(), json!({"put": {"entity": "e", "key_hex": "ff", "value_hex": "76"}}));
        assert_eq!(Action::add("e", "k", -2).to_json(), json!({"add": {"entity": "e", "key_hex": "6b", "amount": -2}}));
    }

    /// A server that answers each connection with the next of `bodies` as
    /// an event stream, then closes it; hands over each request's head.
    fn sse_server(bodies: Vec<String>) -> (String, std::sync::mpsc::Receiver<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for body in bodies {
                let (mut conn, _) = listener.accept().unwrap();
                let mut head = String::new();
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                while reader.read_line(&mut head).unwrap() > 2 && !head.ends_with("\r\n\r\n") {}
                tx.send(head).unwrap();
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}");
                std::io::Write::write_all(&mut conn, answer.as_bytes()).unwrap();
            }
        });
        (addr, rx)
    }

    fn sse(seq: u64) -> String {
        format!("id: {seq}\nevent: k\ndata: {{\"seq\":{seq},\"op\":\"00\",\"kind\":\"k\",\"data_hex\":\"\"}}\n\n")
    }

    #[test]
    fn events_resume_after_the_last_one_without_repeating_or_skipping() {
        let first = format!("{}{}", sse(1), sse(2));
        // The server repeats event 2; then skips event 5.
        let second = format!(": hi\n\n{}{}{}", sse(2), sse(3), sse(5));
        let (addr, heads) = sse_server(vec![first, second]);
        let client = Client::new(&addr, "t");
        let mut events = client.events("s", 1);
        let seqs: Vec<u64> = events.by_ref().take(3).map(|e| e.unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(matches!(events.next(), Some(Err(Error::OutOfOrder { last: 3, got: 5 }))));
        assert!(events.next().is_none(), "the stream stops after a gap");
        let (h1, h2) = (heads.recv().unwrap(), heads.recv().unwrap());
        assert!(h1.starts_with("GET /v1/scopes/s/events?from=1 ") && h1.contains("Bearer t"), "{h1}");
        assert!(h2.to_ascii_lowercase().contains("last-event-id: 2\r\n"), "{h2}");
    }

    #[test]
    fn a_base_without_scheme_is_http() {
        assert_eq!(Client::new("127.0.0.1:7401", "t").base(), "http://127.0.0.1:7401");
        assert_eq!(Client::new("http://h:1/", "t").base(), "http://h:1");
    }
}
