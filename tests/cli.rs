//! The `dagfold` command line as a user runs it: `export` (offline, against
//! `import` and `inspect`), and the API client commands against a running
//! node.

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::node::{free_port, loopback, send_frames, NodeProc};

use dagfold::core::{Cf, Write};
use dagfold::protocol::crypto::seal_key_delivery;
use dagfold::protocol::{encode, Hash};
use dagfold::store::rocks::RocksStore;
use dagfold::store::Store;
use dagfold::workload::{generate, shuffle_within_windows, WorkloadConfig};

fn dagfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dagfold")).args(args).output().expect("running dagfold")
}

/// Runs `dagfold` and answers its standard output as JSON; fails the test
/// with its standard error if it failed.
fn dagfold_json(args: &[&str]) -> serde_json::Value {
    let out = dagfold(args);
    assert!(out.status.success(), "dagfold {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("dagfold {args:?} printed no JSON ({e}): {:?}", String::from_utf8_lossy(&out.stdout)))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The public and KEM keys of the identity of `data_dir` (made if new).
fn identity(data_dir: &Path) -> (Hash, [u8; 32]) {
    let v = dagfold_json(&["identity", "--data-dir", path(data_dir)]);
    let h = |k: &str| -> [u8; 32] { hex::decode(v[k].as_str().unwrap()).unwrap().try_into().unwrap() };
    (h("public_key"), h("kem_public_key"))
}

#[test]
fn an_export_imports_in_one_pass_into_another_node_with_the_same_status() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_key, a_kem) = identity(a.path());
    let (b_key, b_kem) = identity(b.path());
    assert_ne!(a_key, b_key);
    // A scope of many ops with a key rotation, imported into A out of order
    // (so the order of its tables is not the causal one).
    let cfg = WorkloadConfig { seed: 11, data_ops: 600, rotate_at: Some(300), ..WorkloadConfig::default() };
    let wl = generate(&cfg, a_key, a_kem);
    assert_eq!(wl.keys.len(), 2);
    let shuffled: Vec<&[u8]> = shuffle_within_windows(wl.messages.len(), 64, 5).into_iter().map(|i| wl.messages[i].frame.as_slice()).collect();
    let file = frames_file(&shuffled);
    let summary = dagfold_json(&["import", "--data-dir", path(a.path()), path(file.path())]);
    let applied = summary["applied"].as_u64().unwrap();
    assert!(applied > 600, "{summary}");
    // Deliveries of both keys to B, as if A had made them (the API's member
    // add does), and one for another scope, which the export leaves out.
    let mut deliveries = deliveries_to(&wl, b_key, &b_kem);
    deliveries.push(seal_key_delivery([7; 32], &wl.keys[0], b_key, &b_kem, &[9; 32]));
    store_deliveries(a.path(), &deliveries);

    let scope = hex::encode(wl.scope);
    let out = tempfile::NamedTempFile::new().unwrap();
    let summary = dagfold_json(&["export", "--data-dir", path(a.path()), "--scope", &scope, "--out", path(out.path())]);
    assert_eq!(summary["ops"].as_u64(), Some(applied), "{summary}");
    assert_eq!(summary["deliveries"].as_u64(), Some(2), "{summary}");
    // To standard output: the same frames, the summary on standard error.
    let to_stdout = dagfold(&["export", "--data-dir", path(a.path()), "--scope", &scope]);
    assert!(to_stdout.status.success());
    assert_eq!(to_stdout.stdout, std::fs::read(out.path()).unwrap());
    assert!(String::from_utf8_lossy(&to_stdout.stderr).contains("\"deliveries\":2"));

    // Into B, whose identity differs: nothing waits on anything.
    let summary = dagfold_json(&["import", "--data-dir", path(b.path()), path(out.path())]);
    assert_eq!(summary["applied"].as_u64(), Some(applied), "{summary}");
    assert_eq!(summary["buffered"], serde_json::json!({"pending": 0, "key_waiting": 0, "data_key_waiting": 0}), "{summary}");
    assert_eq!(summary["released_by_cascade"].as_u64(), Some(0), "{summary}");
    assert_eq!(summary["keys_accepted"].as_u64(), Some(2), "{summary}");
    let status_a = dagfold_json(&["inspect", "--data-dir", path(a.path()), "--scope", &scope]);
    let status_b = dagfold_json(&["inspect", "--data-dir", path(b.path()), "--scope", &scope]);
    assert_eq!(status_a, status_b);
    assert_eq!(status_a["root"].as_str(), Some(hex::encode(wl.final_root).as_str()));
    assert_eq!(status_a["applied"].as_u64(), Some(applied));

    // An unknown scope: a clear message, nothing written.
    let unknown = hex::encode([0xab; 32]);
    let out = dagfold(&["export", "--data-dir", path(a.path()), "--scope", &unknown]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("no scope {unknown}")), "{err}");
    let out = dagfold(&["export", "--data-dir", path(a.path()), "--scope", "xyz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("64 hex"));
}

/// Only applied ops are exported: not those pending behind an op left out
/// of A's input, nor a removed writer's, dropped; B then holds what A
/// applied, nothing waiting.
#[test]
fn an_export_holds_only_the_applied_ops() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_key, a_kem) = identity(a.path());
    let (b_key, b_kem) = identity(b.path());
    let cfg = WorkloadConfig { seed: 5, data_ops: 300, remove_writer_at: Some(150), ..WorkloadConfig::default() };
    let wl = generate(&cfg, a_key, a_kem);
    let left_out = wl.messages.iter().enumerate().filter(|(_, m)| m.is_data).nth(200).unwrap().0;
    let frames: Vec<&[u8]> = wl.messages.iter().enumerate().filter(|(i, _)| *i != left_out).map(|(_, m)| m.frame.as_slice()).collect();
    let imported = dagfold_json(&["import", "--data-dir", path(a.path()), path(frames_file(&frames).path())]);
    assert!(dropped(&imported) > 0, "the removed writer's later ops: {imported}");
    store_deliveries(a.path(), &deliveries_to(&wl, b_key, &b_kem));
    let scope = hex::encode(wl.scope);
    let status_a = dagfold_json(&["inspect", "--data-dir", path(a.path()), "--scope", &scope]);
    assert!(status_a["pending"].as_u64().unwrap() > 0, "{status_a}");

    let out = tempfile::NamedTempFile::new().unwrap();
    let summary = dagfold_json(&["export", "--data-dir", path(a.path()), "--scope", &scope, "--out", path(out.path())]);
    assert_eq!(summary["ops"], status_a["applied"], "{summary}");
    let imported = dagfold_json(&["import", "--data-dir", path(b.path()), path(out.path())]);
    assert_eq!(dropped(&imported), 0, "{imported}");
    let status_b = dagfold_json(&["inspect", "--data-dir", path(b.path()), "--scope", &scope]);
    for field in ["root", "data_heads", "governance_heads", "applied"] {
        assert_eq!(status_a[field], status_b[field], "{field}");
    }
    assert_eq!(status_b["pending"].as_u64(), Some(0), "{status_b}");
}

