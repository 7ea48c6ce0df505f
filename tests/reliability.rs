//! Reliability: the short versions of the campaigns of docs/RELIABILITY.md
//! (`dagfold-campaign`, tools/campaign), run as tests, and regression tests
//! for what the campaigns found.
//!
//! The campaigns run the release binaries as child processes on loopback;
//! they run one at a time (a lock), with generous internal timeouts and no
//! timing assertions, so that they pass on a loaded 2-core machine.
#![cfg(feature = "rocksdb-store")]

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::node::*;

/// One campaign at a time: each starts several processes.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The power-cut filesystem's binary (tools/powercut, its own workspace:
/// tools/test.sh builds it beside the campaign's).
fn powercut_bin() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_BIN_EXE_dagfold-campaign")).with_file_name("dagfold-powercut")
}

/// Whether power cuts can run here: FUSE (/dev/fuse) and the right to
/// mount (root). Where they can, the power-cut binary must be built.
fn power_cuts_here() -> bool {
    // SAFETY: no arguments, no side effects.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = std::path::Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("SKIPPED power cuts: they need /dev/fuse and root (/dev/fuse present: {fuse}, root: {root}); SIGKILLs only");
        return false;
    }
    assert!(
        powercut_bin().exists(),
        "{} is missing: tools/test.sh builds it (cargo build --release --manifest-path tools/powercut/Cargo.toml --target-dir TARGET)",
        powercut_bin().display()
    );
    true
}

/// Runs `dagfold-campaign ARGS`: whether it passed, its JSON report, the
/// tail of its progress.
fn run_campaign(args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dagfold-campaign"))
        .args(["--dagfold-bin", env!("CARGO_BIN_EXE_dagfold"), "--loadgen-bin", env!("CARGO_BIN_EXE_dagfold-loadgen")])
        .arg("--powercut-bin")
        .arg(powercut_bin())
        .args(args)
        .output()
        .expect("running dagfold-campaign");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no report from the campaign {args:?}; stderr:\n{stderr}"));
    let tail: Vec<&str> = stderr.lines().collect();
    let tail = tail[tail.len().saturating_sub(30)..].join("\n");
    (out.status.success() && report["ok"] == true, report, tail)
}

/// Runs `dagfold-campaign ARGS` and returns its JSON report; panics with
/// the report and the tail of its progress if it did not pass.
fn campaign(args: &[&str]) -> serde_json::Value {
    let (ok, report, tail) = run_campaign(args);
    assert!(ok, "campaign {args:?} failed:\n{report:#}\n--- stderr tail ---\n{tail}");
    eprintln!("campaign {args:?}: {report}");
    report
}

/// A node restarted after SIGKILL answers the old connections of its
/// previous run with a stateless reset that clients accept (the reset key
/// is persisted with the certificate), so peers and clients redial at once
/// instead of waiting out the 30 s idle timeout after every restart. Found
/// by the crash campaign (each restart stalled the load and the peer link).
#[test]
fn a_restarted_node_resets_the_connections_of_its_previous_run() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cfg = dagfold::net::ServerConfig::default();
    let (endpoint, conn) = rt.block_on(async {
        let endpoint = dagfold::net::client_endpoint("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let conn = tokio::time::timeout(Duration::from_secs(10), dagfold::net::connect(&endpoint, n.listen)).await.unwrap().unwrap();
        // Garbage on a stream of its own: the node answers (stops it), so
        // the connection is known to be up.
        let _ = tokio::time::timeout(Duration::from_secs(10), dagfold::net::send_frames_uni(&conn, [vec![255u8]])).await;
        (endpoint, conn)
    });
    n.kill();
    n.restart();
    let reason = rt.block_on(async {
        // Anything sent on the old connection reaches the new process, which
        // answers with a stateless reset. Without one, the connection would
        // only end at the idle timeout (30 s), past this wait.
        let _ = tokio::time::timeout(Duration::from_secs(2), dagfold::net::send_frames_uni(&conn, [vec![255u8]])).await;
        tokio::time::timeout(Duration::from_secs(20), conn.closed()).await
    });
    drop(endpoint);
    match reason {
        Ok(quinn::ConnectionError::Reset) => {}
        other => panic!("the old connection should end with a stateless reset, got {other:?}"),
    }
    // The key is the same across runs.
    let key = std::fs::read(dir.path().join("tls").join(dagfold::net::tls::RESET_KEY_FILE)).unwrap();
    assert_eq!(key.len(), 32);
}

