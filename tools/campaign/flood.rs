//! Floods over QUIC. Each kind runs twice on a fresh node holding the same
//! preloaded scope: once clean, once under the flood; in both, the same
//! valid load (`dagfold-loadgen send`, a second scope) is sent and timed.
//! Throughout the flood run the node's RSS is sampled; at the end the node
//! must be up, answer its status, have applied the whole valid load, and
//! have counted the flood's drops, evictions and refusals in /metrics. The
//! rate ratio (flood / clean) is reported, not asserted.
//!
//! Kinds:
//! - `orphans`: data ops whose parents never arrive (signed, in 4 scopes),
//!   with small buffer bounds so that most are evicted;
//! - `garbage`: undecodable, oversized, truncated, 1 MiB, over-bound node
//!   messages, misordered parents (each on its own stream) and ops with bad
//!   signatures;
//! - `stall`: streams that declare a 1 MiB frame and never send it;
//! - `connections`: connections opened and closed in a loop, more at once
//!   than `--connections-max`;
//! - `subscribers`: subscriptions that never read (and one that stops
//!   reading, then comes back to find its `Lagged`), on the valid scope and
//!   on the quiet preloaded one;
//! - `sync`: `SyncRequest`s for the whole preloaded scope in a tight loop,
//!   most read to the end, some abandoned;
//! - `heartbeats`: forged heartbeats (128 scopes × 2 × 64 random heads,
//!   naming the node's scopes and random ones) from connection after
//!   connection, anonymous, from stranger keys and from a member's key,
//!   while a real peer (configured by key on both sides) syncs from the
//!   node and must converge with it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use dagfold::net::ServerConfig;
use dagfold::protocol::node::*;
use dagfold::protocol::{Hash, Op, PLANE_DATA};
use dagfold::workload::{sign_op, Member};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::check::{identity_from, seed_identity};
use crate::proc::{free_port, loopback, metric_in, run_tool, wait_until, Bins, NodeProc, RssSampler};
use dagfold::core::Identity;
use dagfold::limits::LACKING_NOTES_MAX;

/// Where the valid load is sent from: another loopback address than the
/// flood's, so that the node sees two origins, as it would two hosts.
const VALID_SENDER_BIND: &str = "127.0.0.2:0";

pub const KINDS: [&str; 8] = ["orphans", "garbage", "stall", "connections", "subscribers", "sync", "heartbeats", "clean"];

#[derive(clap::Args, Debug, Clone)]
pub struct FloodArgs {
    /// Comma-separated kinds: orphans, garbage, stall, connections,
    /// subscribers, sync, heartbeats; or `all`.
    #[arg(long, default_value = "all")]
    pub kind: String,
    /// The test suite's sizes instead of the campaign's.
    #[arg(long)]
    pub short: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Valid data ops sent and timed in each run [default: 30000; short 8000].
    #[arg(long)]
    pub valid_ops: Option<usize>,
    /// Data ops of the preloaded scope (synced, subscribed) [default: 6000; short 4500].
    #[arg(long)]
    pub preload_ops: Option<usize>,
    /// Orphan ops [default: 100000; short 20000].
    #[arg(long)]
    pub orphans: Option<usize>,
    /// Connections opened and closed at least [default: 5000; short 600].
    #[arg(long)]
    pub connections: Option<usize>,
    /// Subscriptions that never read [default: 100; short 12].
    #[arg(long)]
    pub subscribers: Option<usize>,
    /// Garbage streams at least [default: 20000; short 2000].
    #[arg(long)]
    pub garbage: Option<usize>,
    /// Sync requests at least [default: 400; short 40].
    #[arg(long)]
    pub syncs: Option<usize>,
    /// Connections sending forged heartbeats at least [default: 10000; short 300].
    #[arg(long)]
    pub heartbeat_connections: Option<usize>,
    /// The node's RSS must stay below this (MiB).
    #[arg(long, default_value_t = 1536)]
    pub rss_max_mb: u64,
    /// Bound on each run.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

struct Sizes {
    valid: usize,
    preload: usize,
    orphans: usize,
    connections: usize,
    subscribers: usize,
    garbage: usize,
    syncs: usize,
    heartbeats: usize,
}

impl Sizes {
    fn of(a: &FloodArgs) -> Sizes {
        let s = a.short;
        Sizes {
            valid: a.valid_ops.unwrap_or(if s { 8_000 } else { 30_000 }),
            preload: a.preload_ops.unwrap_or(if s { 4_500 } else { 6_000 }),
            orphans: a.orphans.unwrap_or(if s { 20_000 } else { 100_000 }),
            connections: a.connections.unwrap_or(if s { 600 } else { 5_000 }),
            subscribers: a.subscribers.unwrap_or(if s { 12 } else { 100 }),
            garbage: a.garbage.unwrap_or(if s { 2_000 } else { 20_000 }),
            syncs: a.syncs.unwrap_or(if s { 40 } else { 400 }),
            heartbeats: a.heartbeat_connections.unwrap_or(if s { 300 } else { 10_000 }),
        }
    }
}

/// Node flags per kind (the same for its clean and its flood run).
/// The identity the flood's clients present: the node is told it is a peer
/// (`--peer KEY@127.0.0.1:1`, a port nothing listens on), so that its
/// subscriptions and syncs are served (SPEC §10) and the floods measure
/// the node's bounds, not its refusals.
const FLOOD_CLIENT_SEED: [u8; 32] = [0x5a; 32];

fn flood_identity() -> dagfold::net::NodeCert {
    dagfold::net::identity_cert(&FLOOD_CLIENT_SEED).expect("identity certificate")
}

fn node_flags(kind: &str, sz: &Sizes) -> Vec<String> {
    let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let key = hex::encode(dagfold::protocol::sig::public_key_from_seed(&FLOOD_CLIENT_SEED));
    let mut flags = f(&["--peer", &format!("{key}@127.0.0.1:1")]);
    flags.extend(match kind {
        // Most orphans must be evicted: a quarter of them fit.
        "orphans" => {
            let total = (sz.orphans / 4).max(2);
            f(&["--buffered-ops-per-scope-max", &(total / 2).to_string(), "--buffered-ops-total-max", &total.to_string()])
        }
        "connections" => f(&["--connections-max", "64"]),
        _ => Vec::new(),
    });
    flags
}

/// What a flood shares with the campaign while it runs.
#[derive(Clone)]
struct Ctx {
    node: SocketAddr,
    admin: SocketAddr,
    valid_scope: Hash,
    quiet_scope: Hash,
    quiet_heads: Vec<Hash>,
    orphans: Arc<Vec<Vec<u8>>>,
    sizes: Arc<Sizes>,
    seed: u64,
    /// The signing seed of the scopes' author (a member of both).
    member_seed: [u8; 32],
    stop: Arc<AtomicBool>,
    /// Units of flood done (frames, connections, requests...).
    progress: Arc<AtomicU64>,
    /// Set once the flood did at least its planned amount.
    planned_done: Arc<AtomicBool>,
    /// Set once the flood is in place (the valid load starts then).
    ready: Arc<AtomicBool>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    /// The next unit of flood to do, from `counter`; once `planned` are
    /// taken the planned amount is done, and none is given once stopped.
    fn next_unit(&self, counter: &AtomicU64, planned: u64) -> Option<u64> {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        if i >= planned {
            self.planned_done.store(true, Ordering::Relaxed);
            if self.stopped() {
                return None;
            }
        }
        Some(i)
    }
    fn metric(&self, name: &str, label: Option<&str>) -> f64 {
        dagfold::testkit::http_get(self.admin, "/metrics", Duration::from_secs(5))
            .map(|(_, t)| metric_in(&t, name, label))
            .unwrap_or(0.0)
    }
}

fn h32(s: &str) -> Hash {
    dagfold::protocol::parse_hash_hex(s).expect("64 hex characters")
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dst = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), dst)?;
        }
    }
    Ok(())
}

