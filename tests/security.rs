//! SPEC §10 and API.md, against the `dagfold` binary over QUIC on loopback:
//! what reveals a scope is served only to a proven member or a peer
//! configured by key; the data directory is private; geneses follow the
//! node's policy. `docs/SECURITY.md` ties each line of the threat model to
//! these tests.

mod common;

use std::time::Duration;

use common::node::*;
use dagfold::net::{FrameError, StreamFrames, ERR_UNAUTHORIZED};
use dagfold::protocol::node::{NodeMessage, Subscribe, SyncRequest};
use dagfold::protocol::{Hash, ZERO};
use dagfold::workload::{generate, Workload, WorkloadConfig};

const WAIT: Duration = Duration::from_secs(20);

fn workload_for(n: &NodeProc, cfg: &WorkloadConfig) -> Workload {
    let (pk, kem) = n.identity();
    generate(cfg, pk, kem)
}

/// Opens a bidirectional stream to `n` as the identity of `seed` (anonymous
/// when `None`) and writes `request` on it.
async fn ask(n: &NodeProc, seed: Option<[u8; 32]>, request: NodeMessage) -> (dagfold::net::FrameWriter, StreamFrames) {
    let cfg = dagfold::net::ServerConfig::default();
    let cert = seed.map(|s| dagfold::net::identity_cert(&s).unwrap());
    let ep = dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), &cfg, cert.as_ref()).unwrap();
    let conn = tokio::time::timeout(WAIT, dagfold::net::connect(&ep, n.listen)).await.unwrap().unwrap();
    let (mut w, r) = dagfold::net::open_bi(&conn).await.unwrap();
    w.write(&request.encode()).await.unwrap();
    // The endpoint and connection live as long as the stream's handles.
    std::mem::forget((ep, conn));
    (w, r)
}

fn refused<T>(read: &Result<T, FrameError>) -> bool {
    matches!(read, Err(FrameError::Reset(code)) if code.into_inner() == u64::from(ERR_UNAUTHORIZED))
}

/// Reads the next event's sequence number, or what ended the stream.
async fn next_event(r: &mut StreamFrames) -> Result<Option<u64>, FrameError> {
    loop {
        let frame = tokio::time::timeout(WAIT, r.read()).await.expect("a frame in time")?;
        let Some(frame) = frame else { return Ok(None) };
        if let Some(NodeMessage::Event(e)) = NodeMessage::decode(&frame) {
            return Ok(Some(e.seq));
        }
    }
}

fn subscribe(scope: Hash) -> NodeMessage {
    NodeMessage::Subscribe(Subscribe { scope, from_seq: 1 })
}

/// An anonymous client and a key that is no member are refused; a member is
/// served; a member removed while subscribed loses its subscription the
/// moment the removal is applied, while another member's goes on.
#[test]
fn subscriptions_are_served_only_to_members() {
    let dir = tempfile::tempdir().unwrap();
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &[]);
    let w = workload_for(&n, &WorkloadConfig { seed: 31, data_ops: 200, writers: 2, remove_writer_at: Some(100), ..Default::default() });
    let first_data = w.messages.iter().position(|m| m.is_data).unwrap();
    let removal = first_data + w.messages[first_data..].iter().position(|m| !m.is_data).expect("the removal op");
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    send_frames(n.listen, &frames[..removal], 1, 1);
    let before = w.messages[..removal].iter().filter(|m| m.id != ZERO).count() as u64;
    assert!(wait_until(WAIT, || n.scope(&w.scope).is_some_and(|s| s["applied"].as_u64() == Some(before))));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (_w0, mut anonymous) = ask(&n, None, subscribe(w.scope)).await;
        assert!(refused(&anonymous.read().await), "an anonymous subscriber is refused");
        let (_w1, mut stranger) = ask(&n, Some([9; 32]), subscribe(w.scope)).await;
        assert!(refused(&stranger.read().await), "a key that is no member is refused");

        let (_w2, mut stays) = ask(&n, Some(w.writers[1].seed), subscribe(w.scope)).await;
        let (_w3, mut removed) = ask(&n, Some(w.writers[0].seed), subscribe(w.scope)).await;
        for seq in 1..=100u64 {
            assert_eq!(next_event(&mut stays).await.unwrap(), Some(seq));
            assert_eq!(next_event(&mut removed).await.unwrap(), Some(seq), "a member is served");
        }
        // The removal and the rest of the scope.
        let rest = frames[removal..].to_vec();
        let listen = n.listen;
        tokio::task::spawn_blocking(move || send_frames(listen, &rest, 1, 1)).await.unwrap();
        let end = loop {
            match next_event(&mut removed).await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        };
        assert!(refused(&end), "the removed member's subscription ends refused: {end:?}");
        assert_eq!(next_event(&mut stays).await.unwrap(), Some(101), "the other member's goes on");
    });
    assert!(n.metric("dagfold_subscriptions_revoked_total") >= 1.0);
    assert!(n.metric("dagfold_requests_refused_total") >= 3.0);
}

