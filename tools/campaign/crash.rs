//! The crash campaign: node A under load from `dagfold-loadgen send` (which
//! resends after every lost connection), a subscriber on A
//! (`dagfold subscribe`, which resumes by itself), and a peer B that gets
//! the same load once; A is SIGKILLed at seeded random moments and
//! restarted each time. After every kill the store is opened with the
//! library and checked (`check.rs`); at the end A and B must hold the load
//! generator's root, and every event the subscriber printed must name an op
//! still applied after the last restart, numbered 1..n without gap or
//! repeat, equal to A's event log.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::check::{check_store, data_ops_of_file, identity_from, seed_identity};
use crate::proc::{Bins, NodeProc, ToolProc};

#[derive(clap::Args, Debug, Clone)]
pub struct CrashArgs {
    /// SIGKILLs of the running node (kills during start-up come on top).
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Data ops of the load.
    #[arg(long, default_value_t = 40_000)]
    pub ops: usize,
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Rate of the load into the killed node (frames/s; 0: full speed).
    #[arg(long, default_value_t = 1_500)]
    pub rate: u64,
    /// Rate of the same load into the peer (it gossips what it applies to
    /// the killed node, and serves its syncs).
    #[arg(long, default_value_t = 1_000)]
    pub peer_rate: u64,
    /// Streams of the load into the killed node (more than 1: out of causal
    /// order, so ops are pending when the kill comes).
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
    /// The load into the killed node is shuffled within windows of this
    /// many ops (so that ops are pending when a kill comes).
    #[arg(long, default_value_t = 400)]
    pub shuffle_window: usize,
    /// A kill comes a uniformly random time in [min, max] after the node is up.
    #[arg(long, default_value_t = 100)]
    pub kill_min_ms: u64,
    #[arg(long, default_value_t = 2_000)]
    pub kill_max_ms: u64,
    /// Share of restarts that are also killed 0..300 ms after spawn (while
    /// the store opens and the engine restores), before the real restart.
    #[arg(long, default_value_t = 0.15)]
    pub early_share: f64,
    /// Re-fold the applied ops from scratch at every kill, not only at the end.
    #[arg(long)]
    pub fresh_fold_every_kill: bool,
    /// Give up waiting for convergence after this long.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// The killed node's `--commit-ops-max`: small, so that its cascades
    /// are committed in many parts and kills land between them.
    #[arg(long, default_value_t = 16)]
    pub commit_ops_max: usize,
}

