//! A blocking client of the node's HTTP API for the tests (ureq), and a
//! reader of its Server-Sent Events.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use serde_json::Value;

use super::node::NodeProc;

pub const WAIT: Duration = Duration::from_secs(20);

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout_connect(WAIT).timeout_read(WAIT).timeout_write(WAIT).build()
}

/// The node's API token (`<data-dir>/api-token`).
pub fn token(n: &NodeProc) -> String {
    std::fs::read_to_string(n.data_dir.join("api-token")).expect("the token file").trim().to_owned()
}

/// `method path` with a JSON body if given and `Bearer token` if given:
/// the status and the body (JSON, or a string for anything else).
pub fn request(n: &NodeProc, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> (u16, Value) {
    let mut req = agent().request(method, &format!("http://{}{path}", n.admin));
    if let Some(t) = token {
        req = req.set("authorization", &format!("Bearer {t}"));
    }
    let result = match body {
        Some(b) => req.set("content-type", "application/json").send_string(&b.to_string()),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let json = response.content_type() == "application/json";
    let text = response.into_string().expect("a body");
    (status, if json { serde_json::from_str(&text).expect("JSON as said") } else { Value::String(text) })
}

pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("an error body: {body}"))
}

#[derive(Debug)]
pub struct SseEvent {
    pub id: u64,
    pub kind: String,
    pub data: Value,
}

/// Reads the next SSE event from an open stream (comments skipped); `None`
/// at its end.
pub fn next_sse(r: &mut impl BufRead) -> Option<SseEvent> {
    let (mut id, mut kind, mut data) = (None, String::new(), None);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if let (Some(id), Some(data)) = (id, data.take()) {
                return Some(SseEvent { id, kind, data });
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().parse().unwrap());
        } else if let Some(v) = line.strip_prefix("event:") {
            kind = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data = Some(serde_json::from_str(v.trim()).unwrap());
        }
    }
}

/// Opens `GET …/events{query}`, with `Last-Event-ID` if given.
pub fn open_events(n: &NodeProc, token: &str, scope_hex: &str, query: &str, last_id: Option<u64>) -> BufReader<Box<dyn Read + Send + Sync>> {
    let mut req = agent().get(&format!("http://{}/v1/scopes/{scope_hex}/events{query}", n.admin)).set("authorization", &format!("Bearer {token}"));
    if let Some(id) = last_id {
        req = req.set("last-event-id", &id.to_string());
    }
    let response = req.call().expect("the event stream opens");
    assert_eq!(response.content_type(), "text/event-stream");
    BufReader::new(response.into_reader())
}