/// Sync is served to a member and to a peer configured by key, refused to
/// an anonymous client and to a stranger; a request for ids of any scope
/// (scope ZERO) serves a stranger nothing; a stranger's heartbeat is not
/// heard.
#[test]
fn sync_and_heartbeats_are_served_only_to_members_and_peers() {
    let dir = tempfile::tempdir().unwrap();
    let peer_seed = [0x33u8; 32];
    let peer = format!("{}@127.0.0.1:1", hex::encode(dagfold::protocol::sig::public_key_from_seed(&peer_seed)));
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &["--peer".into(), peer]);
    let w = workload_for(&n, &WorkloadConfig { seed: 32, data_ops: 50, writers: 2, ..Default::default() });
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    send_frames(n.listen, &frames, 1, 1);
    let total = w.messages.iter().filter(|m| m.id != ZERO).count() as u64;
    assert!(wait_until(WAIT, || n.scope(&w.scope).is_some_and(|s| s["applied"].as_u64() == Some(total))));
    let heads: Vec<Hash> = w.data_heads.clone();
    let request = |scope| NodeMessage::SyncRequest(SyncRequest { scope, want: heads.clone(), have: Vec::new(), max_ops: 100 });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        async fn served(mut r: StreamFrames) -> Result<u32, FrameError> {
            let mut ops = 0;
            while let Some(frame) = tokio::time::timeout(WAIT, r.read()).await.expect("in time")? {
                match NodeMessage::decode(&frame) {
                    Some(NodeMessage::SyncDone(d)) => {
                        assert_eq!(d.sent, ops);
                        return Ok(ops);
                    }
                    _ => ops += 1,
                }
            }
            Ok(ops)
        }
        let (_a, r) = ask(&n, None, request(w.scope)).await;
        assert!(matches!(served(r).await, Err(FrameError::Reset(c)) if c.into_inner() == u64::from(ERR_UNAUTHORIZED)), "anonymous");
        let (_b, r) = ask(&n, Some([9; 32]), request(w.scope)).await;
        assert!(served(r).await.is_err(), "a stranger is refused");
        let (_c, r) = ask(&n, Some([9; 32]), request(ZERO)).await;
        assert_eq!(served(r).await.unwrap(), 0, "ids of any scope: nothing of a scope the stranger may not see");
        let (_d, r) = ask(&n, Some(w.writers[0].seed), request(w.scope)).await;
        assert!(served(r).await.unwrap() > 0, "a member is served");
        let (_e, r) = ask(&n, Some(peer_seed), request(ZERO)).await;
        assert!(served(r).await.unwrap() > 0, "a peer configured by key is served");

        // A stranger's heartbeat naming heads the node lacks is not heard.
        let cfg = dagfold::net::ServerConfig::default();
        let cert = dagfold::net::identity_cert(&[9; 32]).unwrap();
        let ep = dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), &cfg, Some(&cert)).unwrap();
        let conn = dagfold::net::connect(&ep, n.listen).await.unwrap();
        let beat = dagfold::protocol::node::ScopeBeat { scope: w.scope, root: ZERO, governance_heads: vec![[1; 32]], data_heads: vec![] };
        let hb = NodeMessage::Heartbeat(dagfold::protocol::node::Heartbeat { scopes: vec![beat] }).encode();
        dagfold::net::send_frames_uni(&conn, [hb]).await.unwrap();
    });
    assert!(wait_until(WAIT, || n.metric("dagfold_heartbeats_received_total") >= 1.0));
    let text = n.get("/metrics").unwrap().1;
    assert!(
        text.lines().any(|l| l.starts_with("dagfold_requests_refused_total") && l.contains("request=\"heartbeat\"")),
        "the stranger's heartbeat is counted as refused"
    );
}