/// Signed data ops whose parent and cut are random ids (never sent), in 4
/// scopes: each is buffered (pending) until evicted.
fn make_orphans(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x0_4FA4);
    let authors: Vec<Member> = (0..8)
        .map(|_| {
            let s: [u8; 32] = rng.gen();
            Member { seed: s, public_key: dagfold::protocol::sig::public_key_from_seed(&s) }
        })
        .collect();
    let scopes: Vec<Hash> = (0..4).map(|_| rng.gen()).collect();
    (0..n)
        .map(|i| {
            let len = rng.gen_range(48..200);
            let mut payload = vec![0u8; len];
            rng.fill(&mut payload[..]);
            let mut op = Op {
                version: 1,
                scope: scopes[i % 4],
                plane: PLANE_DATA,
                author: [0; 32],
                parents: vec![rng.gen()],
                cut: vec![rng.gen()],
                hlc: 1_000 + i as u64,
                key_id: rng.gen(),
                nonce: rng.gen(),
                payload,
                signature: [0; 64],
            };
            sign_op(&mut op, &authors[i % authors.len()]).0
        })
        .collect()
}

pub fn run(a: &FloodArgs, bins: &Bins, work: &Path) -> anyhow::Result<serde_json::Value> {
    let sz = Arc::new(Sizes::of(a));
    let kinds: Vec<String> = if a.kind == "all" {
        ["orphans", "garbage", "stall", "connections", "subscribers", "sync", "heartbeats"].iter().map(|s| s.to_string()).collect()
    } else {
        a.kind.split(',').map(|s| s.trim().to_string()).collect()
    };
    for k in &kinds {
        if !KINDS.contains(&k.as_str()) {
            return Err(anyhow!("unknown flood kind {k:?} (one of {KINDS:?})"));
        }
    }
    // One identity for every run, so that one pair of frames files serves.
    let id = identity_from(a.seed, "flood");
    let template = work.join("template");
    seed_identity(&template, &id)?;
    // The heartbeats kind's real peer gets the scopes' keys too (an extra
    // recipient), so that it can apply what it syncs and show the roots.
    let peer_id = identity_from(a.seed, PEER_LABEL);
    let extra = if kinds.iter().any(|k| k == "heartbeats") {
        vec!["--extra-recipient".to_string(), format!("{}:{}", hex::encode(peer_id.public_key), hex::encode(peer_id.kem_public))]
    } else {
        Vec::new()
    };
    let file_of = |name: &str, ops: usize, seed: u64| -> anyhow::Result<serde_json::Value> {
        let path = work.join(format!("{name}.frames"));
        let mut v = crate::proc::loadgen_file(bins, work, &format!("loadgen-file-{name}"), &path, &id, ops, seed, &extra)?;
        v["path"] = json!(path.display().to_string());
        Ok(v)
    };
    eprintln!("flood campaign: generating the preloaded and the valid scopes");
    let quiet = file_of("preload", sz.preload, a.seed * 2 + 1)?;
    let valid = file_of("valid", sz.valid, a.seed * 2 + 2)?;
    import(bins, &template, Path::new(quiet["path"].as_str().unwrap()))?;
    let quiet_scope = h32(quiet["scope"].as_str().unwrap());
    let orphans = Arc::new(if kinds.iter().any(|k| k == "orphans") {
        eprintln!("flood campaign: signing {} orphans", sz.orphans);
        make_orphans(sz.orphans, a.seed)
    } else {
        Vec::new()
    });

    let mut results = serde_json::Map::new();
    let mut problems: Vec<String> = Vec::new();
    for kind in &kinds {
        let mut runs = Vec::new();
        for flooded in [false, true] {
            if kind == "clean" && flooded {
                continue;
            }
            let label = if flooded { "flood" } else { "clean" };
            eprintln!("flood campaign: {kind}: {label} run");
            let dir = work.join(format!("{kind}-{label}"));
            copy_dir(&template, &dir).map_err(|e| anyhow!("copying the template store: {e}"))?;
            let r = one_run(a, bins, work, kind, flooded, &dir, &sz, &valid, quiet_scope, &orphans, &id);
            match r {
                Ok(v) => runs.push(v),
                Err(e) => {
                    problems.push(format!("{kind} {label}: {e}"));
                    runs.push(json!({"error": e.to_string()}));
                }
            }
        }
        let rate = |i: usize| runs.get(i).and_then(|r| r["valid"]["ops_per_s"].as_f64());
        let ratio = match (rate(0), rate(1)) {
            (Some(c), Some(f)) if c > 0.0 => Some(f / c),
            _ => None,
        };
        for r in &runs {
            if let Some(p) = r["problems"].as_array() {
                problems.extend(p.iter().map(|x| format!("{kind}: {}", x.as_str().unwrap_or_default())));
            }
        }
        eprintln!("flood campaign: {kind}: valid rate flood/clean = {ratio:?}");
        results.insert(
            kind.clone(),
            json!({
                "valid_rate_ratio": ratio,
                "clean": runs.first(),
                "flood": runs.get(1),
            }),
        );
    }
    Ok(json!({
        "campaign": "flood",
        "ok": problems.is_empty(),
        "short": a.short,
        "seed": a.seed,
        "sizes": {
            "valid_ops": sz.valid, "preload_ops": sz.preload, "orphans": sz.orphans, "connections": sz.connections,
            "subscribers": sz.subscribers, "garbage": sz.garbage, "syncs": sz.syncs,
            "heartbeat_connections": sz.heartbeats,
        },
        "kinds": results,
        "problems": problems,
        "work_dir": work.display().to_string(),
    }))
}

