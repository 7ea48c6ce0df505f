//! The crash campaign: node A under load from `dagfold-loadgen send` (which
//! resends after every lost connection), a subscriber on A
//! (`dagfold subscribe`, which resumes by itself), writes over A's API, and
//! a peer B that gets the same load once; A is SIGKILLed at seeded random
//! moments and restarted each time, and every other time the kill is a
//! power cut: A's data directory is on the power-cut filesystem
//! (`powercut.rs`), which then drops every write A had not synced. After
//! every kill the store is opened with the library and checked
//! (`check.rs`), and everything A acknowledged, as the campaign recorded it
//! (`acked.rs`), must be in it; at the end A and B must hold the load
//! generator's root, and every event the subscriber printed must name an op
//! still applied after the last restart, numbered 1..n without gap or
//! repeat, equal to A's event log.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::acked::{Acked, ApiWriter, Covered};
use crate::check::{check_store, data_ops_of_file, identity_from, seed_identity};
use crate::proc::{Bins, NodeProc, ToolProc};

#[derive(clap::Args, Debug, Clone)]
pub struct CrashArgs {
    /// SIGKILLs of the running node (kills during start-up come on top).
    #[arg(long, default_value_t = 20)]
    pub kills: u32,
    /// Power cuts of the running node (a SIGKILL, then every write it had
    /// not synced dropped), alternating with the kills. Needs FUSE
    /// (/dev/fuse, and the right to mount: root); 0 runs without it.
    #[arg(long, default_value_t = 20)]
    pub cuts: u32,
    /// The killed node's `--durability` (`fast` does not sync commits: the
    /// power cuts must then find acknowledged ops lost).
    #[arg(long)]
    pub durability: Option<String>,
    /// Writes over the killed node's API per second (each answered only
    /// once durable, and recorded then); 0: none.
    #[arg(long, default_value_t = 20)]
    pub api_writes_per_s: u64,
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
    /// Share of the kills and cuts aimed (on the power-cut filesystem) at
    /// an operation instead of a moment: a commit's WAL fsync, a table
    /// file's write (a flush or a compaction), a MANIFEST write; and share
    /// of the early kills aimed at the node's open of its store (the WAL's
    /// replay, or the MANIFEST it writes). An aim that does not fire within `--aim-wait-ms` falls back
    /// to a plain kill. Needs cuts (the filesystem); 0: none.
    #[arg(long, default_value_t = 0.5)]
    pub aimed_share: f64,
    #[arg(long, default_value_t = 3_000)]
    pub aim_wait_ms: u64,
    /// Give up waiting for convergence after this long.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// The killed node's `--commit-ops-max`: small, so that its cascades
    /// are committed in many parts and kills land between them.
    #[arg(long, default_value_t = 16)]
    pub commit_ops_max: usize,
    /// The killed node's `--memtable-bytes-max`: small, so that it flushes
    /// (and compacts) every few thousand ops and kills aimed at a flush or
    /// a MANIFEST write find one; 0: the node's own sizes.
    #[arg(long, default_value_t = 256 << 10)]
    pub memtable_bytes_max: usize,
}

/// Per aim (those of early kills too): how many were tried and how many fired.
fn aimed_summary(kills: &[serde_json::Value]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for k in kills {
        let tries = [(k["aimed_at"].as_str(), &k["aim_fired"]), (k["early_aimed_at"].as_str(), &k["early_aim_fired"])];
        for (kind, fired) in tries {
            let Some(kind) = kind else { continue };
            let e = out.entry(kind.to_string()).or_insert_with(|| json!({"tried": 0, "fired": 0}));
            e["tried"] = json!(e["tried"].as_u64().unwrap_or(0) + 1);
            e["fired"] = json!(e["fired"].as_u64().unwrap_or(0) + u64::from(fired == &json!(true)));
        }
    }
    serde_json::Value::Object(out)
}