/// The crash campaign, short: 3 SIGKILLs and 3 power cuts under load
/// (see tools/campaign/crash.rs); after each, everything the node
/// acknowledged is in its store.
#[test]
fn crash_campaign_short() {
    let _g = serial();
    let cuts = if power_cuts_here() { "3" } else { "0" };
    let r = campaign(&["crash", "--kills", "3", "--cuts", cuts, "--ops", "4000", "--rate", "1000", "--seed", "7"]);
    assert_eq!(r["kills"], 3);
    assert_eq!(r["power_cuts"].as_u64(), cuts.parse().ok());
    assert!(r["opens"].as_u64().unwrap() >= 4, "the store opened at every restart");
    assert_eq!(r["root_a"], r["root"]);
    assert_eq!(r["acknowledged_losses"], 0);
    // The records were not empty: every event and API write was checked.
    assert_eq!(r["acknowledged_at_end"]["events"], 4000);
    assert!(r["acknowledged_at_end"]["api_writes"].as_u64().unwrap() > 0);
    assert!(r["acknowledged_at_end"]["status_heads"].as_u64().unwrap() > 0);
}

/// The check has teeth: with `--durability fast` (commits not synced) the
/// power cuts lose ops the node had acknowledged, and the campaign fails
/// saying so.
#[test]
fn crash_campaign_short_finds_acknowledged_losses_without_sync() {
    if !power_cuts_here() {
        return;
    }
    let _g = serial();
    // A failed campaign keeps its work directory: this one is the test's,
    // removed when it ends (the filesystem is unmounted by then).
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().to_str().unwrap();
    // At the node's own memtable sizes: capped small (the campaign's
    // default, for aims at flushes), every flush syncs what came before it,
    // and two cuts may find nothing unsynced that was acknowledged.
    let args = [
        "--work-dir", work_dir, "crash", "--kills", "1", "--cuts", "2", "--ops", "4000", "--rate", "1000", "--seed", "7", "--durability", "fast",
        "--memtable-bytes-max", "0",
    ];
    let (ok, r, tail) = run_campaign(&args);
    assert!(!ok, "the campaign passed with --durability fast:\n{r:#}\n{tail}");
    assert!(r["acknowledged_losses"].as_u64().unwrap() > 0, "no acknowledged loss found:\n{r:#}\n{tail}");
    assert!(r["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("acknowledged loss")));
}

/// A subscription whose client went away is released at once, even on a
/// scope that never has another event: before, it stayed registered (and
/// counted against the 4096 subscriptions of the node) until that scope's
/// next event, so clients subscribing to a quiet or unknown scope and
/// leaving could use up every subscription slot. Found by the subscribers
/// flood (`dagfold-campaign flood --kind subscribers`).
#[test]
fn a_subscription_to_a_quiet_scope_is_released_when_its_client_leaves() {
    use dagfold::protocol::node::{NodeMessage, Subscribe};
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // The client proves a key the node takes as a peer's (served every
    // scope, SPEC §10; its address is one nothing listens on).
    let seed = [0x42u8; 32];
    let peer = format!("{}@127.0.0.1:1", hex::encode(dagfold::protocol::sig::public_key_from_seed(&seed)));
    let n = NodeProc::start(dir.path(), loopback(free_port()), loopback(free_port()), &["--peer".into(), peer]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let cfg = dagfold::net::ServerConfig::default();
    rt.block_on(async {
        let me = dagfold::net::identity_cert(&seed).unwrap();
        let endpoint = dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), &cfg, Some(&me)).unwrap();
        let mut conns = Vec::new();
        for i in 0..3u8 {
            let conn = tokio::time::timeout(Duration::from_secs(10), dagfold::net::connect(&endpoint, n.listen)).await.unwrap().unwrap();
            let (mut w, r) = dagfold::net::open_bi(&conn).await.unwrap();
            // A scope nobody writes to (no genesis: it never has an event).
            w.write(&NodeMessage::Subscribe(Subscribe { scope: [i + 1; 32], from_seq: 1 }).encode()).await.unwrap();
            conns.push((conn, w, r));
        }
        let registered = tokio::task::block_in_place(|| wait_until(Duration::from_secs(20), || n.metric("dagfold_subscribers") == 3.0));
        assert!(registered, "three subscriptions registered: {}", n.metric("dagfold_subscribers"));
        // One client stops its stream, two close their connections.
        let (_, _, mut r) = conns.remove(0);
        r.stop(0).unwrap();
        for (conn, _, _) in &conns {
            conn.close(0u32.into(), b"bye");
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), endpoint.wait_idle()).await;
        drop(r);
    });
    let released = wait_until(Duration::from_secs(20), || n.metric("dagfold_subscribers") == 0.0);
    assert!(released, "subscriptions still registered after their clients left: {}", n.metric("dagfold_subscribers"));
}