#[allow(clippy::too_many_arguments)]
fn one_run(
    a: &FloodArgs,
    bins: &Bins,
    work: &Path,
    kind: &str,
    flooded: bool,
    dir: &Path,
    sz: &Arc<Sizes>,
    valid: &serde_json::Value,
    quiet_scope: Hash,
    orphans: &Arc<Vec<Vec<u8>>>,
    id: &Identity,
) -> anyhow::Result<serde_json::Value> {
    let label = if flooded { "flood" } else { "clean" };
    let listen = loopback(free_port());
    let mut flags = node_flags(kind, sz);
    let mut peer = None;
    if kind == "heartbeats" {
        let (p, flag) = start_peer(bins, work, label, id, listen, a.seed)?;
        flags.extend(["--peer".to_string(), flag]);
        peer = Some(p);
    }
    let log = work.join(format!("{kind}-{label}.log"));
    let mut node = NodeProc::at(&format!("{kind}-{label}"), &bins.dagfold, dir, &log, listen, loopback(free_port()), &flags);
    node.start(Duration::from_secs(60))?;
    let t_start = Instant::now();
    let pid = node.pid().unwrap();
    let quiet_heads: Vec<Hash> = node
        .scope(&quiet_scope)
        .and_then(|s| s["data_heads"].as_array().map(|a| a.iter().map(|h| h32(h.as_str().unwrap())).collect()))
        .context("the preloaded scope is missing")?;
    let ctx = Ctx {
        node: node.listen,
        admin: node.admin,
        valid_scope: h32(valid["scope"].as_str().unwrap()),
        quiet_scope,
        quiet_heads,
        orphans: orphans.clone(),
        sizes: sz.clone(),
        seed: a.seed,
        member_seed: id.seed,
        stop: Arc::new(AtomicBool::new(false)),
        progress: Arc::new(AtomicU64::new(0)),
        planned_done: Arc::new(AtomicBool::new(false)),
        ready: Arc::new(AtomicBool::new(false)),
    };
    let rss = RssSampler::start(pid, Duration::from_millis(100));
    let rss_before_kb = node.rss_kb();
    let flood = flooded.then(|| {
        let ctx = ctx.clone();
        let kind = kind.to_string();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(flood(&kind, ctx))
        })
    });
    // Let the flood get going before the valid load starts.
    if flooded {
        let ready = wait_until(Duration::from_secs(120), || {
            ctx.ready.load(Ordering::Relaxed) || (kind != "subscribers" && ctx.progress.load(Ordering::Relaxed) > 0)
        });
        if !ready {
            eprintln!("flood campaign: {kind}: the flood is not in place after 120 s; the valid load starts anyway");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let t_valid = Instant::now();
    let valid_report = run_tool(
        &bins.loadgen,
        &[
            "send".into(),
            // The honest sender is another host than the flooder (which
            // sends from 127.0.0.1): the node serves origins in turn.
            "--bind".into(),
            VALID_SENDER_BIND.into(),
            "--node".into(),
            node.listen.to_string(),
            "--admin".into(),
            node.admin.to_string(),
            "--file".into(),
            valid["path"].as_str().unwrap().into(),
            "--scope".into(),
            valid["scope"].as_str().unwrap().into(),
            "--root".into(),
            valid["root"].as_str().unwrap().into(),
            "--timeout-s".into(),
            a.timeout_s.to_string(),
            "--name".into(),
            format!("{kind}-{label}"),
        ],
        Duration::from_secs(a.timeout_s + 30),
        work,
        &format!("send-{kind}-{label}"),
    );
    let valid_s = t_valid.elapsed().as_secs_f64();
    let progress_during_valid = ctx.progress.load(Ordering::Relaxed);
    let mut problems = Vec::new();
    // The real peer must converge with the node while the flood goes on.
    let peer_report = peer.as_ref().map(|p| peer_converged(&node, p, &[quiet_scope, ctx.valid_scope], t_start, a.timeout_s));
    if let Some(r) = &peer_report {
        problems.extend(r["problems"].as_array().into_iter().flatten().map(|x| x.as_str().unwrap_or_default().to_string()));
    }
    let flood_report = match flood {
        Some(h) => {
            // The flood does at least its planned amount, then stops.
            let planned = wait_until(Duration::from_secs(a.timeout_s), || ctx.planned_done.load(Ordering::Relaxed) || h.is_finished());
            if !planned {
                problems.push("the flood did not complete its planned amount in time".to_string());
            }
            ctx.stop.store(true, Ordering::Relaxed);
            match h.join() {
                Ok(v) => Some(v),
                Err(_) => {
                    problems.push("the flood thread panicked".into());
                    None
                }
            }
        }
        None => None,
    };
    let (rss_max_kb, _) = rss.finish();
    let alive = node.alive();
    let identity_ok = node.get("/v1/identity").is_some_and(|(c, _)| c == 200);
    let valid_status = node.scope(&ctx.valid_scope);
    let metrics = node.metrics().unwrap_or_default();
    let hwm_kb = node.hwm_kb();
    if !alive || !identity_ok {
        problems.push(format!("the node is not up after the run (alive {alive}, status {identity_ok}); log: {}", node.log_tail(10)));
    }
    let valid_ok = valid_report.as_ref().is_ok_and(|v| v["root_ok"] == true)
        && valid_status.as_ref().is_some_and(|s| s["root"] == valid["root"]);
    if !valid_ok {
        problems.push(format!("the valid load did not complete: {:?}", valid_report.as_ref().err()));
    }
    if hwm_kb.max(rss_max_kb) > a.rss_max_mb * 1024 {
        problems.push(format!("RSS high-water {} MiB over the bound {} MiB", hwm_kb.max(rss_max_kb) / 1024, a.rss_max_mb));
    }
    if let Some(f) = &flood_report {
        if let Some(p) = f["problems"].as_array() {
            problems.extend(p.iter().map(|x| x.as_str().unwrap_or_default().to_string()));
        }
    }
    let m = |name: &str| metric_in(&metrics, name, None);
    let counters = json!({
        "net_frames_malformed": m("dagfold_net_frames_malformed_total"),
        "net_frames_malformed_decode": metric_in(&metrics, "dagfold_net_frames_malformed_total", Some("reason=\"decode\"")),
        "net_frames_malformed_oversize": metric_in(&metrics, "dagfold_net_frames_malformed_total", Some("reason=\"oversize\"")),
        "net_frames_malformed_truncated": metric_in(&metrics, "dagfold_net_frames_malformed_total", Some("reason=\"truncated\"")),
        "net_frames_timed_out": m("dagfold_net_frames_timed_out_total"),
        "net_replies_timed_out": m("dagfold_net_replies_timed_out_total"),
        "net_connections_accepted": m("dagfold_net_connections_accepted_total"),
        "net_connections_refused": m("dagfold_net_connections_refused_total"),
        "net_handshakes_failed": m("dagfold_net_handshakes_failed_total"),
        "net_connections_open": m("dagfold_net_connections_open"),
        "verified": m("dagfold_verified_total"),
        "bad_signature": metric_in(&metrics, "dagfold_received_total", Some("verdict=\"bad_signature\"")),
        "evicted": m("dagfold_engine_evicted_total"),
        "buffered_ops": m("dagfold_buffered_ops"),
        "buffered_bytes": m("dagfold_buffered_bytes"),
        "subscribers": m("dagfold_subscribers"),
        "subscribers_lagged": m("dagfold_subscribers_lagged_total"),
        "subscriptions_refused": m("dagfold_subscriptions_refused_total"),
        "sync_requests_served": m("dagfold_sync_requests_served_total"),
        "sync_ops_served": m("dagfold_sync_ops_served_total"),
        "gossip_dropped": m("dagfold_gossip_dropped_total"),
        "heartbeats_received": m("dagfold_heartbeats_received_total"),
        "heartbeat_scopes_refused": heartbeat_refused(&metrics, None),
        "lacking_notes": m("dagfold_lacking_notes"),
        "divergences": m("dagfold_divergences_total"),
        "refused_while_failed": m("dagfold_refused_while_failed_total"),
    });
    if kind == "heartbeats" {
        let divergences = m("dagfold_divergences_total");
        if divergences > 0.0 {
            problems.push(format!("{divergences} divergences counted by the node"));
        }
    }
    node.stop(Duration::from_secs(30));
    if let Some(mut p) = peer {
        p.stop(Duration::from_secs(30));
    }
    Ok(json!({
        "kind": kind,
        "peer": peer_report,
        "flooded": flooded,
        "valid": valid_report.as_ref().ok(),
        "valid_wall_s": valid_s,
        "flood_progress_while_valid_ran": progress_during_valid,
        "flood": flood_report,
        "rss_before_mb": rss_before_kb as f64 / 1024.0,
        "rss_max_sampled_mb": rss_max_kb as f64 / 1024.0,
        "rss_high_water_mb": hwm_kb as f64 / 1024.0,
        "counters": counters,
        "problems": problems,
    }))
}

async fn flood(kind: &str, ctx: Ctx) -> serde_json::Value {
    let r = match kind {
        "orphans" => orphans_flood(&ctx).await,
        "garbage" => garbage_flood(&ctx).await,
        "stall" => stall_flood(&ctx).await,
        "connections" => connections_flood(&ctx).await,
        "subscribers" => subscribers_flood(&ctx).await,
        "sync" => sync_flood(&ctx).await,
        "heartbeats" => heartbeats_flood(&ctx).await,
        _ => Ok(json!({})),
    };
    ctx.planned_done.store(true, Ordering::Relaxed);
    r.unwrap_or_else(|e| json!({"problems": [format!("the flood failed: {e}")]}))
}

fn endpoint(cfg: &ServerConfig) -> anyhow::Result<quinn::Endpoint> {
    dagfold::net::client::client_endpoint_as("127.0.0.1:0".parse().unwrap(), cfg, Some(&flood_identity())).map_err(anyhow::Error::from)
}

async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> anyhow::Result<quinn::Connection> {
    match tokio::time::timeout(Duration::from_secs(10), dagfold::net::connect(ep, addr)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(anyhow!("connect timed out")),
    }
}

fn framed(content: &[u8]) -> Vec<u8> {
    let mut v = (content.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(content);
    v
}

/// Orphans on 2 connections × 4 streams, pass after pass until stopped
/// (the first pass is the planned amount). Then: every orphan verified,
/// most evicted, the buffer within its bound.
async fn orphans_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let ep = endpoint(&ServerConfig::default())?;
    let n = ctx.orphans.len();
    let mut passes = 0u64;
    let t = Instant::now();
    let mut first_pass_s = None;
    while passes == 0 || !ctx.stopped() {
        let mut tasks = Vec::new();
        for c in 0..2 {
            let conn = connect(&ep, ctx.node).await?;
            for s in 0..4 {
                let lane = c * 4 + s;
                let (conn, ctx) = (conn.clone(), ctx.clone());
                tasks.push(tokio::spawn(async move {
                    let mut st = conn.open_uni().await?;
                    let mut i = lane;
                    while i < ctx.orphans.len() {
                        if passes_stop(&ctx) {
                            break;
                        }
                        dagfold::net::write_frame(&mut st, &ctx.orphans[i]).await?;
                        ctx.progress.fetch_add(1, Ordering::Relaxed);
                        i += 8;
                    }
                    let _ = st.finish();
                    let _ = tokio::time::timeout(Duration::from_secs(60), st.stopped()).await;
                    Ok::<(), anyhow::Error>(())
                }));
            }
        }
        for t in tasks {
            t.await??;
        }
        passes += 1;
        if passes == 1 {
            first_pass_s = Some(t.elapsed().as_secs_f64());
            // Every orphan of the first pass verified (the node kept up).
            let want = n as f64;
            let deadline = Instant::now() + Duration::from_secs(120);
            while ctx.metric("dagfold_verified_total", None) < want && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            ctx.planned_done.store(true, Ordering::Relaxed);
        }
    }
    let bound = (n / 4).max(2) as f64;
    // The node serves a host whose ops come to nothing with smaller turns,
    // so the flood's last frames may still be queued when it stops: let
    // them drain before counting.
    let deadline = Instant::now() + Duration::from_secs(120);
    while ctx.metric("dagfold_engine_evicted_total", None) < n as f64 - bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let evicted = ctx.metric("dagfold_engine_evicted_total", None);
    let buffered = ctx.metric("dagfold_buffered_ops", None);
    let verified = ctx.metric("dagfold_verified_total", None);
    let mut problems = Vec::new();
    if verified < n as f64 {
        problems.push(format!("only {verified} of {n} orphans verified"));
    }
    if evicted < n as f64 - bound {
        problems.push(format!("{evicted} evictions counted, at least {} expected", n as f64 - bound));
    }
    if buffered > bound {
        problems.push(format!("{buffered} ops buffered, over the bound {bound}"));
    }
    Ok(json!({
        "orphans": n, "passes": passes, "first_pass_s": first_pass_s,
        "orphans_per_s_first_pass": first_pass_s.map(|s| n as f64 / s),
        "buffer_bound": bound, "evicted": evicted, "buffered": buffered, "problems": problems,
    }))
}

fn passes_stop(ctx: &Ctx) -> bool {
    ctx.stopped() && ctx.planned_done.load(Ordering::Relaxed)
}

/// One garbage item: (reason it must be counted under, bytes for a stream).
fn garbage_item(i: u64, rng: &mut rand::rngs::StdRng, bad_op: &[u8]) -> (&'static str, Vec<u8>) {
    match i % 8 {
        0 | 1 => {
            // Undecodable content (a first byte no message has).
            let len = rng.gen_range(1..4096);
            let mut c = vec![0u8; len];
            rng.fill(&mut c[..]);
            c[0] = rng.gen_range(8..=255);
            ("decode", framed(&c))
        }
        2 => {
            let mut v = rng.gen_range(1_048_577u32..=u32::MAX).to_le_bytes().to_vec();
            v.extend((0..100).map(|_| rng.gen::<u8>()));
            ("oversize", v)
        }
        3 => {
            let mut v = 1000u32.to_le_bytes().to_vec();
            v.extend([255u8; 10]);
            ("truncated", v)
        }
        4 => {
            // A maximum-size frame that does not decode (the byte budget).
            let mut c = vec![0u8; 1_048_576];
            rng.fill(&mut c[..]);
            c[0] = 255;
            ("decode", framed(&c))
        }
        5 => {
            // Node messages past their bounds.
            let m = if i % 16 == 5 {
                let beat = ScopeBeat { scope: [1; 32], root: [2; 32], governance_heads: vec![], data_heads: vec![] };
                NodeMessage::Heartbeat(Heartbeat { scopes: vec![beat; HEARTBEAT_SCOPES_MAX + 1] })
            } else {
                NodeMessage::SyncRequest(SyncRequest { scope: [3; 32], want: vec![[4; 32]; SYNC_IDS_MAX + 1], have: vec![], max_ops: 1 })
            };
            ("decode", framed(&m.encode()))
        }
        6 => {
            // An op whose parents are not strictly ascending (malformed).
            // `bad_op` has two equal parents: see `bad_op_frames`.
            ("decode", framed(bad_op))
        }
        _ => ("bad_signature", Vec::new()),
    }
}

/// (an op frame with duplicate parents, an op frame with a bad signature).
fn bad_op_frames(seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xBAD0);
    let s: [u8; 32] = rng.gen();
    let m = Member { seed: s, public_key: dagfold::protocol::sig::public_key_from_seed(&s) };
    let p: Hash = rng.gen();
    let mut op = Op {
        version: 1,
        scope: rng.gen(),
        plane: PLANE_DATA,
        author: [0; 32],
        parents: vec![p, p],
        cut: vec![rng.gen()],
        hlc: 5,
        key_id: rng.gen(),
        nonce: [0; 12],
        payload: vec![1, 2, 3],
        signature: [0; 64],
    };
    let dup = sign_op(&mut op, &m).0;
    op.parents = vec![p];
    let (mut bad_sig, _) = sign_op(&mut op, &m);
    let last = bad_sig.len() - 1;
    bad_sig[last] ^= 0x55;
    (dup, bad_sig)
}