/// The ops an import dropped, for any reason.
fn dropped(import_summary: &serde_json::Value) -> u64 {
    import_summary["dropped"].as_object().unwrap().values().filter_map(|v| v.as_u64()).sum()
}

/// Every key of `wl`, sealed to `recipient`.
fn deliveries_to(wl: &dagfold::workload::Workload, recipient: Hash, kem: &[u8; 32]) -> Vec<dagfold::protocol::KeyDelivery> {
    wl.keys.iter().enumerate().map(|(i, k)| seal_key_delivery(wl.scope, k, recipient, kem, &[i as u8 + 1; 32])).collect()
}

/// Keeps `deliveries` in the store of `data_dir` as deliveries its node
/// made (`Cf::Meta`, `delivery/` ‖ recipient ‖ scope ‖ key_id), as the
/// API's member add and key rotation do.
fn store_deliveries(data_dir: &Path, deliveries: &[dagfold::protocol::KeyDelivery]) {
    let mut store = RocksStore::open(data_dir).unwrap();
    let writes: Vec<Write> = deliveries
        .iter()
        .map(|kd| {
            let key = [dagfold::core::META_DELIVERY_PREFIX, &kd.recipient[..], &kd.scope[..], &kd.key_id[..]].concat();
            Write::Put(Cf::Meta, key, encode(kd))
        })
        .collect();
    store.write(&writes, true).unwrap();
}