pub fn run(a: &CrashArgs, bins: &Bins, work: &Path) -> anyhow::Result<serde_json::Value> {
    let t_all = Instant::now();
    let timeout = Duration::from_secs(a.timeout_s);
    // A's data directory on the power-cut filesystem when there are cuts
    // (unmounted when `mounted` drops, after the nodes: declared before them).
    let mut mounted = if a.cuts > 0 { Some(crate::powercut::PowerCut::mount(&bins.powercut, &work.join("a-disk"), &work.join("a-mnt"))?) } else { None };
    let dir_a = mounted.as_ref().map_or_else(|| work.join("a"), |m| m.mount_point.join("a"));
    let dir_b = work.join("b");
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
    if a.memtable_bytes_max > 0 {
        a_flags.extend(["--memtable-bytes-max".to_string(), a.memtable_bytes_max.to_string()]);
    }
    if let Some(d) = &a.durability {
        a_flags.extend(["--durability".to_string(), d.clone()]);
    }
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

    let mut api = (a.api_writes_per_s > 0).then(|| ApiWriter::start(node.admin, dir_a.join(dagfold::client::API_TOKEN_FILE), a.api_writes_per_s));
    let api_acked = |api: &Option<ApiWriter>| api.as_ref().map(|w| w.acked()).unwrap_or_default();
    let mut acked = Acked::default();
    let mut covered = Covered::default();
    let mut acknowledged_losses = 0u64;
    let events_file = work.join("events.jsonl");

    // Kills and cuts alternate while both are left.
    let rounds = a.kills + a.cuts;
    let is_cut = |i: u32| {
        let pairs = a.kills.min(a.cuts);
        if i < 2 * pairs { i % 2 == 1 } else { a.cuts > a.kills }
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0xC0FFEE);
    let mut kills = Vec::new();
    let (mut opens, mut early_kills, mut problems) = (1u64, 0u64, Vec::<String>::new());
    let mut max_pending_seen = 0u64;
    let mut released_at_reopen_total = 0u64;
    let mut max_key_waits_seen = 0u64;
    for i in 0..rounds {
        let cut = is_cut(i);
        let delay = rng.gen_range(a.kill_min_ms..=a.kill_max_ms.max(a.kill_min_ms));
        // Until the kill, the node's status is read every 100 ms and what
        // it reports durable is recorded.
        let until = Instant::now() + Duration::from_millis(delay);
        let mut applied_before = None;
        while Instant::now() < until {
            let st = node.scope(&scope);
            acked.record_status(st.as_ref());
            applied_before = st.as_ref().and_then(|s| s["applied"].as_u64()).or(applied_before);
            std::thread::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_millis(100)));
        }
        let killed_at = t_all.elapsed();
        // Aimed: the filesystem kills the node inside the operation.
        let aims = ["commit", "flush", "manifest"];
        let aim = match mounted.as_mut() {
            Some(m) if rng.gen_bool(a.aimed_share.clamp(0.0, 1.0)) => {
                let kind = aims[rng.gen_range(0..aims.len())];
                Some((kind, node.kill_aimed(m, kind, Duration::from_millis(a.aim_wait_ms))?))
            }
            _ => None,
        };
        node.kill();
        if cut {
            mounted.as_mut().expect("cuts run on the power-cut filesystem").cut()?;
        }
        let early = rng.gen_bool(a.early_share.clamp(0.0, 1.0));
        // An early kill aimed at recovery comes before the check (whose own
        // open would replay the WAL first), while the node replays it.
        let recovery_aim = early && mounted.is_some() && rng.gen_bool(a.aimed_share.clamp(0.0, 1.0));
        let mut recovery_fired = None;
        if recovery_aim {
            // The WAL's replay, or the new MANIFEST the open writes.
            let kind = ["recovery", "manifest at open"][rng.gen_range(0..2)];
            let m = mounted.as_mut().expect("checked just above");
            node.spawn_only()?;
            let fired = node.kill_aimed(m, kind.split(' ').next().expect("a word"), Duration::from_millis(a.aim_wait_ms))?;
            recovery_fired = Some((kind, fired));
            node.kill();
            early_kills += 1;
            if cut {
                m.cut()?;
            }
        }
        // Every answer the node gave before it died is in hand by now (it
        // answers only once durable, so even one read after the kill counts).
        let api_ops = api_acked(&api);
        let chk = check_store(&node.data_dir, Some(scope), a.fresh_fold_every_kill);
        max_pending_seen = max_pending_seen.max(chk.pending);
        released_at_reopen_total += chk.released_at_reopen;
        max_key_waits_seen = max_key_waits_seen.max(chk.key_waits);
        let after = chk.scope_applied.unwrap_or(0);
        let mut kill_problems = chk.problems.clone();
        let (cov, lost) = acked.check(&chk, &events_file, &api_ops);
        covered = cov;
        acknowledged_losses += cov.lost;
        kill_problems.extend(lost);
        let mut early_ms = None;
        if early && !recovery_aim {
            // While the store opens and the engine restores; after a cut,
            // a second cut there (a power loss during recovery).
            let ms = rng.gen_range(0..300u64);
            node.start_and_kill_early(Duration::from_millis(ms))?;
            if cut {
                mounted.as_mut().expect("cuts run on the power-cut filesystem").cut()?;
            }
            early_kills += 1;
            early_ms = Some(ms);
            let chk2 = check_store(&node.data_dir, Some(scope), false);
            kill_problems.extend(chk2.problems.iter().map(|p| format!("after the early kill: {p}")));
            let (cov2, lost) = acked.check(&chk2, &events_file, &api_ops);
            acknowledged_losses += cov2.lost;
            kill_problems.extend(lost.iter().map(|p| format!("after the early kill: {p}")));
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
            "crash campaign: {} {}/{rounds} at {:.1} s after {delay} ms: {applied_before:?} applied before, {after} in the store, {} pending ({} released at reopen), {} key waits, acknowledged: {} events, {} heads, {} API writes{}{}",
            if cut { "power cut" } else { "kill" },
            i + 1,
            killed_at.as_secs_f64(),
            chk.pending,
            chk.released_at_reopen,
            chk.key_waits,
            cov.events,
            cov.status_heads,
            cov.api_writes,
            early_ms.map(|m| format!(", early kill {m} ms after spawn")).unwrap_or_default()
                + &aim.map(|(k, f)| format!(", aimed at {k}: {}", if f { "fired" } else { "did not fire, killed" })).unwrap_or_default()
                + &recovery_fired.map(|(k, f)| format!(", early kill aimed at {k}: {}", if f { "fired" } else { "did not fire, killed" })).unwrap_or_default(),
            if kill_problems.is_empty() { String::new() } else { format!(" PROBLEMS: {kill_problems:?}") }
        );
        problems.extend(kill_problems.iter().map(|p| format!("kill {}: {p}", i + 1)));
        kills.push(json!({
            "kill": i + 1,
            "power_cut": cut,
            "acknowledged_checked": cov,
            "at_s": killed_at.as_secs_f64(),
            "delay_ms": delay,
            "applied_before": applied_before,
            "applied_in_store": after,
            "pending_in_store": chk.pending,
            "released_at_reopen": chk.released_at_reopen,
            "key_waits_in_store": chk.key_waits,
            "early_kill_ms": early_ms,
            "aimed_at": aim.map(|(k, _)| k),
            "aim_fired": aim.map(|(_, f)| f),
            "early_aimed_at": recovery_fired.map(|(k, _)| k),
            "early_aim_fired": recovery_fired.map(|(_, f)| f),
            "restart_ms": restart_ms,
            "problems": kill_problems,
        }));
        if restart.is_err() {
            break;
        }
    }
    let kills_done = kills.iter().filter(|k| k["power_cut"] == false).count();
    let cuts_done = kills.len() - kills_done;
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
    if let Some(w) = api.as_mut() {
        w.stop();
    }
    let api_errors = api.as_ref().map_or(0, |w| w.errors());
    let api_ops = api_acked(&api);
    node.stop(Duration::from_secs(30));
    b.stop(Duration::from_secs(30));

    let fin = check_store(&dir_a, Some(scope), true);
    let fin_b = check_store(&dir_b, Some(scope), true);
    let (fin_cov, lost) = acked.check(&fin, &events_file, &api_ops);
    acknowledged_losses += fin_cov.lost;
    problems.extend(lost.iter().map(|p| format!("final store of A: {p}")));
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
    let ok = problems.is_empty() && kills_done as u32 == a.kills && cuts_done as u32 == a.cuts;
    Ok(json!({
        "campaign": "crash",
        "ok": ok,
        "seed": a.seed,
        "kills": kills_done,
        "power_cuts": cuts_done,
        "aimed_fired": aimed_summary(&kills),
        "durability": a.durability.as_deref().unwrap_or("durable"),
        "acknowledged_losses": acknowledged_losses,
        "acknowledged_at_last_kill": covered,
        "acknowledged_at_end": fin_cov,
        "status_reads": acked.status_reads,
        "status_read_failures": acked.status_failures,
        "api_writes_answered": api_ops.len(),
        "api_write_errors": api_errors,
        "powercut": mounted.as_mut().and_then(|m| m.counters()),
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