/// 32 tasks on 4 connections; each item on its own stream, finished, and
/// the node's answer awaited: STOP_SENDING with ERR_MALFORMED for garbage
/// (counted here per reason and compared with the node's counters).
async fn garbage_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let ep = endpoint(&ServerConfig::default())?;
    let planned = ctx.sizes.garbage as u64;
    let (dup, bad_sig) = bad_op_frames(ctx.seed);
    let (dup, bad_sig) = (Arc::new(dup), Arc::new(bad_sig));
    let next = Arc::new(AtomicU64::new(0));
    let counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> = Default::default();
    let mut tasks = Vec::new();
    for c in 0..4 {
        let conn = connect(&ep, ctx.node).await?;
        for w in 0..8 {
            let (conn, ctx, next, counts, dup, bad_sig) =
                (conn.clone(), ctx.clone(), next.clone(), counts.clone(), dup.clone(), bad_sig.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed ^ (c * 8 + w) as u64);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= planned {
                        ctx.planned_done.store(true, Ordering::Relaxed);
                        if ctx.stopped() {
                            break;
                        }
                    }
                    let (reason, bytes) = garbage_item(i, &mut rng, &dup);
                    let mut st = match conn.open_uni().await {
                        Ok(s) => s,
                        Err(e) => return Err(e.into()),
                    };
                    let bytes = if reason == "bad_signature" { framed(&bad_sig) } else { bytes };
                    // The node may stop the stream before it is all written.
                    let _ = st.write_all(&bytes).await;
                    let _ = st.finish();
                    let answer = tokio::time::timeout(Duration::from_secs(30), st.stopped()).await;
                    // Answered: the node stopped the stream, or acknowledged all
                    // of it (it then read the whole frame): either way it has
                    // judged it and must have counted it.
                    let key = match answer {
                        Ok(Ok(Some(code))) if code.into_inner() == dagfold::net::ERR_MALFORMED as u64 => format!("answered_{reason}"),
                        Ok(Ok(Some(code))) => format!("stopped_{code}_{reason}"),
                        Ok(Ok(None)) => format!("answered_{reason}"),
                        Ok(Err(_)) => format!("lost_{reason}"),
                        Err(_) => format!("no_answer_{reason}"),
                    };
                    *counts.lock().unwrap().entry(key).or_default() += 1;
                    ctx.progress.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), anyhow::Error>(())
            }));
        }
    }
    for t in tasks {
        t.await??;
    }
    let counts = counts.lock().unwrap().clone();
    let get = |k: &str| counts.get(k).copied().unwrap_or(0) as f64;
    let mut problems = Vec::new();
    // Give the pipeline a moment for the verdicts of the last ops.
    let want_bad = get("answered_bad_signature");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ctx.metric("dagfold_received_total", Some("verdict=\"bad_signature\"")) < want_bad && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for reason in ["decode", "oversize", "truncated"] {
        let answered = get(&format!("answered_{reason}"));
        let counted = ctx.metric("dagfold_net_frames_malformed_total", Some(&format!("reason=\"{reason}\"")));
        if counted < answered {
            problems.push(format!("{answered} {reason} garbage frames answered by the node, but it counted {counted}"));
        }
        if answered == 0.0 {
            problems.push(format!("no {reason} garbage was answered"));
        }
    }
    let bad = ctx.metric("dagfold_received_total", Some("verdict=\"bad_signature\""));
    if bad < want_bad {
        problems.push(format!("{want_bad} bad signatures delivered, {bad} counted"));
    }
    for (k, v) in &counts {
        if !k.starts_with("answered_") {
            problems.push(format!("{v} garbage streams ended as {k}"));
        }
    }
    Ok(json!({"streams": counts.values().sum::<u64>(), "outcomes": counts, "problems": problems}))
}