/// A frames file as `dagfold import`: `u32` LE length, then the frame.
fn frames_file(frames: &[&[u8]]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for f in frames {
        file.write_all(&(f.len() as u32).to_le_bytes()).unwrap();
        file.write_all(f).unwrap();
    }
    file.flush().unwrap();
    file
}

/// A node on loopback over `data_dir`, which an import filled first.
fn start_node(data_dir: &Path) -> NodeProc {
    NodeProc::start(data_dir, loopback(free_port()), loopback(free_port()), &[])
}

/// The client commands' flags for the node of `data_dir`.
fn api_flags(data_dir: &Path) -> [&str; 2] {
    ["--data-dir", path(data_dir)]
}

/// The first `n` lines of `dagfold events SCOPE --from FROM`, as JSON; the
/// command, which follows live, is then killed.
fn event_lines(data_dir: &Path, scope: &str, from: u64, n: usize) -> Vec<serde_json::Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(["events", scope, "--from", &from.to_string()])
        .args(api_flags(data_dir))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let events = lines.take(n).map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
    let _ = child.kill();
    let _ = child.wait();
    events
}

#[test]
fn the_node_records_its_api_address_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path());
    let file = dir.path().join(dagfold::client::API_ADDRESS_FILE);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{}\n", node.admin));
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let client = dagfold::client::Client::from_data_dir(dir.path()).unwrap();
    let id = client.identity().unwrap();
    assert_eq!(id.public_key, hex::encode(node.identity().0));
    assert_eq!(client.health().unwrap().status, "serving");
    client.ready().unwrap();
    // Export is offline: the running node holds the store.
    let out = dagfold(&["export", "--data-dir", path(dir.path()), "--scope", &hex::encode([1u8; 32])]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open the store"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Events come live and, across a node restart, once each and in order
/// (the library's iterator); the `events` command prints them as lines;
/// reads and errors of the client commands on a scope the node imported.
#[test]
fn events_follow_and_resume_across_a_restart_and_the_read_commands_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (key, kem) = identity(dir.path());
    let cfg = WorkloadConfig { seed: 3, writers: 2, data_ops: 120, events_per_op: 1, ..WorkloadConfig::default() };
    let wl = generate(&cfg, key, kem);
    let first_data = wl.messages.iter().position(|m| m.is_data).unwrap();
    let split = first_data + 60;
    let before: Vec<&[u8]> = wl.messages[..split].iter().map(|m| m.frame.as_slice()).collect();
    let file = frames_file(&before);
    dagfold_json(&["import", "--data-dir", path(dir.path()), path(file.path())]);
    let mut node = start_node(dir.path());
    let scope = hex::encode(wl.scope);

    // The library's iterator, in a thread, hands each event over.
    let (tx, rx) = std::sync::mpsc::channel();
    let (dir_path, scope2) = (dir.path().to_path_buf(), scope.clone());
    std::thread::spawn(move || {
        let client = dagfold::client::Client::from_data_dir(&dir_path).unwrap();
        for ev in client.events(&scope2, 1) {
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    let take = |n: usize| -> Vec<u64> {
        (0..n).map(|_| rx.recv_timeout(Duration::from_secs(30)).expect("an event in time").expect("an event").seq).collect()
    };
    assert_eq!(take(60), (1..=60).collect::<Vec<u64>>());
    node.stop();
    node.restart();
    let after: Vec<Vec<u8>> = wl.messages[split..].iter().map(|m| m.frame.clone()).collect();
    send_frames(node.listen, &after, 1, 1);
    assert_eq!(take(60), (61..=120).collect::<Vec<u64>>());
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "no event twice");

    // The command: from 3, a line per event, until killed.
    for (v, seq) in event_lines(dir.path(), &scope, 3, 3).iter().zip(3u64..) {
        assert_eq!(v["seq"].as_u64(), Some(seq), "{v}");
        assert_eq!(v["kind"].as_str(), Some("ev0"), "{v}");
        assert_eq!(v["data_hex"].as_str().map(str::len), Some(16), "{v}");
    }

    // Reads.
    let scopes = dagfold_json(&["scope", "list", "--data-dir", path(dir.path())]);
    assert!(scopes["scopes"].as_array().unwrap().iter().any(|s| s["scope"] == scope.as_str()), "{scopes}");
    let members = dagfold_json(&["member", "list", &scope, "--data-dir", path(dir.path())]);
    assert_eq!(members["members"].as_array().unwrap().len(), 1 + 2 + 1, "admin, writers, the node: {members}");
    let status = dagfold::client::Client::from_data_dir(dir.path()).unwrap().scope_status(&scope).unwrap();
    assert_eq!(status.root, hex::encode(wl.final_root));

    // Errors: an unknown scope, a wrong token, no node.
    let unknown = hex::encode([0xcd; 32]);
    let out = dagfold(&["events", &unknown, "--data-dir", path(dir.path())]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_scope"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = dagfold(&["member", "list", &unknown, "--data-dir", path(dir.path())]);
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 404"), "{}", String::from_utf8_lossy(&out.stderr));
    let bad_token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad_token.path(), hex::encode([1u8; 32])).unwrap();
    let admin = node.admin.to_string();
    let out = dagfold(&["scope", "list", "--api", &admin, "--token-file", path(bad_token.path())]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 401"), "{}", String::from_utf8_lossy(&out.stderr));
    let token = dir.path().join(dagfold::client::API_TOKEN_FILE);
    dagfold_json(&["scope", "list", "--api", &format!("http://{admin}/"), "--token-file", path(&token)]);
    node.stop();
    let out = dagfold(&["scope", "list", "--api", &admin, "--token-file", path(&token)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The write commands and the reads after them, member management with a
/// second identity, and the events of writes (needs API.md's write routes).
#[test]
fn the_client_commands_write_read_and_manage_members() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let node = start_node(a.path());
    let run = |args: &[&str]| -> serde_json::Value { dagfold_json(&[args, &api_flags(a.path())[..]].concat()) };
    let created = run(&["scope", "create", "team"]);
    let scope = created["scope"].as_str().unwrap().to_owned();
    assert_eq!(created["op"].as_str().map(str::len), Some(64), "{created}");
    let scopes = run(&["scope", "list"]);
    assert_eq!(scopes["scopes"], serde_json::json!([{"scope": scope, "name": "team", "role": "admin"}]));

    let put = run(&["put", &scope, "notes", "a", "hello", "--event", "note=first"]);
    assert_eq!(put["first_event_seq"].as_u64(), Some(1), "{put}");
    let item = run(&["get", &scope, "notes", "a"]);
    assert_eq!((item["key"].as_str(), item["value"].as_str(), item["deleted"].as_bool()), (Some("a"), Some("hello"), Some(false)), "{item}");
    assert_eq!(item["author"].as_str(), Some(hex::encode(node.identity().0).as_str()));
    run(&["put", &scope, "notes", "62", "00ff", "--key-hex", "--value-hex"]);
    let item = run(&["get", &scope, "notes", "b"]);
    assert_eq!(item["value_hex"].as_str(), Some("00ff"));
    assert!(item.get("value").is_none(), "not UTF-8: {item}");
    run(&["add", &scope, "counters", "c", "5"]);
    let added = run(&["add", &scope, "counters", "c", "-2", "--event", "count=down"]);
    assert_eq!(added["first_event_seq"].as_u64(), Some(2), "{added}");
    assert_eq!(run(&["get", &scope, "counters", "c"])["counter"].as_i64(), Some(3));
    let page = run(&["list", &scope, "notes", "--limit", "1"]);
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["next_after_hex"].as_str(), Some("61"));
    let page = run(&["list", &scope, "notes", "--after-hex", "61"]);
    assert_eq!(page["items"][0]["key"].as_str(), Some("b"), "{page}");
    assert!(page["next_after_hex"].is_null());
    run(&["delete", &scope, "notes", "a"]);
    let item = run(&["get", &scope, "notes", "a"]);
    assert_eq!((item["deleted"].as_bool(), item["value_hex"].is_null()), (Some(true), true), "{item}");

    // A second identity, piped from `dagfold identity` as the quick start does.
    let b_identity = dagfold(&["identity", "--data-dir", path(b.path())]).stdout;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(["member", "add", &scope, "--identity-json", "-", "--role", "writer"])
        .args(api_flags(a.path()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&b_identity).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let b_key = hex::encode(identity(b.path()).0);
    let members = run(&["member", "list", &scope]);
    let role_of_b = |m: &serde_json::Value| m["members"].as_array().unwrap().iter().find(|x| x["public_key"] == b_key.as_str()).map(|x| x["role"].clone());
    assert_eq!(role_of_b(&members), Some("writer".into()), "{members}");
    run(&["member", "role", &scope, &b_key, "reader"]);
    assert_eq!(role_of_b(&run(&["member", "list", &scope])), Some("reader".into()));
    let rotated = run(&["key", "rotate", &scope]);
    assert_eq!(run(&["member", "list", &scope])["current_key_id"], rotated["key_id"]);
    run(&["member", "remove", &scope, &b_key]);
    assert_eq!(role_of_b(&run(&["member", "list", &scope])), None);

    // The events of the writes, from 1.
    let [first, second] = <[serde_json::Value; 2]>::try_from(event_lines(a.path(), &scope, 1, 2)).unwrap();
    assert_eq!((first["seq"].as_u64(), first["kind"].as_str(), first["data"].as_str()), (Some(1), Some("note"), Some("first")));
    assert_eq!((second["seq"].as_u64(), second["kind"].as_str(), second["data"].as_str()), (Some(2), Some("count"), Some("down")));

    // An unknown scope: the API's message on standard error, non-zero.
    let out = dagfold(&[&["put", &hex::encode([0xee; 32]), "notes", "a", "x"][..], &api_flags(a.path())[..]].concat());
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_scope"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A scope made through the API, with a member added and a key rotated:
/// its export carries the deliveries the node made, and the member's node
/// imports it whole, reaching the same status.
#[test]
fn an_api_made_scope_exports_with_its_deliveries_into_the_members_node() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (b_key, b_kem) = identity(b.path());
    let mut node = start_node(a.path());
    let run = |args: &[&str]| -> serde_json::Value { dagfold_json(&[args, &api_flags(a.path())[..]].concat()) };
    let scope = run(&["scope", "create", "shared"])["scope"].as_str().unwrap().to_owned();
    run(&["member", "add", &scope, "--public-key", &hex::encode(b_key), "--kem-public-key", &hex::encode(b_kem), "--role", "writer"]);
    for i in 0..20 {
        run(&["put", &scope, "notes", &format!("k{i}"), "v", "--event", "put=v"]);
        if i == 10 {
            run(&["key", "rotate", &scope]);
        }
    }
    node.stop();

    let out = tempfile::NamedTempFile::new().unwrap();
    let summary = dagfold_json(&["export", "--data-dir", path(a.path()), "--scope", &scope, "--out", path(out.path())]);
    assert!(summary["deliveries"].as_u64().unwrap() >= 2, "the first key and the rotated one to B: {summary}");
    let imported = dagfold_json(&["import", "--data-dir", path(b.path()), path(out.path())]);
    assert_eq!(imported["applied"], summary["ops"], "{imported}");
    assert!(imported["keys_accepted"].as_u64().unwrap() >= 2, "{imported}");
    let status_a = dagfold_json(&["inspect", "--data-dir", path(a.path()), "--scope", &scope]);
    let status_b = dagfold_json(&["inspect", "--data-dir", path(b.path()), "--scope", &scope]);
    assert_eq!(status_a, status_b);
    assert_eq!(status_a["applied"].as_u64(), Some(1 + 1 + 20 + 1), "genesis, member, puts, rotation: {status_a}");
}
