//! The API's writes (API.md, "Scopes and members", "Data"), against the
//! `dagfold` binary over loopback: each route's answers and refusals, two
//! nodes that write and read one scope and converge whatever the
//! interleaving, events once and in order across a SIGKILL, and a key
//! rotated while a member was offline reaching it when it comes back.

mod common;

use std::time::Duration;

use common::api::*;
use common::node::*;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn start(dir: &std::path::Path, extra: &[String]) -> NodeProc {
    NodeProc::start_with_policy(dir, loopback(free_port()), loopback(free_port()), extra)
}

fn ok(n: &NodeProc, t: &str, method: &str, path: &str, body: Option<Value>, want: u16) -> Value {
    let (status, v) = request(n, method, path, Some(t), body.as_ref());
    assert_eq!(status, want, "{method} {path}: {v}");
    v
}

fn refused(n: &NodeProc, t: &str, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let (status, v) = request(n, method, path, Some(t), body.as_ref());
    (status, error_code(&v).to_owned())
}

fn put(key: &str, value: &str) -> Value {
    json!({ "actions": [{ "put": { "entity": "notes", "key": key, "value": value } }] })
}

fn identity_of(n: &NodeProc) -> Value {
    request(n, "GET", "/v1/identity", None, None).1
}

#[test]
fn every_write_route_answers_and_refuses_as_api_md_says() {
    let dir = tempfile::tempdir().unwrap();
    let n = start(dir.path(), &[]);
    let t = token(&n);
    let me = identity_of(&n)["public_key"].as_str().unwrap().to_owned();
    assert_eq!(request(&n, "POST", "/v1/scopes", None, Some(&json!({"name": "x"}))).0, 401);
    let created = ok(&n, &t, "POST", "/v1/scopes", Some(json!({"name": "team"})), 201);
    let s = created["scope"].as_str().unwrap().to_owned();
    assert_eq!(created["op"], created["scope"], "a genesis names its scope");
    let list = ok(&n, &t, "GET", "/v1/scopes", None, 200);
    assert_eq!(list["scopes"], json!([{ "scope": s, "name": "team", "role": "admin" }]));

    // A data op with an event; its root is the scope's root once applied.
    let body = json!({ "actions": [{ "put": { "entity": "notes", "key": "a", "value": "hello" } },
                                   { "add": { "entity": "count", "key_hex": "00", "amount": -3 } }],
                       "events": [{ "kind": "note", "data": "hi" }] });
    let w = ok(&n, &t, "POST", &format!("/v1/scopes/{s}/ops"), Some(body), 201);
    assert_eq!(w["first_event_seq"], json!(1));
    let status = n.scope(&dagfold::protocol::parse_hash_hex(&s).unwrap()).unwrap();
    assert_eq!(status["root"], w["root"]);
    assert_eq!(status["data_heads"], json!([w["op"]]));
    let item = ok(&n, &t, "GET", &format!("/v1/scopes/{s}/entities/count/items/00"), None, 200);
    assert_eq!((item["counter"].as_i64(), item["value_hex"].is_null()), (Some(-3), true));
    let no_events = ok(&n, &t, "POST", &format!("/v1/scopes/{s}/ops"), Some(put("b", "2")), 201);
    assert_eq!(no_events["first_event_seq"], Value::Null);

    // Bad input changes nothing.
    let ops = format!("/v1/scopes/{s}/ops");
    let unknown = format!("/v1/scopes/{}/ops", "ab".repeat(32));
    assert_eq!(refused(&n, &t, "POST", &unknown, Some(put("a", "1"))), (404, "unknown_scope".into()));
    assert_eq!(refused(&n, &t, "POST", &ops, Some(json!({"actions": [{"put": {"entity": "e", "key": "k"}}]}))).0, 400);
    assert_eq!(refused(&n, &t, "POST", &ops, Some(json!({"actions": [{"put": {"entity": "e", "key": "k", "key_hex": "00", "value": "v"}}]}))).0, 400);
    assert_eq!(refused(&n, &t, "POST", &ops, Some(json!({"actions": [{"move": {}}]}))).0, 400);
    assert_eq!(refused(&n, &t, "POST", &ops, Some(json!([1, 2]))).0, 400);
    let big = json!({ "actions": [{ "put": { "entity": "e", "key": "k", "value": "v".repeat(300_000) } }] });
    assert_eq!(refused(&n, &t, "POST", &ops, Some(big)), (413, "too_large".into()));

    // Members: add, a second add, a role, a removal with its rotation.
    let other = dagfold::core::Identity::from_secrets([5; 32], [6; 32]);
    let (pk, kem) = (hex::encode(other.public_key), hex::encode(other.kem_public));
    let members = format!("/v1/scopes/{s}/members");
    let add = json!({ "public_key": pk, "kem_public_key": kem, "role": "writer" });
    ok(&n, &t, "POST", &members, Some(add.clone()), 201);
    assert_eq!(refused(&n, &t, "POST", &members, Some(add)), (409, "conflict".into()));
    assert_eq!(refused(&n, &t, "POST", &members, Some(json!({ "public_key": pk, "kem_public_key": kem, "role": "owner" }))).0, 400);
    let g = ok(&n, &t, "GET", &members, None, 200);
    assert_eq!(g["members"].as_array().unwrap().len(), 2);
    // The genesis names no `kem` for its author: the node fills in its own.
    let own_kem = ok(&n, &t, "GET", "/v1/identity", None, 200)["kem_public_key"].clone();
    let kems: Vec<(Value, Value)> = g["members"].as_array().unwrap().iter().map(|m| (m["public_key"].clone(), m["kem_public_key"].clone())).collect();
    assert!(kems.contains(&(json!(me), own_kem)) && kems.contains(&(json!(pk), json!(kem))), "{kems:?}");
    ok(&n, &t, "PUT", &format!("{members}/{pk}"), Some(json!({"role": "reader"})), 200);
    let stranger = "cd".repeat(32);
    assert_eq!(refused(&n, &t, "PUT", &format!("{members}/{stranger}"), Some(json!({"role": "reader"}))), (404, "not_found".into()));
    let removed = ok(&n, &t, "DELETE", &format!("{members}/{pk}"), None, 200);
    let g = ok(&n, &t, "GET", &members, None, 200);
    assert_eq!(g["current_key_id"], removed["key_id"], "the removal rotated the key");
    assert_eq!(g["members"].as_array().unwrap().len(), 1);
    assert_eq!(refused(&n, &t, "DELETE", &format!("{members}/{pk}"), None), (404, "not_found".into()));
    assert_eq!(refused(&n, &t, "DELETE", &format!("{members}/{me}"), None), (409, "conflict".into()));
    let rotated = ok(&n, &t, "POST", &format!("/v1/scopes/{s}/keys/rotate"), None, 200);
    assert_eq!(ok(&n, &t, "GET", &members, None, 200)["keys"].as_array().unwrap().len(), 3);
    assert_eq!(rotated["key_id"].as_str().map(str::len), Some(64));
    // Writes go on under the new key.
    ok(&n, &t, "POST", &ops, Some(put("c", "3")), 201);
    let followed = ok(&n, &t, "POST", &format!("/v1/scopes/{}/follow", "ef".repeat(32)), None, 200);
    assert_eq!(followed["scope"], json!("ef".repeat(32)));

    // The node as a reader of its own scope: no more writes, no changes.
    ok(&n, &t, "PUT", &format!("{members}/{me}"), Some(json!({"role": "reader"})), 200);
    assert_eq!(refused(&n, &t, "POST", &ops, Some(put("d", "4"))), (403, "not_a_writer".into()));
    assert_eq!(refused(&n, &t, "POST", &format!("/v1/scopes/{s}/keys/rotate"), None), (403, "not_an_admin".into()));
    // genesis, op, op, AddMember, SetRole, Remove+Rotate, Rotate, op, SetRole
    let st = n.scope(&dagfold::protocol::parse_hash_hex(&s).unwrap()).unwrap();
    assert_eq!(st["applied"], json!(9));
}