/// Garbage over QUIC, short: undecodable, oversized, truncated and 1 MiB
/// frames, node messages past their bounds, misordered parents, bad
/// signatures, each counted; valid traffic completes alongside.
#[test]
fn flood_garbage_short() {
    let _g = serial();
    let r = campaign(&["flood", "--short", "--kind", "garbage"]);
    eprintln!("garbage: valid rate flood/clean {}", r["kinds"]["garbage"]["valid_rate_ratio"]);
}

/// Streams from one host that announce 1 MiB frames and stall hold only
/// their origin's share of the frame byte budget: the valid load, from
/// another host, is applied in full while they stall.
#[test]
fn flood_stall_short() {
    let _g = serial();
    let r = campaign(&["flood", "--short", "--kind", "stall"]);
    eprintln!("stall: valid rate flood/clean {}", r["kinds"]["stall"]["valid_rate_ratio"]);
}

/// Connections opened and closed in a loop, 96 at once against
/// `--connections-max 64`: refusals counted, every slot given back.
#[test]
fn flood_connections_short() {
    let _g = serial();
    let r = campaign(&["flood", "--short", "--kind", "connections"]);
    assert!(r["kinds"]["connections"]["flood"]["counters"]["net_connections_refused"].as_f64().unwrap() > 0.0);
}

/// Subscribers that never read are dropped with a `Lagged` (counted), the
/// node keeps applying, and every subscription is released when its client
/// leaves, on a quiet scope too.
#[test]
fn flood_subscribers_short() {
    let _g = serial();
    let r = campaign(&["flood", "--short", "--kind", "subscribers"]);
    assert_eq!(r["kinds"]["subscribers"]["flood"]["flood"]["subscribed_after_close"], 0.0);
}

/// A peer asking for a whole scope in a tight loop (some requests
/// abandoned): served at most two at a time, the node keeps applying.
#[test]
fn flood_sync_requests_short() {
    let _g = serial();
    campaign(&["flood", "--short", "--kind", "sync"]);
}

/// Forged heartbeats (maximal: 128 scopes × 2 × 64 random heads, naming
/// the node's scopes and random ones) from 300 connections, anonymous, from
/// stranger keys and from a member's key: every scope beat of the anonymous
/// and the strangers refused and counted by reason, the member's heard but
/// the heads-we-lack notes within their bound, and a real peer (configured
/// by key) converging with the node while the flood runs.
#[test]
fn flood_heartbeats_short() {
    let _g = serial();
    let r = campaign(&["flood", "--short", "--kind", "heartbeats", "--valid-ops", "4000", "--preload-ops", "3000", "--timeout-s", "120"]);
    let run = &r["kinds"]["heartbeats"]["flood"];
    assert_eq!(run["peer"]["converged"], true);
    let f = &run["flood"];
    assert!(f["refused_counted"]["anonymous"].as_f64().unwrap() >= f["refused_expected"]["anonymous"].as_f64().unwrap());
    assert!(f["lacking_notes_max"].as_f64().unwrap() <= dagfold::limits::LACKING_NOTES_MAX as f64);
}

