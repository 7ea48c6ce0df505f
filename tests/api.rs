//! The application API (API.md) and SPEC §11's status, against the
//! `dagfold` binary over loopback HTTP: what needs the token and what does
//! not, the error bodies, the reads of a scope sent over QUIC, and the
//! events as Server-Sent Events. Every wait is bounded.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::api::*;
use common::node::*;
use dagfold::core::projection::Projection;
use dagfold::protocol::crypto::{key_id_of, seal_payload};
use dagfold::protocol::{encode, Action, DataPayload, Event, Hash, Op, ZERO, PLANE_DATA};
use dagfold::workload::{generate, sign_op, Workload, WorkloadConfig};
use serde_json::Value;

/// A node on loopback in a fresh data directory, and its API token.
fn start() -> (tempfile::TempDir, NodeProc, String) {
    let dir = tempfile::tempdir().unwrap();
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &[]);
    let token = token(&n);
    (dir, n, token)
}

/// `method path` with `Bearer token` if given (no body).
fn call(n: &NodeProc, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    request(n, method, path, token, None)
}

fn get(n: &NodeProc, path: &str, token: &str) -> (u16, Value) {
    call(n, "GET", path, Some(token))
}

/// Writes raw bytes to the API and reads the whole response (the request
/// asks the server to close after it).
fn raw_exchange(n: &NodeProc, request: &[u8]) -> String {
    let mut stream = TcpStream::connect_timeout(&n.admin, WAIT).expect("connect");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.set_write_timeout(Some(WAIT)).unwrap();
    // The server may answer and close before taking all of a large request.
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// A scope for node `n` by the workload's keys: genesis, the group key
/// delivered to the node, the governance op adding one writer and the node
/// (a reader); no data ops yet.
fn scope_for(n: &NodeProc, seed: u64) -> Workload {
    let (pk, kem) = n.identity();
    generate(&WorkloadConfig { seed, writers: 1, data_ops: 0, ..Default::default() }, pk, kem)
}

/// Data ops by the workload's writer, in a chain, with honest roots.
struct Writer<'a> {
    w: &'a Workload,
    projection: Projection,
    last: Option<Hash>,
    hlc: u64,
}

impl Writer<'_> {
    fn new(w: &Workload) -> Writer<'_> {
        Writer { w, projection: Projection::default(), last: None, hlc: 10_000 }
    }

    fn op(&mut self, actions: Vec<Action>, events: Vec<Event>) -> Vec<u8> {
        let author = &self.w.writers[0];
        self.hlc += 1;
        self.projection.apply(self.hlc, &author.public_key, &actions);
        let plain = encode(&DataPayload { root_hash: self.projection.root(), actions, events });
        let key = self.w.keys[0];
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&self.hlc.to_le_bytes());
        let mut op = Op {
            version: 1,
            scope: self.w.scope,
            plane: PLANE_DATA,
            author: [0; 32],
            parents: self.last.into_iter().collect(),
            cut: self.w.governance_heads.clone(),
            hlc: self.hlc,
            key_id: key_id_of(&key),
            nonce,
            payload: seal_payload(&key, &nonce, &self.w.scope, PLANE_DATA, &plain),
            signature: [0; 64],
        };
        let (frame, id) = sign_op(&mut op, author);
        self.last = Some(id);
        frame
    }
}

fn put(entity: &str, key: &str, value: &str) -> Action {
    Action::Put { entity: entity.into(), key: key.into(), value: value.into() }
}

fn event(kind: &str, data: &[u8]) -> Vec<Event> {
    vec![Event { kind: kind.into(), data: data.to_vec() }]
}

/// Sends `frames` and waits until the scope has `applied` ops.
fn deliver(n: &NodeProc, scope: &Hash, frames: &[Vec<u8>], applied: u64) {
    send_frames(n.listen, frames, 1, 1);
    assert!(
        wait_until(WAIT, || n.scope(scope).is_some_and(|s| s["applied"].as_u64() == Some(applied))),
        "the scope reaches {applied} applied ops: {:?}",
        n.scope(scope)
    );
}