/// Two nodes, each the other's peer by key.
fn pair() -> (tempfile::TempDir, NodeProc, NodeProc) {
    let dir = tempfile::tempdir().unwrap();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    let (la, lb) = (loopback(free_port()), loopback(free_port()));
    // The flags name each node's key: read both before either opens its store.
    let (to_b, to_a) = (peer_flags(&db, lb), peer_flags(&da, la));
    let a = NodeProc::start_with_policy(&da, la, loopback(free_port()), &to_b);
    let b = NodeProc::start_with_policy(&db, lb, loopback(free_port()), &to_a);
    (dir, a, b)
}

/// A scope made on `a` with `b` a writer (following it first).
fn shared_scope(a: &NodeProc, b: &NodeProc) -> String {
    let (ta, tb) = (token(a), token(b));
    let s = ok(a, &ta, "POST", "/v1/scopes", Some(json!({"name": "pair"})), 201)["scope"].as_str().unwrap().to_owned();
    ok(b, &tb, "POST", &format!("/v1/scopes/{s}/follow"), None, 200);
    let id = identity_of(b);
    let add = json!({ "public_key": id["public_key"], "kem_public_key": id["kem_public_key"], "role": "writer" });
    ok(a, &ta, "POST", &format!("/v1/scopes/{s}/members"), Some(add), 201);
    let scope = dagfold::protocol::parse_hash_hex(&s).unwrap();
    assert!(wait_until(WAIT, || b.scope(&scope).is_some_and(|st| st["applied"] == json!(2))), "b holds the scope");
    s
}