/// The data directory and every file in it are private after a run (0700,
/// 0600); a node refuses to start on a directory others may enter.
#[test]
fn the_data_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("node");
    let mut n = NodeProc::start(&data, loopback(free_port()), loopback(free_port()), &[]);
    n.stop();
    let mut open = Vec::new();
    let mut dirs = vec![data.clone()];
    while let Some(d) = dirs.pop() {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        if mode & 0o077 != 0 {
            open.push((d.clone(), mode));
        }
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.permissions().mode() & 0o077 != 0 {
                open.push((e.path(), m.permissions().mode()));
            }
        }
    }
    assert!(open.is_empty(), "open to others: {open:?}");

    // A directory others may enter that already holds something (an empty
    // one holds no secret yet: the node makes it private).
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("LOCK"), b"").unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(["node", "--data-dir", shared.to_str().unwrap(), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a node on a directory others may read does not start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("open to other users") && err.contains("chmod 700"), "the message says what to do: {err}");
}

/// A genesis from a stranger is refused and counted; the same from a node
/// told `--accept-scopes-from` its author is applied.
#[test]
fn a_strangers_genesis_is_refused_unless_its_author_is_accepted() {
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let strict = NodeProc::start_with_policy(d0.path(), loopback(free_port()), loopback(free_port()), &[]);
    let w = workload_for(&strict, &WorkloadConfig { seed: 33, data_ops: 20, ..Default::default() });
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    send_frames(strict.listen, &frames, 1, 1);
    assert!(wait_until(WAIT, || strict.metric("dagfold_engine_genesis_refused_total") >= 1.0 || strict.get("/metrics").is_some_and(|(_, t)| t.contains("verdict=\"genesis_refused\""))));
    assert!(strict.scope(&w.scope).is_none(), "the stranger's scope is not held");

    let admin = hex::encode(w.admin.public_key);
    let trusting = NodeProc::start_with_policy(d1.path(), loopback(free_port()), loopback(free_port()), &["--accept-scopes-from".into(), admin]);
    let w = workload_for(&trusting, &WorkloadConfig { seed: 33, data_ops: 20, ..Default::default() });
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    send_frames(trusting.listen, &frames, 1, 1);
    let total = w.messages.iter().filter(|m| m.id != ZERO).count() as u64;
    assert!(wait_until(WAIT, || trusting.scope(&w.scope).is_some_and(|s| s["applied"].as_u64() == Some(total))));
}

/// The `--peer KEY@127.0.0.1:1` flag that has the node take `seed`'s key
/// for a peer's (served every scope, SPEC §10; nothing listens there).
fn peer_flag(seed: &[u8; 32]) -> [String; 2] {
    ["--peer".into(), format!("{}@127.0.0.1:1", hex::encode(dagfold::protocol::sig::public_key_from_seed(seed)))]
}