/// Whether a tmpfs can be mounted here (needs mount permission): tried on
/// a scratch directory, unmounted at once. The error says why not.
fn can_mount_tmpfs() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let at = dir.path().to_str().unwrap();
    let out = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", at]).output().map_err(|e| format!("mount: {e}"))?;
    if !out.status.success() {
        return Err(format!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let umounted = Command::new("umount").arg(at).status().is_ok_and(|s| s.success());
    assert!(umounted, "unmounting the probe tmpfs at {at}");
    Ok(())
}

/// A full disk: a 64 MiB tmpfs filled up to 768 KiB (needs mount
/// permission). The node refuses with a log line naming the full disk and
/// the metrics, keeps answering status, and after space returns and a
/// restart catches up from its peer. Where no tmpfs can be mounted the
/// full disk cannot be made: the test says so and checks nothing (the
/// write error of `disk_write_error_short` is another fault, not a
/// stand-in).
#[test]
fn disk_full_short() {
    let _g = serial();
    if let Err(why) = can_mount_tmpfs() {
        eprintln!("disk_full_short: SKIPPED, no full disk can be made here ({why}); run the suite as root to test it");
        return;
    }
    let r = campaign(&["disk", "--fault", "enospc", "--ops", "8000"]);
    assert_eq!(r["fault"], "enospc", "the fault used: {}", r["notes"]);
    let line = r["log_line"].as_str().unwrap();
    assert!(line.contains("No space left on device"), "the node failed on the full disk: {line}");
}

/// A write error (EFBIG past RLIMIT_FSIZE on the node process), same checks.
#[test]
fn disk_write_error_short() {
    let _g = serial();
    let r = campaign(&["disk", "--fault", "efbig", "--ops", "8000"]);
    assert!(r["log_line"].as_str().unwrap().contains("File too large"));
}

/// The partition campaign, short: four nodes whose links go through the
/// campaign's UDP relays, 50 scopes spread over them, three faults held 1 to
/// 2 s (none past the idle timeout) and overlapping, a one-way cut among
/// them; after the last heal every node holds every scope at the
/// generator's root, heads and count. Each fault dropped datagrams (it
/// landed), and the relays passed datagrams both ways.
#[test]
fn partition_campaign_short() {
    let _g = serial();
    let t = std::time::Instant::now();
    let r = campaign(&[
        "partition", "--seed", "3", "--nodes", "4", "--scopes", "50", "--ops-per-scope", "6", "--cuts", "3", "--hold-ms-min", "1000",
        "--hold-ms-max", "2000", "--long-cuts", "0", "--converge-timeout-s", "40",
    ]);
    assert_eq!(r["converged"], true);
    assert_eq!(r["scopes_diverged"], 0);
    assert_eq!(r["scope_statuses_missing"], 0);
    assert_eq!(r["ops"], 50 * 8, "each scope's genesis, governance op and 6 data ops");
    let kinds = &r["faults_by_kind"];
    let one_way = kinds["one_way"].as_u64().unwrap_or(0) + kinds["mute"].as_u64().unwrap_or(0);
    assert!(one_way >= 1, "an asymmetric cut in the schedule: {kinds}");
    let log = r["fault_log"].as_array().unwrap();
    assert_eq!(log.len(), 3, "every fault healed once");
    assert_eq!(r["heals"], 3);
    for f in log {
        assert!(f["dropped"].as_u64().unwrap() > 0, "the fault landed: {f}");
    }
    assert!(r["datagrams_passed"].as_u64().unwrap() > 0);
    eprintln!("partition_campaign_short: {:.1}s", t.elapsed().as_secs_f64());
}