fn items(n: &NodeProc, t: &str, s: &str) -> Value {
    ok(n, t, "GET", &format!("/v1/scopes/{s}/entities/notes/items?limit=1000"), None, 200)
}

#[test]
fn written_on_one_node_read_on_the_other_whatever_the_interleaving() {
    let (_dir, a, b) = pair();
    let (ta, tb) = (token(&a), token(&b));
    let s = shared_scope(&a, &b);
    let scope = dagfold::protocol::parse_hash_hex(&s).unwrap();
    // One write each way, read on the other node.
    ok(&a, &ta, "POST", &format!("/v1/scopes/{s}/ops"), Some(put("from-a", "1")), 201);
    let item = format!("/v1/scopes/{s}/entities/notes/items/{}", hex::encode("from-a"));
    assert!(wait_until(WAIT, || request(&b, "GET", &item, Some(&tb), None).0 == 200), "a's write read on b");
    ok(&b, &tb, "POST", &format!("/v1/scopes/{s}/ops"), Some(put("from-b", "2")), 201);
    let item = format!("/v1/scopes/{s}/entities/notes/items/{}", hex::encode("from-b"));
    assert!(wait_until(WAIT, || request(&a, "GET", &item, Some(&ta), None).0 == 200), "b's write read on a");

    // Seeded interleavings of concurrent writes on both nodes, some to the
    // same keys: equal roots and equal reads on both.
    for seed in 1..=3u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let plan: Vec<(bool, String, String)> =
            (0..24).map(|i| (rng.gen_bool(0.5), format!("k{}", rng.gen_range(0..8)), format!("v{seed}-{i}"))).collect();
        std::thread::scope(|sc| {
            for chunk in plan.chunks(6) {
                let (a, b, ta, tb, s) = (&a, &b, &ta, &tb, &s);
                sc.spawn(move || {
                    for (on_a, k, v) in chunk {
                        let (n, t) = if *on_a { (a, ta) } else { (b, tb) };
                        ok(n, t, "POST", &format!("/v1/scopes/{s}/ops"), Some(put(k, v)), 201);
                    }
                });
            }
        });
        let converged = wait_until(WAIT, || {
            let (x, y) = (a.scope(&scope).unwrap(), b.scope(&scope).unwrap());
            x["root"] == y["root"] && x["data_heads"] == y["data_heads"]
        });
        assert!(converged, "seed {seed}: {:?} vs {:?}", a.scope(&scope), b.scope(&scope));
        assert_eq!(items(&a, &ta, &s), items(&b, &tb, &s), "seed {seed}: equal reads");
    }
}