/// The value of `name{...label...}` in the node's metrics, 0 if absent.
fn metric_with(n: &NodeProc, name: &str, label: &str) -> f64 {
    let text = n.get("/metrics").map(|(_, t)| t).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One connection cannot hold more than `SUBSCRIPTIONS_PER_CONNECTION_MAX`
/// subscriptions, nor one key more than `SUBSCRIPTIONS_PER_KEY_MAX` over
/// several connections (the stream limit raised so that it does not bind
/// first): the excess is refused with a `Lagged` naming `from_seq`, counted
/// by reason, and the node holds exactly the bound. Before, one client
/// could hold every one of the node's 4,096 subscriptions.
#[test]
fn subscriptions_are_bounded_per_connection_and_per_key() {
    use dagfold::limits::{SUBSCRIPTIONS_PER_CONNECTION_MAX, SUBSCRIPTIONS_PER_KEY_MAX};
    let per_conn = SUBSCRIPTIONS_PER_CONNECTION_MAX as usize;
    let conns = SUBSCRIPTIONS_PER_KEY_MAX as usize / per_conn;
    let excess = 6;
    let dir = tempfile::tempdir().unwrap();
    let seed = [0x51u8; 32];
    let mut flags = peer_flag(&seed).to_vec();
    flags.extend(["--streams-per-connection-max".into(), (2 * per_conn).to_string()]);
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &flags);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = dagfold::net::ServerConfig::default();
        let me = dagfold::net::identity_cert(&seed).unwrap();
        let ep = dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), &cfg, Some(&me)).unwrap();
        // Subscribes `count` times on a new connection (to quiet scopes:
        // nothing is ever sent on a subscription that was taken), and
        // returns how many were refused with a Lagged at `from_seq`.
        let subscribe_on_one_connection = |count: usize, tag: u8| {
            let ep = ep.clone();
            async move {
                let conn = tokio::time::timeout(WAIT, dagfold::net::connect(&ep, n.listen)).await.unwrap().unwrap();
                let mut reads = tokio::task::JoinSet::new();
                for i in 0..count {
                    let (mut w, mut r) = dagfold::net::open_bi(&conn).await.unwrap();
                    let from_seq = 7 + i as u64;
                    let scope = [tag, i as u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30];
                    w.write(&NodeMessage::Subscribe(Subscribe { scope, from_seq }).encode()).await.unwrap();
                    reads.spawn(async move {
                        let read = tokio::time::timeout(Duration::from_secs(3), r.read()).await;
                        let lagged = match read {
                            Ok(Ok(Some(frame))) => match NodeMessage::decode(&frame) {
                                Some(NodeMessage::Lagged(l)) => {
                                    assert_eq!(l.next_seq, from_seq, "the refusal names where to resume");
                                    true
                                }
                                other => panic!("a refused subscription gets a Lagged, not {other:?}"),
                            },
                            Err(_) => false, // taken: a quiet scope sends nothing
                            other => panic!("a subscription's stream ended: {other:?}"),
                        };
                        (lagged, w, r)
                    });
                }
                let mut refused = 0;
                let mut held = Vec::new();
                while let Some(done) = reads.join_next().await {
                    let (lagged, w, r) = done.unwrap();
                    refused += usize::from(lagged);
                    held.push((w, r));
                }
                (refused, conn, held)
            }
        };
        let (refused, _c0, _h0) = subscribe_on_one_connection(per_conn + excess, 0).await;
        assert_eq!(refused, excess, "the subscriptions past the connection's bound are refused");
        assert_eq!(n.metric("dagfold_subscribers"), per_conn as f64, "the node holds the connection's bound");
        assert_eq!(metric_with(&n, "dagfold_subscriptions_refused_total", "reason=\"connection\""), excess as f64);

        // The same key on more connections, up to its own bound.
        let mut kept = Vec::new();
        for c in 1..conns {
            let (refused, conn, held) = subscribe_on_one_connection(per_conn, c as u8).await;
            assert_eq!(refused, 0, "connection {c} is within the key's bound");
            kept.push((conn, held));
        }
        assert_eq!(n.metric("dagfold_subscribers"), (conns * per_conn) as f64);
        let (refused, _c, _h) = subscribe_on_one_connection(excess, 0xff).await;
        assert_eq!(refused, excess, "past the key's bound, a new connection's subscriptions are refused");
        assert_eq!(metric_with(&n, "dagfold_subscriptions_refused_total", "reason=\"key\""), excess as f64);
        assert_eq!(n.metric("dagfold_subscribers"), SUBSCRIPTIONS_PER_KEY_MAX as f64, "the node holds the key's bound");
    });
}

/// A client that asks for syncs and reads nothing does not hold the node's
/// sync permits: a reply is collected under a permit and sent after it is
/// released, and a connection is served one sync at a time. Another
/// client's sync is answered at once. Before, two such requests held both
/// permits until their streams timed out (`REPLY_FRAME_WRITE_TIMEOUT_MS`,
/// 10 s), and every other sync waited.
#[test]
fn a_slow_sync_reader_does_not_hold_the_permits() {
    let dir = tempfile::tempdir().unwrap();
    let seed = [0x52u8; 32];
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &peer_flag(&seed));
    let w = workload_for(&n, &WorkloadConfig { seed: 34, data_ops: 2000, writers: 2, ..Default::default() });
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    send_frames(n.listen, &frames, 1, 1);
    let total = w.messages.iter().filter(|m| m.id != ZERO).count() as u64;
    assert!(wait_until(WAIT, || n.scope(&w.scope).is_some_and(|s| s["applied"].as_u64() == Some(total))));
    let whole = |max_ops| NodeMessage::SyncRequest(SyncRequest { scope: w.scope, want: w.data_heads.clone(), have: Vec::new(), max_ops });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // The slow reader: small receive windows, so that its replies (the
        // whole scope, far more than the windows) stop being taken at once.
        let small = dagfold::net::ServerConfig { stream_receive_window_bytes: 16 << 10, connection_receive_window_bytes: 32 << 10, ..Default::default() };
        let me = dagfold::net::identity_cert(&seed).unwrap();
        let ep = dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), &small, Some(&me)).unwrap();
        let conn = tokio::time::timeout(WAIT, dagfold::net::connect(&ep, n.listen)).await.unwrap().unwrap();
        let mut slow = Vec::new();
        for _ in 0..2 {
            let (mut sw, sr) = dagfold::net::open_bi(&conn).await.unwrap();
            sw.write(&whole(dagfold::protocol::node::SYNC_OPS_MAX).encode()).await.unwrap();
            slow.push((sw, sr));
        }
        let started = tokio::task::block_in_place(|| wait_until(WAIT, || n.metric("dagfold_sync_requests_served_total") >= 1.0));
        assert!(started, "the slow reader's first sync is served");
        tokio::time::sleep(Duration::from_millis(500)).await;

        // Another client, a member: its sync completes at once.
        let asked = std::time::Instant::now();
        let (_fw, mut fr) = ask(&n, Some(w.writers[0].seed), whole(10)).await;
        let mut ops = 0;
        let done = loop {
            let frame = tokio::time::timeout(WAIT, fr.read()).await.expect("a frame in time").unwrap().expect("a SyncDone before the end");
            match NodeMessage::decode(&frame) {
                Some(NodeMessage::SyncDone(d)) => break d,
                _ => ops += 1,
            }
        };
        let took = asked.elapsed();
        assert_eq!(done.sent, ops);
        assert!(ops > 0, "the member is served");
        assert!(took < Duration::from_secs(4), "the member's sync waited {took:?} behind a reader that reads nothing");
        drop(slow);
    });
}