/// Streams that declare a maximum frame, send one byte of it and stall,
/// holding the node's frame byte budget, re-opened as the node times
/// them out.
async fn stall_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let ep = endpoint(&ServerConfig::default())?;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let conn = connect(&ep, ctx.node).await?;
        for _ in 0..24 {
            let (conn, ctx) = (conn.clone(), ctx.clone());
            tasks.push(tokio::spawn(async move {
                let mut opened = 0u64;
                while !ctx.stopped() {
                    let Ok(mut st) = conn.open_uni().await else { break };
                    let mut v = 1_048_576u32.to_le_bytes().to_vec();
                    v.push(255);
                    if st.write_all(&v).await.is_err() {
                        break;
                    }
                    opened += 1;
                    ctx.progress.fetch_add(1, Ordering::Relaxed);
                    // Hold it until the node stops it (its frame timeout) or we stop.
                    loop {
                        if ctx.stopped() {
                            let _ = st.reset(0u32.into());
                            return opened;
                        }
                        match tokio::time::timeout(Duration::from_millis(200), st.stopped()).await {
                            Ok(_) => break,
                            Err(_) => continue,
                        }
                    }
                }
                opened
            }));
        }
    }
    ctx.planned_done.store(true, Ordering::Relaxed);
    let mut opened = 0;
    for t in tasks {
        opened += t.await.unwrap_or(0);
    }
    Ok(json!({"stalled_streams_opened": opened, "problems": []}))
}