fn frames_of(w: &Workload) -> Vec<Vec<u8>> {
    w.messages.iter().map(|m| m.frame.clone()).collect()
}

fn governance_ops(w: &Workload) -> u64 {
    w.messages.iter().filter(|m| m.id != ZERO).count() as u64
}

/// Health and readiness; SPEC §11's routes without a token and with their
/// answers; every other route 401 without the token or with a wrong one;
/// errors as `{"error": {"code", "message"}}` with API.md's statuses; the
/// token file private and named in the node's first line.
#[test]
fn public_routes_the_token_and_errors() {
    let (dir, n, token) = start();
    let token_file = dir.path().join("api-token");
    assert_eq!(n.first_line["api_token_file"].as_str(), token_file.to_str(), "the first line names the token file");
    assert_eq!(token.len(), 64);
    assert!(hex::decode(&token).is_ok());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600, "the token file is 0600");
    }

    assert_eq!(call(&n, "GET", "/v1/health", None).0, 200);
    assert_eq!(call(&n, "GET", "/v1/ready", None).0, 200);
    let (status, identity) = call(&n, "GET", "/v1/identity", None);
    assert_eq!(status, 200);
    let (pk, kem) = n.identity();
    assert_eq!(identity, serde_json::json!({ "public_key": hex::encode(pk), "kem_public_key": hex::encode(kem) }));
    let (status, metrics) = call(&n, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(metrics.as_str().is_some_and(|t| t.contains("# TYPE")), "Prometheus text: {metrics}");
    // The tree's hashing way, one this CPU has (the node measures its own).
    let ways: Vec<String> = dagfold::protocol::sha_lanes::Lanes::available()
        .iter()
        .map(|l| format!("dagfold_sha256_lanes{{way=\"{}\"}} 1", l.name()))
        .collect();
    let shown: Vec<&str> = metrics.as_str().unwrap_or("").lines().filter(|l| l.starts_with("dagfold_sha256_lanes")).collect();
    assert!(shown.len() == 1 && ways.iter().any(|w| w == shown[0]), "one hashing way of {ways:?}: {shown:?}");

    let w = scope_for(&n, 61);
    deliver(&n, &w.scope, &frames_of(&w), governance_ops(&w));
    let scope_hex = hex::encode(w.scope);
    let (status, st) = call(&n, "GET", &format!("/v1/scopes/{scope_hex}"), None);
    assert_eq!((status, st["scope"].as_str()), (200, Some(scope_hex.as_str())), "SPEC §11 status without a token");
    assert_eq!(st["applied"].as_u64(), Some(governance_ops(&w)));
    let (status, upper) = call(&n, "GET", &format!("/v1/scopes/{}", scope_hex.to_uppercase()), None);
    assert_eq!((status, &upper), (200, &st), "an id in upper case");
    for path in [
        format!("/v1/scopes/{}", "00".repeat(32)),
        format!("/v1/scopes/{}", "zz".repeat(32)),
        format!("/v1/scopes/{}", "5a".repeat(31)),
        "/v1/scopes/".to_owned(),
        "/nowhere".to_owned(),
    ] {
        let (status, body) = call(&n, "GET", &path, None);
        assert_eq!((status, error_code(&body)), (404, "not_found"), "{path}");
    }

    // The token: missing or wrong is 401, right is 200.
    for (given, want) in [(None, 401), (Some("00".repeat(32)), 401), (Some(token[..63].to_owned()), 401), (Some(token.clone()), 200)] {
        let (status, body) = call(&n, "GET", "/v1/scopes", given.as_deref());
        assert_eq!(status, want, "{given:?}: {body}");
        if want == 401 {
            assert_eq!(error_code(&body), "unauthenticated");
            assert!(body["error"]["message"].is_string());
        }
    }
    let (status, body) = call(&n, "GET", &format!("/v1/scopes/{scope_hex}/members"), None);
    assert_eq!((status, error_code(&body)), (401, "unauthenticated"), "members need the token");

    // API.md's errors.
    let unknown = "ab".repeat(32);
    let (status, body) = get(&n, &format!("/v1/scopes/{unknown}/members"), &token);
    assert_eq!((status, error_code(&body)), (404, "unknown_scope"));
    let (status, body) = get(&n, &format!("/v1/scopes/{scope_hex}/entities/e/items/zz"), &token);
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "bad hex");
    let (status, body) = get(&n, &format!("/v1/scopes/{scope_hex}/entities/e/items?after_hex=xyz"), &token);
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "bad hex in the query");
    let (status, body) = get(&n, "/v1/scopes/nothex/members", &token);
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "a scope id that is no id");
    let (status, body) = call(&n, "POST", "/v1/identity", None);
    assert_eq!((status, error_code(&body)), (405, "method_not_allowed"));

    // Raw: a body over 1 MiB is 413 before it is read; a head too large
    // is refused; keep-alive serves two requests on one connection.
    let over = format!(
        "POST /v1/scopes/{scope_hex}/events HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{{",
        (1 << 20) + 1
    );
    let answer = raw_exchange(&n, over.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains(r#""code":"too_large""#), "{answer}");
    let answer = raw_exchange(&n, &[b"GET /".as_slice(), &[b'a'; 40_000], b" HTTP/1.1\r\nconnection: close\r\n\r\n"].concat());
    assert!(answer.starts_with("HTTP/1.1 431 ") || answer.starts_with("HTTP/1.1 400 ") || answer.is_empty(), "{answer}");
    let two = raw_exchange(&n, b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\nGET /v1/identity HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert_eq!(two.matches("HTTP/1.1 200 OK").count(), 2, "keep-alive: {two}");
    assert!(two.contains("\r\ncontent-type: application/json\r\n"), "{two}");
    assert_eq!(call(&n, "GET", "/v1/health", None).0, 200, "the node still serves");
}

/// The reads of a scope whose ops came over QUIC: the scope's name and the
/// node's role, the members at the governance heads, items one at a time
/// and in pages, the entities.
#[test]
fn reads_of_a_scope_sent_over_quic() {
    let (_dir, n, token) = start();
    let w = scope_for(&n, 62);
    let mut frames = frames_of(&w);
    let mut writer = Writer::new(&w);
    // 250 keys in five ops, in an order that is not the keys' order.
    let keys: Vec<String> = (0..250).map(|i| format!("k{:03}", (i * 7) % 250)).collect();
    for chunk in keys.chunks(50) {
        frames.push(writer.op(chunk.iter().map(|k| put("items", k, &format!("v-{k}"))).collect(), event("put", b"batch")));
    }
    frames.push(writer.op(
        vec![
            Action::Add { entity: "a-counts".into(), key: "c".into(), amount: 5 },
            Action::Put { entity: "b-other".into(), key: vec![0xff, 0x00], value: vec![0xfe] },
            Action::Delete { entity: "items".into(), key: "k001".into() },
        ],
        event("mixed", &[0xff]),
    ));
    deliver(&n, &w.scope, &frames, governance_ops(&w) + 6);
    let scope_hex = hex::encode(w.scope);
    let (pk, kem) = n.identity();

    let (status, scopes) = get(&n, "/v1/scopes", &token);
    assert_eq!(status, 200);
    assert_eq!(scopes, serde_json::json!({ "scopes": [{ "scope": scope_hex, "name": "workload-62", "role": "reader" }] }));

    let (status, members) = get(&n, &format!("/v1/scopes/{scope_hex}/members"), &token);
    assert_eq!(status, 200, "{members}");
    let list = members["members"].as_array().unwrap();
    let listed: Vec<&str> = list.iter().map(|m| m["public_key"].as_str().unwrap()).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "members sorted by key");
    let mut want = vec![
        (hex::encode(w.admin.public_key), "admin"),
        (hex::encode(w.writers[0].public_key), "writer"),
        (hex::encode(pk), "reader"),
    ];
    want.sort();
    assert_eq!(list.iter().map(|m| (m["public_key"].as_str().unwrap().to_owned(), m["role"].as_str().unwrap())).collect::<Vec<_>>(), want);
    let me = list.iter().find(|m| m["public_key"] == hex::encode(pk)).unwrap();
    assert_eq!(me["kem_public_key"].as_str(), Some(hex::encode(kem).as_str()));
    let key_id = hex::encode(key_id_of(&w.keys[0]));
    assert_eq!(members["current_key_id"].as_str(), Some(key_id.as_str()));
    assert_eq!(members["keys"], serde_json::json!([key_id]));

    let items = format!("/v1/scopes/{scope_hex}/entities/items/items");
    let (status, item) = get(&n, &format!("{items}/{}", hex::encode("k007")), &token);
    assert_eq!(status, 200, "{item}");
    assert_eq!(item["entity"], "items");
    assert_eq!((item["key"].as_str(), item["key_hex"].as_str()), (Some("k007"), Some(hex::encode("k007").as_str())));
    assert_eq!((item["value"].as_str(), item["value_hex"].as_str()), (Some("v-k007"), Some(hex::encode("v-k007").as_str())));
    assert_eq!((item["deleted"].as_bool(), item["counter"].as_i64()), (Some(false), Some(0)));
    assert_eq!(item["author"].as_str(), Some(hex::encode(w.writers[0].public_key).as_str()));
    assert!(item["hlc"].as_u64().is_some());
    let (status, tombstone) = get(&n, &format!("{items}/{}", hex::encode("k001")), &token);
    assert_eq!((status, tombstone["deleted"].as_bool(), &tombstone["value_hex"]), (200, Some(true), &Value::Null));
    let (status, counter) = get(&n, &format!("/v1/scopes/{scope_hex}/entities/a-counts/items/{}", hex::encode("c")), &token);
    assert_eq!((status, counter["counter"].as_i64(), &counter["value_hex"], &counter["hlc"]), (200, Some(5), &Value::Null, &Value::Null));
    let (status, binary) = get(&n, &format!("/v1/scopes/{scope_hex}/entities/b-other/items/ff00"), &token);
    assert_eq!((status, binary["key_hex"].as_str(), binary["value_hex"].as_str()), (200, Some("ff00"), Some("fe")));
    assert!(binary.get("key").is_none() && binary.get("value").is_none(), "no text for bytes that are not UTF-8: {binary}");
    let (status, body) = get(&n, &format!("{items}/{}", hex::encode("k999")), &token);
    assert_eq!((status, error_code(&body)), (404, "not_found"), "no such cell");

    // Pages of 100: 100, 100, 50, ascending, the last with next_after_hex null.
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = after.as_ref().map_or(String::new(), |a| format!("&after_hex={a}"));
        let (status, page) = get(&n, &format!("{items}?limit=100{q}"), &token);
        assert_eq!(status, 200, "{page}");
        pages += 1;
        let got = page["items"].as_array().unwrap();
        all.extend(got.iter().map(|i| i["key"].as_str().unwrap().to_owned()));
        match page["next_after_hex"].as_str() {
            Some(next) => {
                assert_eq!(got.len(), 100);
                assert_eq!(next, got.last().unwrap()["key_hex"].as_str().unwrap());
                after = Some(next.to_owned());
            }
            None => {
                assert_eq!(got.len(), 50, "the last page");
                break;
            }
        }
        assert!(pages < 10);
    }
    assert_eq!(pages, 3);
    let mut want: Vec<String> = keys.clone();
    want.sort();
    assert_eq!(all, want, "every key once, in ascending byte order");
    let (status, page) = get(&n, &items, &token);
    assert_eq!((status, page["items"].as_array().unwrap().len()), (200, 100), "limit 100 by default");
    let (status, body) = get(&n, &format!("{items}?limit=1001"), &token);
    assert_eq!((status, error_code(&body)), (400, "bad_request"), "limit over 1000");
    let (status, page) = get(&n, &format!("/v1/scopes/{scope_hex}/entities/none/items"), &token);
    assert_eq!((status, &page), (200, &serde_json::json!({ "items": [], "next_after_hex": null })));

    let (status, entities) = get(&n, &format!("/v1/scopes/{scope_hex}/entities"), &token);
    assert_eq!(status, 200);
    assert_eq!(entities["entities"], serde_json::json!(["a-counts", "b-other", "items"]));

    // The index survives a restart (and is not rebuilt: it is there).
    let mut n = n;
    n.stop();
    n.restart();
    let (status, again) = get(&n, &format!("/v1/scopes/{scope_hex}/entities"), &token);
    assert_eq!((status, &again), (200, &entities));
}