/// `dagfold import` takes the node's genesis flags: given
/// `--accept-scopes-from` another key, a stranger's genesis is refused
/// (counted in the summary); given none, the file's geneses are accepted.
#[test]
fn import_takes_the_genesis_flags() {
    let root = tempfile::tempdir().unwrap();
    let w = generate(&WorkloadConfig { seed: 34, data_ops: 10, ..Default::default() }, [1; 32], [2; 32]);
    let file = root.path().join("scope.frames");
    let mut bytes = Vec::new();
    for m in &w.messages {
        bytes.extend_from_slice(&(m.frame.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&m.frame);
    }
    std::fs::write(&file, bytes).unwrap();
    let import = |data: &str, extra: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dagfold"))
            .args(["import", "--data-dir", root.path().join(data).to_str().unwrap()])
            .args(extra)
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let strict = import("strict", &["--accept-scopes-from", &hex::encode([11u8; 32])]);
    assert_eq!(strict["genesis_refused"], 1, "{strict}");
    let open = import("open", &[]);
    assert_eq!(open["genesis_refused"], 0, "{open}");
}

/// `KeysRequest` (docs/PROTOCOL.md, "Key deliveries"): a member gets the
/// deliveries the node made to its proven key, and only those; a stranger
/// gets none; an anonymous client is refused.
#[test]
fn key_deliveries_are_served_again_only_to_their_recipient() {
    use common::api::{request, token};
    use dagfold::protocol::node::KeysRequest;
    let dir = tempfile::tempdir().unwrap();
    let n = NodeProc::start_with_policy(dir.path(), loopback(free_port()), loopback(free_port()), &[]);
    let t = token(&n);
    let (_, created) = request(&n, "POST", "/v1/scopes", Some(&t), Some(&serde_json::json!({"name": "k"})));
    let s = created["scope"].as_str().unwrap().to_owned();
    let member = dagfold::core::Identity::from_secrets([0x51; 32], [0x52; 32]);
    let add = serde_json::json!({ "public_key": hex::encode(member.public_key), "kem_public_key": hex::encode(member.kem_public), "role": "reader" });
    assert_eq!(request(&n, "POST", &format!("/v1/scopes/{s}/members"), Some(&t), Some(&add)).0, 201);
    assert_eq!(request(&n, "POST", &format!("/v1/scopes/{s}/keys/rotate"), Some(&t), None).0, 200);
    let ask_keys = || NodeMessage::KeysRequest(KeysRequest { after_scope: ZERO, after_key_id: ZERO });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        /// The deliveries of a reply, up to its `SyncDone`.
        async fn deliveries(mut r: StreamFrames) -> Result<Vec<dagfold::protocol::KeyDelivery>, FrameError> {
            let mut out = Vec::new();
            while let Some(frame) = tokio::time::timeout(WAIT, r.read()).await.expect("in time")? {
                match dagfold::core::decode_frame(&frame) {
                    Ok(dagfold::core::Decoded::Key(kd)) => out.push(kd),
                    _ => break,
                }
            }
            Ok(out)
        }
        let (_a, r) = ask(&n, None, ask_keys()).await;
        assert!(refused(&deliveries(r).await), "an anonymous request is refused");
        let (_b, r) = ask(&n, Some([0x77; 32]), ask_keys()).await;
        assert!(deliveries(r).await.unwrap().is_empty(), "a stranger gets none");
        let (_c, r) = ask(&n, Some(member.seed), ask_keys()).await;
        let got = deliveries(r).await.unwrap();
        // The first key on joining, the rotated one after.
        assert_eq!(got.len(), 2, "{got:?}");
        for kd in &got {
            assert_eq!(kd.recipient, member.public_key);
            assert!(dagfold::protocol::crypto::open_key_delivery(kd, &member.kem_secret).is_some(), "it opens for its recipient");
        }
    });
}