/// 96 workers on 4 endpoints, each connecting, sending one duplicate frame
/// on half of its connections, and closing, against `--connections-max 64`.
async fn connections_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let planned = ctx.sizes.connections as u64;
    let eps: Vec<quinn::Endpoint> = (0..4).map(|_| endpoint(&ServerConfig::default())).collect::<Result<_, _>>()?;
    let attempts = Arc::new(AtomicU64::new(0));
    let outcome: Arc<std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>> = Default::default();
    let frame = Arc::new(ctx.orphans.first().cloned().unwrap_or_else(|| vec![255]));
    let mut tasks = Vec::new();
    for w in 0..96 {
        let (ep, ctx, attempts, outcome, frame) = (eps[w % 4].clone(), ctx.clone(), attempts.clone(), outcome.clone(), frame.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(i) = ctx.next_unit(&attempts, planned) {
                let r = connect(&ep, ctx.node).await;
                let key = match r {
                    Ok(conn) => {
                        if i % 2 == 0 {
                            let _ = tokio::time::timeout(Duration::from_secs(5), dagfold::net::send_frames_uni(&conn, [frame.as_slice()])).await;
                        }
                        conn.close(0u32.into(), b"bye");
                        "connected"
                    }
                    Err(e) if e.to_string().contains("refused") => "refused",
                    Err(_) => "failed",
                };
                *outcome.lock().unwrap().entry(key).or_default() += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    for ep in &eps {
        let _ = tokio::time::timeout(Duration::from_secs(5), ep.wait_idle()).await;
    }
    let outcome = outcome.lock().unwrap().clone();
    let mut problems = Vec::new();
    let refused = ctx.metric("dagfold_net_connections_refused_total", None);
    if outcome.get("refused").copied().unwrap_or(0) as f64 > refused {
        problems.push(format!("{:?} refusals seen, {refused} counted", outcome.get("refused")));
    }
    // Every closed connection gives its slot back.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut open = ctx.metric("dagfold_net_connections_open", None);
    while open > 2.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        open = ctx.metric("dagfold_net_connections_open", None);
    }
    if open > 2.0 {
        problems.push(format!("{open} connections still open after the flood"));
    }
    Ok(json!({"attempts": outcome.values().sum::<u64>(), "outcomes": outcome, "open_after": open, "problems": problems}))
}

/// Subscriptions that never read: `subscribers` on the valid scope (each
/// on its own connection, with small receive windows so that they fall
/// behind within the valid load), a quarter as many on the quiet scope;
/// and one on the valid scope that stops reading, then reads on once the
/// node counted a lagged subscriber, and must find a `Lagged`.
async fn subscribers_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let small = ServerConfig { stream_receive_window_bytes: 64 << 10, connection_receive_window_bytes: 128 << 10, ..ServerConfig::default() };
    let n = ctx.sizes.subscribers;
    let quiet_n = (n / 4).max(1);
    // Each on its own connection, so many that one origin would reach its
    // connection cap (a quarter of --connections-max): spread over several
    // loopback addresses, 32 a host, as many clients would be.
    let eps: Vec<quinn::Endpoint> = (0..(n + quiet_n + 1).div_ceil(32))
        .map(|h| {
            let bind = SocketAddr::from(([127, 0, 1, 1 + h as u8], 0));
            dagfold::net::client::client_endpoint_as(bind, &small, Some(&flood_identity())).map_err(anyhow::Error::from)
        })
        .collect::<Result<_, _>>()?;
    let ep = eps.last().expect("at least one").clone();
    let mut held = Vec::new();
    for i in 0..n + quiet_n {
        let scope = if i < n { ctx.valid_scope } else { ctx.quiet_scope };
        let conn = connect(&eps[i / 32], ctx.node).await?;
        let (mut w, r) = dagfold::net::open_bi(&conn).await?;
        w.write(&NodeMessage::Subscribe(Subscribe { scope, from_seq: 1 }).encode()).await?;
        held.push((conn, w, r));
        ctx.progress.fetch_add(1, Ordering::Relaxed);
    }
    // The late reader.
    let conn = connect(&ep, ctx.node).await?;
    let (mut w, mut r) = dagfold::net::open_bi(&conn).await?;
    w.write(&NodeMessage::Subscribe(Subscribe { scope: ctx.valid_scope, from_seq: 1 }).encode()).await?;
    // Every subscription registered before the valid load starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ctx.metric("dagfold_subscribers", None) < (n + quiet_n + 1) as f64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ctx.ready.store(true, Ordering::Relaxed);
    // Read only once every subscriber of the valid scope, this one
    // included, has been dropped as lagging.
    let deadline = Instant::now() + Duration::from_secs(180);
    while ctx.metric("dagfold_subscribers_lagged_total", None) < (n + 1) as f64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut problems = Vec::new();
    let (mut events, mut next, mut lagged_at) = (0u64, 1u64, None);
    loop {
        match tokio::time::timeout(Duration::from_secs(30), r.read()).await {
            Ok(Ok(Some(frame))) => match NodeMessage::decode(&frame) {
                Some(NodeMessage::Event(e)) => {
                    if e.seq != next {
                        problems.push(format!("the late reader got event {} after {}", e.seq, next - 1));
                        break;
                    }
                    next += 1;
                    events += 1;
                }
                Some(NodeMessage::Lagged(l)) => {
                    lagged_at = Some(l.next_seq);
                    if l.next_seq != next {
                        problems.push(format!("Lagged says resume at {}, the reader is at {next}", l.next_seq));
                    }
                    break;
                }
                other => {
                    problems.push(format!("the late reader got {other:?}"));
                    break;
                }
            },
            other => {
                problems.push(format!("the late reader's stream ended without a Lagged: {other:?}"));
                break;
            }
        }
    }
    if lagged_at.is_none() && problems.is_empty() {
        problems.push("the late reader got no Lagged".into());
    }
    let lagged = ctx.metric("dagfold_subscribers_lagged_total", None);
    if lagged < (n + 1) as f64 {
        problems.push(format!("{lagged} lagged subscribers counted, {} expected", n + 1));
    }
    ctx.planned_done.store(true, Ordering::Relaxed);
    while !ctx.stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The clients go away: every subscription must be released, the quiet
    // scope's too (nothing will ever be sent on them).
    let subscribed_before_close = ctx.metric("dagfold_subscribers", None);
    for (conn, _, _) in &held {
        conn.close(0u32.into(), b"bye");
    }
    conn.close(0u32.into(), b"bye");
    drop(held);
    let _ = tokio::time::timeout(Duration::from_secs(5), ep.wait_idle()).await;
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut left = ctx.metric("dagfold_subscribers", None);
    while left > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = ctx.metric("dagfold_subscribers", None);
    }
    if left > 0.0 {
        problems.push(format!("{left} subscriptions still registered 45 s after their clients left"));
    }
    Ok(json!({
        "never_reading": n, "quiet_never_reading": quiet_n, "late_reader_events": events, "late_reader_lagged_at": lagged_at,
        "lagged_counted": lagged, "subscribed_before_close": subscribed_before_close, "subscribed_after_close": left,
        "replies_timed_out": ctx.metric("dagfold_net_replies_timed_out_total", None), "problems": problems,
    }))
}