/// One SSE event: its id, event name and data.
fn open_events(n: &NodeProc, token: &str, scope: &Hash, query: &str, last_id: Option<u64>) -> BufReader<Box<dyn Read + Send + Sync>> {
    common::api::open_events(n, token, &hex::encode(scope), query, last_id)
}

/// Events from `from=1`; a reconnection with `Last-Event-ID` gets the rest
/// exactly once, then a live event; an unknown scope is 404.
#[test]
fn events_resume_from_the_last_id_then_follow_live() {
    let (_dir, n, token) = start();
    let w = scope_for(&n, 63);
    let mut frames = frames_of(&w);
    let mut writer = Writer::new(&w);
    for i in 0..6u8 {
        frames.push(writer.op(vec![put("e", &format!("k{i}"), "v")], event(&format!("kind{i}"), &[i])));
    }
    deliver(&n, &w.scope, &frames, governance_ops(&w) + 6);

    let mut first = open_events(&n, &token, &w.scope, "?from=1", None);
    for seq in 1..=3u64 {
        let ev = next_sse(&mut first).expect("an event");
        assert_eq!((ev.id, ev.kind.as_str()), (seq, format!("kind{}", seq - 1).as_str()));
        assert_eq!(ev.data["seq"].as_u64(), Some(seq));
        assert_eq!(ev.data["kind"].as_str(), Some(ev.kind.as_str()));
        assert_eq!(ev.data["data_hex"].as_str(), Some(hex::encode([seq as u8 - 1]).as_str()));
        assert_eq!(ev.data["op"].as_str().map(str::len), Some(64));
    }
    drop(first);

    // `from` is ignored when Last-Event-ID is sent.
    let mut resumed = open_events(&n, &token, &w.scope, "?from=1", Some(3));
    let seqs: Vec<u64> = (0..3).map(|_| next_sse(&mut resumed).expect("an event").id).collect();
    assert_eq!(seqs, [4, 5, 6], "the rest, each once");
    let live = writer.op(vec![put("e", "live", "v")], event("live", b"now"));
    send_frames(n.listen, &[live], 1, 1);
    let ev = next_sse(&mut resumed).expect("the live event");
    assert_eq!((ev.id, ev.kind.as_str(), ev.data["data"].as_str()), (7, "live", Some("now")));

    let (status, body) = get(&n, &format!("/v1/scopes/{}/events", "ab".repeat(32)), &token);
    assert_eq!((status, error_code(&body)), (404, "unknown_scope"));
    let (status, body) = call(&n, "GET", &format!("/v1/scopes/{}/events", hex::encode(w.scope)), None);
    assert_eq!((status, error_code(&body)), (401, "unauthenticated"));
    let (status, body) = get(&n, &format!("/v1/scopes/{}/events?from=x", hex::encode(w.scope)), &token);
    assert_eq!((status, error_code(&body)), (400, "bad_request"));

    // The node drains: the open stream ends, and the node stops in time.
    let mut n = n;
    let stopping = std::time::Instant::now();
    n.stop();
    assert!(n.child.try_wait().unwrap().is_some_and(|s| s.success()), "the node stopped by itself");
    assert!(stopping.elapsed() < Duration::from_secs(10), "draining took {:?}", stopping.elapsed());
    assert!(next_sse(&mut resumed).is_none(), "the stream ended");
}