pub fn run(a: &CrashArgs, bins: &Bins, work: &Path) -> anyhow::Result<serde_json::Value> {
    let t_all = Instant::now();
    let timeout = Duration::from_secs(a.timeout_s);
    let (dir_a, dir_b) = (work.join("a"), work.join("b"));
    let (id_a, id_b) = (identity_from(a.seed, "crash-a"), identity_from(a.seed, "crash-b"));
    seed_identity(&dir_a, &id_a)?;
    seed_identity(&dir_b, &id_b)?;
    let (la, lb) = (crate::proc::loopback(crate::proc::free_port()), crate::proc::loopback(crate::proc::free_port()));
    let (ha, hb) = (crate::proc::loopback(crate::proc::free_port()), crate::proc::loopback(crate::proc::free_port()));
    // Each configures the other by key (`KEY@ADDR`), so each is served every
    // scope (SPEC §10); the subscriber on A proves B's key for the same reason.
    let hb_flags = |key: &dagfold::core::Identity, peer: std::net::SocketAddr| {
        vec!["--peer".to_string(), format!("{}@{peer}", hex::encode(key.public_key)), "--heartbeat-ms".into(), "200".into()]
    };
    let subscriber_key = crate::proc::key_file(work, "subscriber.key", &id_b.seed)?;
    let mut b = NodeProc::at("peer B", &bins.dagfold, &dir_b, &work.join("b.log"), lb, hb, &hb_flags(&id_a, la));
    let mut a_flags = hb_flags(&id_b, lb);
    a_flags.extend(["--commit-ops-max".to_string(), a.commit_ops_max.to_string()]);
    let mut node = NodeProc::at("node A", &bins.dagfold, &dir_a, &work.join("a.log"), la, ha, &a_flags);
    b.start(Duration::from_secs(60))?;
    node.start(Duration::from_secs(60))?;

    // The load: generated for B with A as an extra recipient, so that A sees
    // the first governance op before its own key delivery (a durable key
    // wait on A, right at the start).
    let file = work.join("load.frames");
    let extra = [
        "--writers".to_string(),
        a.writers.to_string(),
        "--extra-recipient".into(),
        format!("{}:{}", hex::encode(id_a.public_key), hex::encode(id_a.kem_public)),
    ];
    let gen = crate::proc::loadgen_file(bins, work, "loadgen-file", &file, &id_b, a.ops, a.seed, &extra)?;
    let scope_hex = gen["scope"].as_str().context("loadgen file: no scope")?.to_string();
    let root_hex = gen["root"].as_str().context("loadgen file: no root")?.to_string();
    let total_ops = gen["ops"].as_u64().context("loadgen file: no ops")?;
    let scope: [u8; 32] = dagfold::protocol::parse_hash_hex(&scope_hex).unwrap();
    let data_ids = data_ops_of_file(&file)?;
    let events_expected = data_ids.len() as u64; // one event per data op

    let sub = ToolProc::spawn(
        &bins.dagfold,
        &[
            "subscribe".into(),
            "--identity".into(),
            subscriber_key.display().to_string(),
            "--node".into(),
            la.to_string(),
            "--scope".into(),
            scope_hex.clone(),
            "--max-events".into(),
            events_expected.to_string(),
            "--idle-exit-ms".into(),
            (a.timeout_s * 1000).to_string(),
        ],
        &work.join("events.jsonl"),
        &work.join("subscriber.err"),
    )?;
    let send_args = |n: &NodeProc, rate: u64, streams: usize, shuffle: usize, name: &str| -> Vec<String> {
        vec![
            "send".into(),
            "--shuffle-window".into(),
            shuffle.to_string(),
            "--seed".into(),
            a.seed.to_string(),
            "--node".into(),
            n.listen.to_string(),
            "--admin".into(),
            n.admin.to_string(),
            "--file".into(),
            file.display().to_string(),
            "--scope".into(),
            scope_hex.clone(),
            "--root".into(),
            root_hex.clone(),
            "--rate".into(),
            rate.to_string(),
            "--streams".into(),
            streams.to_string(),
            "--settle-ms".into(),
            "3000".into(),
            "--timeout-s".into(),
            (a.timeout_s + 600).to_string(),
            "--name".into(),
            name.into(),
        ]
    };
    let mut load_a = ToolProc::spawn(&bins.loadgen, &send_args(&node, a.rate, a.streams, a.shuffle_window, "to-a"), &work.join("send-a.out"), &work.join("send-a.err"))?;
    let mut load_b = ToolProc::spawn(&bins.loadgen, &send_args(&b, a.peer_rate, 1, 0, "to-b"), &work.join("send-b.out"), &work.join("send-b.err"))?;

    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0xC0FFEE);
    let mut kills = Vec::new();
    let (mut opens, mut early_kills, mut problems) = (1u64, 0u64, Vec::<String>::new());
    let mut max_pending_seen = 0u64;
    let mut released_at_reopen_total = 0u64;
    let mut max_key_waits_seen = 0u64;
    for i in 0..a.kills {
        let delay = rng.gen_range(a.kill_min_ms..=a.kill_max_ms.max(a.kill_min_ms));
        std::thread::sleep(Duration::from_millis(delay));
        // The durable state as the node last reported it, then the kill.
        let before = node.scope(&scope);
        let applied_before = before.as_ref().and_then(|s| s["applied"].as_u64()).unwrap_or(0);
        let killed_at = t_all.elapsed();
        node.kill();
        let chk = check_store(&node.data_dir, Some(scope), a.fresh_fold_every_kill);
        max_pending_seen = max_pending_seen.max(chk.pending);
        released_at_reopen_total += chk.released_at_reopen;
        max_key_waits_seen = max_key_waits_seen.max(chk.key_waits);
        let after = chk.scope_applied.unwrap_or(0);
        let mut kill_problems = chk.problems.clone();
        if after < applied_before {
            kill_problems.push(format!("durable state went back: status said {applied_before} applied, the store holds {after}"));
        }
        let early = rng.gen_bool(a.early_share.clamp(0.0, 1.0));
        let mut early_ms = None;
        if early {
            let ms = rng.gen_range(0..300u64);
            node.start_and_kill_early(Duration::from_millis(ms))?;
            early_kills += 1;
            early_ms = Some(ms);
            let chk2 = check_store(&node.data_dir, Some(scope), false);
            kill_problems.extend(chk2.problems.iter().map(|p| format!("after the early kill: {p}")));
        }
        let restart = node.start(Duration::from_secs(120));
        let restart_ms = match &restart {
            Ok(d) => {
                opens += 1;
                Some(d.as_millis() as u64)
            }
            Err(e) => {
                kill_problems.push(format!("restart failed: {e}"));
                None
            }
        };
        eprintln!(
            "crash campaign: kill {}/{} at {:.1} s after {delay} ms: {applied_before} applied before, {after} in the store, {} pending ({} released at reopen), {} key waits{}{}",
            i + 1,
            a.kills,
            killed_at.as_secs_f64(),
            chk.pending,
            chk.released_at_reopen,
            chk.key_waits,
            early_ms.map(|m| format!(", early kill {m} ms after spawn")).unwrap_or_default(),
            if kill_problems.is_empty() { String::new() } else { format!(" PROBLEMS: {kill_problems:?}") }
        );
        problems.extend(kill_problems.iter().map(|p| format!("kill {}: {p}", i + 1)));
        kills.push(json!({
            "kill": i + 1,
            "at_s": killed_at.as_secs_f64(),
            "delay_ms": delay,
            "applied_before": applied_before,
            "applied_in_store": after,
            "pending_in_store": chk.pending,
            "released_at_reopen": chk.released_at_reopen,
            "key_waits_in_store": chk.key_waits,
            "early_kill_ms": early_ms,
            "restart_ms": restart_ms,
            "problems": kill_problems,
        }));
        if restart.is_err() {
            break;
        }
    }
    let kills_done = kills.len();
    let t_kills = t_all.elapsed();

    // Convergence: both nodes at the load generator's root, every op applied.
    let converged = |n: &NodeProc| {
        n.scope(&scope).is_some_and(|s| s["root"].as_str() == Some(root_hex.as_str()) && s["applied"].as_u64() == Some(total_ops))
    };
    let t_conv = Instant::now();
    let a_ok = crate::proc::wait_until(timeout, || converged(&node));
    let b_ok = crate::proc::wait_until(Duration::from_secs(60), || converged(&b));
    let converge_s = t_conv.elapsed().as_secs_f64();
    if !a_ok {
        problems.push(format!("A did not reach the load generator's root: {:?}", node.scope(&scope)));
    }
    if !b_ok {
        problems.push(format!("B did not reach the load generator's root: {:?}", b.scope(&scope)));
    }
    let final_status = node.scope(&scope);
    if let Some(s) = &final_status {
        for k in ["pending", "key_waiting", "data_key_waiting"] {
            if s[k].as_u64() != Some(0) {
                problems.push(format!("A's status still has {k} = {}", s[k]));
            }
        }
    }
    let st_a = load_a.wait(Duration::from_secs(120));
    let st_b = load_b.wait(Duration::from_secs(120));
    let (send_a, send_b) = (load_a.json(), load_b.json());
    if !st_a.is_some_and(|s| s.success()) {
        problems.push(format!("the load into A did not finish: {st_a:?}"));
    }
    if !st_b.is_some_and(|s| s.success()) {
        problems.push(format!("the load into B did not finish: {st_b:?}"));
    }
    // The subscriber exits after the last event (it may be in a 5 s backoff).
    let mut sub = sub;
    let sub_done = sub.wait(Duration::from_secs(90));
    let lines: Vec<serde_json::Value> = sub.output().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let sub_retries = std::fs::read_to_string(work.join("subscriber.err")).unwrap_or_default().lines().count();
    let metrics_a = node.metrics().unwrap_or_default();
    let hwm_a = node.hwm_kb();
    node.stop(Duration::from_secs(30));
    b.stop(Duration::from_secs(30));

    let fin = check_store(&dir_a, Some(scope), true);
    let fin_b = check_store(&dir_b, Some(scope), true);
    problems.extend(fin.problems.iter().map(|p| format!("final store of A: {p}")));
    problems.extend(fin_b.problems.iter().map(|p| format!("final store of B: {p}")));
    if fin.root.map(hex::encode).as_deref() != Some(root_hex.as_str()) {
        problems.push(format!("A's stored root {:?} is not the load generator's {root_hex}", fin.root.map(hex::encode)));
    }
    // Every event the subscriber received names an op still applied, in
    // order 1..n, each once, as in A's event log.
    let mut seen_ops = std::collections::HashSet::new();
    for (i, l) in lines.iter().enumerate() {
        let seq = l["seq"].as_u64().unwrap_or(0);
        let op: Option<[u8; 32]> = l["op"].as_str().and_then(dagfold::protocol::parse_hash_hex);
        let Some(op) = op else {
            problems.push(format!("subscriber line {i} has no op"));
            continue;
        };
        if seq != i as u64 + 1 {
            problems.push(format!("subscriber line {i} has seq {seq}, expected {}", i + 1));
        }
        if !fin.ops.contains(&op) {
            problems.push(format!("event {seq} of op {} was received but the op is not applied after the last restart", hex::encode(op)));
        }
        if fin.events.get(&seq) != Some(&op) {
            problems.push(format!("event {seq}: the subscriber saw op {}, the log says {:?}", hex::encode(op), fin.events.get(&seq).map(hex::encode)));
        }
        if !seen_ops.insert(op) {
            problems.push(format!("op {} had two events", hex::encode(op)));
        }
        if problems.len() > 50 {
            break;
        }
    }
    if lines.len() as u64 != events_expected {
        problems.push(format!("the subscriber printed {} events, {} expected (exit {sub_done:?})", lines.len(), events_expected));
    }
    let ok = problems.is_empty() && kills_done as u32 == a.kills;
    Ok(json!({
        "campaign": "crash",
        "ok": ok,
        "seed": a.seed,
        "kills": kills_done,
        "early_kills": early_kills,
        "opens": opens,
        "ops": total_ops,
        "events_received": lines.len(),
        "subscriber_interruptions": sub_retries,
        "kill_phase_s": t_kills.as_secs_f64(),
        "converge_after_kills_s": converge_s,
        "total_s": t_all.elapsed().as_secs_f64(),
        "max_pending_at_kill": max_pending_seen,
        "released_at_reopen": released_at_reopen_total,
        "max_key_waits_at_kill": max_key_waits_seen,
        "root": root_hex,
        "root_a": fin.root.map(hex::encode),
        "root_b": fin_b.root.map(hex::encode),
        "a_peak_rss_kb_last_run": hwm_a,
        "a_sync_ops_received": crate::proc::metric_in(&metrics_a, "dagfold_sync_ops_received_total", None),
        "a_duplicates_last_run": crate::proc::metric_in(&metrics_a, "dagfold_engine_duplicates_total", None),
        "send_a": send_a,
        "send_b": send_b,
        "final_store_a": fin.summary(),
        "problems": problems,
        "kill_log": kills,
        "work_dir": work.display().to_string(),
    }))
}