/// 8 requesters on 2 connections asking for the whole quiet scope in a
/// loop: 6 read every reply to its `SyncDone`, 2 abandon theirs.
async fn sync_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    let ep = endpoint(&ServerConfig::default())?;
    let planned = ctx.sizes.syncs as u64;
    let requests = Arc::new(AtomicU64::new(0));
    let ops_received = Arc::new(AtomicU64::new(0));
    let done_replies = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let conn = connect(&ep, ctx.node).await?;
        for w in 0..4 {
            let reader = w != 3;
            let (conn, ctx, requests, ops_received, done_replies) =
                (conn.clone(), ctx.clone(), requests.clone(), ops_received.clone(), done_replies.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = requests.fetch_add(1, Ordering::Relaxed);
                    if i >= planned {
                        ctx.planned_done.store(true, Ordering::Relaxed);
                        if ctx.stopped() {
                            break;
                        }
                    }
                    let Ok((mut w, mut r)) = dagfold::net::open_bi(&conn).await else { break };
                    let req = SyncRequest { scope: ctx.quiet_scope, want: ctx.quiet_heads.clone(), have: vec![], max_ops: SYNC_OPS_MAX };
                    if w.write(&NodeMessage::SyncRequest(req).encode()).await.is_err() {
                        break;
                    }
                    let _ = w.finish();
                    ctx.progress.fetch_add(1, Ordering::Relaxed);
                    if !reader {
                        let _ = r.stop(0);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let read_all = async {
                        while let Ok(Some(frame)) = r.read().await {
                            if frame.first() == Some(&dagfold::protocol::MESSAGE_OP) {
                                ops_received.fetch_add(1, Ordering::Relaxed);
                            } else if let Some(NodeMessage::SyncDone(_)) = NodeMessage::decode(&frame) {
                                done_replies.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(60), read_all).await;
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let served = ctx.metric("dagfold_sync_requests_served_total", None);
    let mut problems = Vec::new();
    if done_replies.load(Ordering::Relaxed) == 0 {
        problems.push("no sync reply completed".to_string());
    }
    Ok(json!({
        "requests": requests.load(Ordering::Relaxed), "replies_completed": done_replies.load(Ordering::Relaxed),
        "ops_received": ops_received.load(Ordering::Relaxed), "served_counted": served, "problems": problems,
    }))
}

/// Imports a frames file into the store at `dir` (`dagfold import`).
fn import(bins: &Bins, dir: &Path, frames: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(&bins.dagfold)
        .args(["import", "--data-dir", &dir.display().to_string(), &frames.display().to_string()])
        .output()?;
    if !out.status.success() {
        return Err(anyhow!("import of {} failed: {}", frames.display(), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// The heartbeats kind's real peer's identity (`identity_from`).
const PEER_LABEL: &str = "flood-peer";

/// The heartbeats kind's real peer: a node of its own identity, on its own
/// loopback address (127.0.0.3), configured by key with the flooded node at
/// `node_listen` (which is told of it by the returned `--peer` value),
/// holding the preloaded scope (imported: a key delivery is never synced,
/// and the node only gossips the valid scope's, which it receives): it gets
/// the valid scope from the node by gossip and sync while the flood runs.
fn start_peer(bins: &Bins, work: &Path, label: &str, node_id: &Identity, node_listen: SocketAddr, seed: u64) -> anyhow::Result<(NodeProc, String)> {
    let me = identity_from(seed, PEER_LABEL);
    let name = format!("heartbeats-peer-{label}");
    let dir = work.join(&name);
    seed_identity(&dir, &me)?;
    import(bins, &dir, &work.join("preload.frames"))?;
    let listen = SocketAddr::from(([127, 0, 0, 3], free_port()));
    let flags = ["--peer".to_string(), format!("{}@{node_listen}", hex::encode(node_id.public_key))];
    let mut p = NodeProc::at(&name, &bins.dagfold, &dir, &work.join(format!("{name}.log")), listen, loopback(free_port()), &flags);
    p.start(Duration::from_secs(60))?;
    Ok((p, format!("{}@{listen}", hex::encode(me.public_key))))
}

/// Waits (the flood still running) until `peer` shows the node's roots of
/// `scopes`; then neither may have counted a divergence.
fn peer_converged(node: &NodeProc, peer: &NodeProc, scopes: &[Hash], t_start: Instant, timeout_s: u64) -> serde_json::Value {
    // Same root; or, where the peer lacks the scope's key (the node does not
    // pass on a key delivery it received, and the valid scope's reaches the
    // peer no other way), every op the node applied held by the peer.
    let n = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap_or(0);
    let held = |s: &Hash| match (node.scope(s), peer.scope(s)) {
        (Some(a), Some(b)) if a["root"] == b["root"] => "root",
        (Some(a), Some(b)) if n(&a, "pending") == 0
            && n(&b, "applied") + n(&b, "pending") + n(&b, "key_waiting") + n(&b, "data_key_waiting") >= n(&a, "applied") => "ops",
        _ => "",
    };
    let converged = wait_until(Duration::from_secs(timeout_s), || scopes.iter().all(|s| !held(s).is_empty()));
    let how: Vec<&str> = scopes.iter().map(held).collect();
    let mut problems = Vec::new();
    if !converged {
        problems.push(format!("the real peer did not converge with the node in {timeout_s} s: {}", peer.log_tail(5)));
    }
    let divergences = peer.metric("dagfold_divergences_total").unwrap_or(0.0);
    if divergences > 0.0 {
        problems.push(format!("{divergences} divergences counted by the real peer"));
    }
    json!({
        "converged": converged, "converged_by": how, "converged_after_start_s": t_start.elapsed().as_secs_f64(),
        "sync_ops_received": peer.metric("dagfold_sync_ops_received_total"), "divergences": divergences, "problems": problems,
    })
}

/// Heartbeat scopes refused (`dagfold_requests_refused_total{request="heartbeat"}`), for one reason or all.
fn heartbeat_refused(metrics: &str, reason: Option<&str>) -> f64 {
    let lines: String = metrics.lines().filter(|l| l.contains("request=\"heartbeat\"")).map(|l| format!("{l}\n")).collect();
    metric_in(&lines, "dagfold_requests_refused_total", reason.map(|r| format!("reason=\"{r}\"")).as_deref())
}

/// Who a forged heartbeat's connection says it is: no key, a stranger's
/// key, the scopes' member's key.
const FORGERS: [&str; 3] = ["anonymous", "stranger", "member"];
/// Of a forged heartbeat's `HEARTBEAT_SCOPES_MAX` scopes, one in this many
/// is one of the node's (alternately), the others random.
const FORGED_REAL_EVERY: usize = 4;

/// A maximal heartbeat: `HEARTBEAT_SCOPES_MAX` scopes, every fourth one of
/// `real`, the others random, each with `HEARTBEAT_HEADS_MAX` random
/// governance and data heads (which the node lacks).
fn forged_heartbeat(rng: &mut rand::rngs::StdRng, real: &[Hash; 2]) -> Vec<u8> {
    let heads = |rng: &mut rand::rngs::StdRng| (0..HEARTBEAT_HEADS_MAX).map(|_| rng.gen()).collect::<Vec<Hash>>();
    let scopes = (0..HEARTBEAT_SCOPES_MAX)
        .map(|j| {
            let scope = if j % FORGED_REAL_EVERY == 0 { real[(j / FORGED_REAL_EVERY) % 2] } else { rng.gen() };
            ScopeBeat { scope, root: rng.gen(), governance_heads: heads(rng), data_heads: heads(rng) }
        })
        .collect();
    NodeMessage::Heartbeat(Heartbeat { scopes }).encode()
}

/// Forged heartbeats: 48 workers, one connection after another from 8
/// loopback hosts (127.0.2.x, so that the origins' connection caps allow
/// them), each connection presenting no key, a stranger's (one per host) or
/// the scopes' member's, sending one maximal heartbeat (from a pool of 8)
/// and closing once the node has it all. Then: every scope beat of the
/// anonymous and the strangers refused and counted by reason (the member's
/// for random scopes too), the member's real ones heard (noted as heads lacked) but `lacking` within `LACKING_NOTES_MAX`.
async fn heartbeats_flood(ctx: &Ctx) -> anyhow::Result<serde_json::Value> {
    const HOSTS: u8 = 8;
    let planned = ctx.sizes.heartbeats as u64;
    let cfg = ServerConfig::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed ^ 0x4EA7);
    let member = dagfold::net::identity_cert(&ctx.member_seed)?;
    let mut eps = Vec::new();
    for h in 0..HOSTS {
        let bind = SocketAddr::from(([127, 0, 2, 1 + h], 0));
        let stranger = dagfold::net::identity_cert(&rng.gen())?;
        for who in [None, Some(&stranger), Some(&member)] {
            eps.push(dagfold::net::client::client_endpoint_as(bind, &cfg, who)?);
        }
    }
    let real = [ctx.quiet_scope, ctx.valid_scope];
    let frames: Arc<Vec<Vec<u8>>> = Arc::new((0..8).map(|_| forged_heartbeat(&mut rng, &real)).collect());
    let eps = Arc::new(eps);
    let attempts = Arc::new(AtomicU64::new(0));
    let counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> = Default::default();
    // The node's heads-we-lack notes, sampled throughout.
    let lacking_max = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut max = 0f64;
            while !ctx.stopped() {
                max = max.max(ctx.metric("dagfold_lacking_notes", None));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            max.max(ctx.metric("dagfold_lacking_notes", None))
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..48 {
        let (eps, frames, ctx, attempts, counts) = (eps.clone(), frames.clone(), ctx.clone(), attempts.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(i) = ctx.next_unit(&attempts, planned) {
                let who = (i % 3) as usize;
                let ep = &eps[(i / 3 % HOSTS as u64) as usize * 3 + who];
                let outcome = match connect(ep, ctx.node).await {
                    Ok(conn) => {
                        let send = async {
                            let mut st = conn.open_uni().await?;
                            st.write_all(&framed(&frames[i as usize % frames.len()])).await?;
                            st.finish()?;
                            Ok::<_, anyhow::Error>(st.stopped().await?)
                        };
                        let r = tokio::time::timeout(Duration::from_secs(30), send).await;
                        conn.close(0u32.into(), b"bye");
                        match r {
                            Ok(Ok(None)) => "delivered",
                            Ok(Ok(Some(_))) => "stopped",
                            Ok(Err(_)) => "lost",
                            Err(_) => "timed_out",
                        }
                    }
                    Err(e) if e.to_string().contains("refused") => "refused",
                    Err(_) => "failed",
                };
                *counts.lock().unwrap().entry(format!("{}_{outcome}", FORGERS[who])).or_default() += 1;
                ctx.progress.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    for ep in eps.iter() {
        let _ = tokio::time::timeout(Duration::from_secs(5), ep.wait_idle()).await;
    }
    let counts = counts.lock().unwrap().clone();
    let delivered = |who: &str| counts.get(&format!("{who}_delivered")).copied().unwrap_or(0) as f64;
    let (anon, stranger, member) = (delivered("anonymous"), delivered("stranger"), delivered("member"));
    let beats = HEARTBEAT_SCOPES_MAX as f64;
    let real_beats = HEARTBEAT_SCOPES_MAX.div_ceil(FORGED_REAL_EVERY) as f64;
    // What the node must have refused, by reason: every scope of the
    // anonymous; the strangers' real scopes (not a member) and random ones
    // (unknown); the member's random ones.
    // (The valid scope is unknown to the node until its genesis arrives:
    // beats naming it are refused as `unknown_scope` until then.)
    let want = [
        ("anonymous", anon * beats),
        ("not_a_member|unknown_scope", stranger * beats + member * (beats - real_beats)),
    ];
    let refused = |reasons: &str| {
        let text = dagfold::testkit::http_get(ctx.admin, "/metrics", Duration::from_secs(5)).map(|(_, t)| t).unwrap_or_default();
        reasons.split('|').map(|r| heartbeat_refused(&text, Some(r))).sum::<f64>()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while want.iter().any(|(r, n)| refused(r) < *n) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut problems = Vec::new();
    let mut counted = serde_json::Map::new();
    for (reason, n) in want {
        let got = refused(reason);
        counted.insert(reason.to_string(), json!(got));
        if got < n {
            problems.push(format!("forged heartbeats heard: {n} scope beats should have been refused as {reason}, {got} were"));
        }
    }
    if stranger > 0.0 && refused("not_a_member") == 0.0 {
        problems.push("no stranger's heartbeat was refused as not a member".to_string());
    }
    for who in FORGERS {
        if delivered(who) == 0.0 {
            problems.push(format!("no forged heartbeat of the {who} kind was delivered"));
        }
    }
    let lacking_max = lacking_max.await.unwrap_or(f64::MAX);
    if lacking_max > LACKING_NOTES_MAX as f64 {
        problems.push(format!("{lacking_max} heads-we-lack notes, over the bound {LACKING_NOTES_MAX}"));
    }
    if member > 0.0 && lacking_max == 0.0 {
        problems.push("the member's heartbeats were not heard (no heads-we-lack note)".to_string());
    }
    Ok(json!({
        "connections": counts.values().sum::<u64>(), "outcomes": counts, "frame_bytes": frames[0].len(),
        "refused_expected": want.iter().map(|(r, n)| (r.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "refused_counted": counted, "lacking_notes_max": lacking_max, "lacking_notes_bound": LACKING_NOTES_MAX,
        "problems": problems,
    }))
}