#[test]
fn events_come_once_and_in_order_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = start(dir.path(), &[]);
    let t = token(&n);
    let s = ok(&n, &t, "POST", "/v1/scopes", Some(json!({"name": "log"})), 201)["scope"].as_str().unwrap().to_owned();
    let write = |n: &NodeProc, i: u64| {
        let body = json!({ "actions": [], "events": [{ "kind": "tick", "data": format!("{i}") }] });
        assert_eq!(ok(n, &t, "POST", &format!("/v1/scopes/{s}/ops"), Some(body), 201)["first_event_seq"], json!(i));
    };
    for i in 1..=10 {
        write(&n, i);
    }
    let mut seen = Vec::new();
    let mut r = open_events(&n, &t, &s, "?from=1", None);
    while seen.len() < 4 {
        seen.push(next_sse(&mut r).expect("an event").id);
    }
    n.kill();
    n.restart();
    for i in 11..=15 {
        write(&n, i);
    }
    let mut r = open_events(&n, &t, &s, "", seen.last().copied());
    while seen.len() < 15 {
        let ev = next_sse(&mut r).expect("an event");
        assert_eq!(ev.data["data"], json!(format!("{}", ev.id)));
        seen.push(ev.id);
    }
    assert_eq!(seen, (1..=15).collect::<Vec<u64>>(), "each once, in order");
}

#[test]
fn a_key_rotated_while_a_member_was_away_reaches_it_when_it_comes_back() {
    let (_dir, a, mut b) = pair();
    let (ta, tb) = (token(&a), token(&b));
    let s = shared_scope(&a, &b);
    let scope = dagfold::protocol::parse_hash_hex(&s).unwrap();
    b.stop();
    // While b is away: a rotation (its delivery to b is not gossiped to a
    // node that is not there) and writes under the new key.
    ok(&a, &ta, "POST", &format!("/v1/scopes/{s}/keys/rotate"), None, 200);
    for i in 0..5 {
        ok(&a, &ta, "POST", &format!("/v1/scopes/{s}/ops"), Some(put(&format!("k{i}"), "v")), 201);
    }
    std::thread::sleep(Duration::from_millis(300));
    b.restart();
    let want = a.scope(&scope).unwrap();
    let caught_up = wait_until(WAIT, || {
        b.scope(&scope).is_some_and(|st| st["root"] == want["root"] && st["applied"] == want["applied"] && st["data_key_waiting"] == json!(0))
    });
    assert!(caught_up, "b: {:?}, a: {want}", b.scope(&scope));
    assert_eq!(items(&a, &ta, &s), items(&b, &tb, &s));
    assert!(b.metric("dagfold_keys_received_on_request_total") >= 1.0);
}

/// `tools/bench api_writes`' generator keeps working: a short run of
/// writes through node A's API by 16 clients at once, every one answered,
/// node B applying them all by gossip, both at the same root.
#[test]
fn the_api_writes_workload_runs_and_both_nodes_agree() {
    let (dir, a, b) = pair();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dagfold-loadgen"))
        .args(["api", "--api", &a.admin.to_string(), "--peer-api", &b.admin.to_string()])
        .args(["--token-file", dir.path().join("a/api-token").to_str().unwrap()])
        .args(["--peer-token-file", dir.path().join("b/api-token").to_str().unwrap()])
        .args(["--ops", "600", "--clients", "16", "--node-pid", &a.child.id().to_string(), "--peer-pid", &b.child.id().to_string()])
        .args(["--timeout-s", "120"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["ops"].clone(), report["clients"].clone()), (json!(600), json!(16)));
    assert_eq!(report["roots_equal"], true, "{report}");
    assert!(report["p99_ms"].as_f64().unwrap() > 0.0, "{report}");
    // Every party's CPU is read (in /proc's 10 ms ticks: maybe 0 here).
    assert!(["node", "peer", "clients", "all"].iter().all(|k| report["cpu_us_per_write"][k].as_f64().is_some()), "{report}");
    // The scope's genesis, B's membership and the 600 writes, on both.
    let s = report_scope(&a);
    for n in [&a, &b] {
        assert!(wait_until(WAIT, || n.scope(&s).is_some_and(|st| st["applied"] == json!(602))), "{}", n.admin);
    }
}

/// The one scope `a` holds.
fn report_scope(a: &NodeProc) -> dagfold::protocol::Hash {
    let (_, v) = request(a, "GET", "/v1/scopes", Some(&token(a)), None);
    let s = v["scopes"][0]["scope"].as_str().unwrap_or_else(|| panic!("{v}"));
    dagfold::protocol::parse_hash_hex(s).unwrap()
}
