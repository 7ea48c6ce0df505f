//! Disk faults. Node A keeps its store on a small filesystem (a tmpfs with
//! a size limit, filled up to a few hundred KiB: `enospc`) or runs with a
//! file size limit (RLIMIT_FSIZE, writes past it fail with EFBIG: `efbig`,
//! no root needed). A load arrives directly and by gossip from peer B. The
//! checks: A stops accepting ops at the first failed write, with a clear
//! line in its log, `dagfold_store_refusing` = 1 and
//! `dagfold_store_write_failures_total` ≥ 1; it keeps answering status and
//! counts what it refuses; what is on disk opens and is consistent (nothing
//! it reported durable is lost); after space returns and a restart it
//! resumes and catches up from B, to the load generator's root.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use serde_json::json;

use crate::check::{check_store, identity_from, seed_identity};
use crate::proc::{loopback, free_port, metric_in, run_tool, wait_until, Bins, NodeProc, ToolProc};

#[derive(clap::Args, Debug, Clone)]
pub struct DiskArgs {
    /// `enospc` (a size-limited tmpfs, needs mount permission), `efbig`
    /// (RLIMIT_FSIZE on the node), or `auto` (enospc if a tmpfs can be
    /// mounted, else efbig).
    #[arg(long, default_value = "auto")]
    pub fault: String,
    /// Size of the tmpfs (MiB): once the filler is gone it must hold the
    /// whole load (about 1.5 KiB an op with the WAL and the first flush).
    #[arg(long, default_value_t = 64)]
    pub tmpfs_mb: u64,
    /// Space left free on the tmpfs after filling it (KiB).
    #[arg(long, default_value_t = 768)]
    pub free_kb: u64,
    /// RLIMIT_FSIZE of the node for `efbig` (KiB).
    #[arg(long, default_value_t = 2048)]
    pub fsize_kb: u64,
    /// Data ops of the load.
    #[arg(long, default_value_t = 12_000)]
    pub ops: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
}

/// A mounted tmpfs, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, mb: u64) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(at)?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs", &at.display().to_string()])
            .output()
            .map_err(|e| anyhow!("mount: {e}"))?;
        if !out.status.success() {
            return Err(anyhow!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let p = self.0.display().to_string();
        let ok = std::process::Command::new("umount").arg(&p).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount").args(["-l", &p]).status();
        }
    }
}

/// Fills the filesystem of `dir` with `dir/filler`, then gives back
/// `free_kb`. Returns the filler's size.
fn fill(dir: &Path, free_kb: u64) -> anyhow::Result<u64> {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path)?;
    let chunk = vec![0xA5u8; 64 << 10];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(anyhow!("filling: {e}")),
        }
        if written > 64 << 30 {
            return Err(anyhow!("the filesystem does not fill"));
        }
    }
    let keep = written.saturating_sub(free_kb * 1024);
    f.set_len(keep)?;
    f.sync_all()?;
    Ok(keep)
}

pub fn run(a: &DiskArgs, bins: &Bins, work: &Path) -> anyhow::Result<serde_json::Value> {
    let t_all = Instant::now();
    let timeout = Duration::from_secs(a.timeout_s);
    let mut problems: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    // The filesystem for A.
    let mount_at = work.join("small-disk");
    let (fault, tmpfs) = match a.fault.as_str() {
        "enospc" => ("enospc", Some(Tmpfs::mount(&mount_at, a.tmpfs_mb)?)),
        "efbig" => ("efbig", None),
        "auto" => match Tmpfs::mount(&mount_at, a.tmpfs_mb) {
            Ok(t) => ("enospc", Some(t)),
            Err(e) => {
                notes.push(format!("cannot mount a tmpfs ({e}): using RLIMIT_FSIZE (efbig) instead"));
                ("efbig", None)
            }
        },
        other => return Err(anyhow!("--fault takes enospc, efbig or auto, not {other:?}")),
    };
    let dir_a = if tmpfs.is_some() { mount_at.join("a") } else { work.join("a") };
    let dir_b = work.join("b");
    let (id_a, id_b) = (identity_from(a.seed, "disk-a"), identity_from(a.seed, "disk-b"));
    seed_identity(&dir_a, &id_a)?;
    seed_identity(&dir_b, &id_b)?;
    let (la, lb, ha, hb) = (loopback(free_port()), loopback(free_port()), loopback(free_port()), loopback(free_port()));
    // Each configures the other by key (`KEY@ADDR`), so each is served every
    // scope (SPEC §10); the subscriber on A proves B's key for the same reason.
    let flags = |key: &dagfold::core::Identity, peer: std::net::SocketAddr| {
        vec!["--peer".to_string(), format!("{}@{peer}", hex::encode(key.public_key)), "--heartbeat-ms".into(), "200".into()]
    };
    let subscriber_key = crate::proc::key_file(work, "subscriber.key", &id_b.seed)?;
    let mut b = NodeProc::at("peer B", &bins.dagfold, &dir_b, &work.join("b.log"), lb, hb, &flags(&id_a, la));
    let mut node = NodeProc::at("node A", &bins.dagfold, &dir_a, &work.join("a.log"), la, ha, &flags(&id_b, lb));
    b.start(Duration::from_secs(60))?;
    if fault == "efbig" {
        node.file_size_limit = Some(a.fsize_kb * 1024);
    }
    node.start(Duration::from_secs(60))?;

    let file = work.join("load.frames");
    let extra = ["--extra-recipient".to_string(), format!("{}:{}", hex::encode(id_b.public_key), hex::encode(id_b.kem_public))];
    let gen = crate::proc::loadgen_file(bins, work, "loadgen-file", &file, &id_a, a.ops, a.seed, &extra)?;
    let scope_hex = gen["scope"].as_str().context("no scope")?.to_string();
    let root_hex = gen["root"].as_str().context("no root")?.to_string();
    let total_ops = gen["ops"].as_u64().context("no ops")?;
    let scope: [u8; 32] = dagfold::protocol::parse_hash_hex(&scope_hex).unwrap();

    let filler = match &tmpfs {
        Some(t) => Some(fill(&t.0, a.free_kb)?),
        None => None,
    };
    let mut sub = ToolProc::spawn(
        &bins.dagfold,
        &[
            "subscribe".into(),
            "--identity".into(),
            subscriber_key.display().to_string(),
            "--node".into(),
            la.to_string(),
            "--scope".into(),
            scope_hex.clone(),
            "--idle-exit-ms".into(),
            "600000".into(),
        ],
        &work.join("events.jsonl"),
        &work.join("subscriber.err"),
    )?;
    let send = |n: &NodeProc, with_root: bool, name: &str| -> Vec<String> {
        let mut v = vec![
            "send".into(),
            "--node".into(),
            n.listen.to_string(),
            "--admin".into(),
            n.admin.to_string(),
            "--file".into(),
            file.display().to_string(),
            "--timeout-s".into(),
            a.timeout_s.to_string(),
            "--name".into(),
            name.into(),
        ];
        if with_root {
            v.extend(["--scope".into(), scope_hex.clone(), "--root".into(), root_hex.clone()]);
        }
        v
    };
    let t_load = Instant::now();
    let mut load_b = ToolProc::spawn(&bins.loadgen, &send(&b, true, "to-b"), &work.join("send-b.out"), &work.join("send-b.err"))?;
    let mut load_a = ToolProc::spawn(&bins.loadgen, &send(&node, false, "to-a"), &work.join("send-a.out"), &work.join("send-a.err"))?;
    let refusing = wait_until(Duration::from_secs(120), || node.metric("dagfold_store_refusing") == Some(1.0) || !node.alive());
    let fail_s = t_load.elapsed().as_secs_f64();
    let failed_metrics = node.metrics().unwrap_or_default();
    let alive_after_failure = node.alive();
    if !refusing || !alive_after_failure {
        problems.push(format!(
            "A did not enter the refusing state (alive {alive_after_failure}); metrics refusing = {:?}; log: {}",
            node.metric("dagfold_store_refusing"),
            node.log_tail(8)
        ));
    }
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    let error_line = log.lines().find(|l| l.contains("store write failed")).map(str::to_string);
    if error_line.is_none() {
        problems.push("no `store write failed` line in A's log".into());
    }
    let write_failures = metric_in(&failed_metrics, "dagfold_store_write_failures_total", None);
    if write_failures < 1.0 {
        problems.push(format!("dagfold_store_write_failures_total = {write_failures}"));
    }
    // Still answering; nothing more applied; what it refuses is counted.
    let identity_ok = node.get("/v1/identity").is_some_and(|(c, _)| c == 200);
    let scope_code = node.get(&format!("/v1/scopes/{scope_hex}")).map(|(c, _)| c);
    let status_at_failure = node.scope(&scope);
    let applied_at_failure = status_at_failure.as_ref().and_then(|s| s["applied"].as_u64()).unwrap_or(0);
    if !identity_ok || scope_code.is_none() {
        problems.push(format!("A stopped answering status after the failure (identity {identity_ok}, scope {scope_code:?})"));
    }
    let refused_before = node.metric("dagfold_refused_while_failed_total").unwrap_or(0.0);
    let resend = run_tool(&bins.loadgen, &send(&node, false, "to-a-again"), Duration::from_secs(120), work, "send-a-again");
    let refused_counted = wait_until(Duration::from_secs(30), || {
        node.metric("dagfold_refused_while_failed_total").unwrap_or(0.0) > refused_before
    });
    let refused_after = node.metric("dagfold_refused_while_failed_total").unwrap_or(0.0);
    let applied_after_resend = node.scope(&scope).and_then(|s| s["applied"].as_u64()).unwrap_or(0);
    if !refused_counted {
        problems.push(format!("ops sent to the refusing node were not counted (resend: {:?})", resend.err()));
    }
    if applied_after_resend != applied_at_failure {
        problems.push(format!("the refusing node applied more: {applied_at_failure} → {applied_after_resend}"));
    }
    if !node.alive() {
        problems.push("A exited while refusing".into());
    }
    let _ = load_a.wait(Duration::from_secs(60));
    let t_stop = Instant::now();
    let stop_status = node.stop(Duration::from_secs(30));
    let stop_s = t_stop.elapsed().as_secs_f64();

    // A restart while the disk is still full: it must not make things worse.
    let full_restart = node.start(Duration::from_secs(60));
    let full_restart_note = match &full_restart {
        Ok(_) => {
            std::thread::sleep(Duration::from_secs(2));
            let r = node.metric("dagfold_store_refusing");
            node.stop(Duration::from_secs(30));
            format!("opened; refusing = {r:?} after 2 s")
        }
        Err(e) => format!("did not start: {}", crate::proc::tail(&e.to_string(), 3)),
    };
    // Space returns.
    if let (Some(t), Some(_)) = (&tmpfs, filler) {
        std::fs::remove_file(t.0.join("filler")).map_err(|e| anyhow!("removing the filler: {e}"))?;
    }
    node.file_size_limit = None;
    let offline = check_store(&dir_a, Some(scope), false);
    problems.extend(offline.problems.iter().map(|p| format!("store after the fault: {p}")));
    let applied_on_disk = offline.scope_applied.unwrap_or(0);
    if applied_on_disk < applied_at_failure {
        problems.push(format!("the store holds {applied_on_disk} applied, the node had reported {applied_at_failure}"));
    }
    // Restart with space back: it resumes and catches up from B.
    let restart = node.start(Duration::from_secs(120));
    if let Err(e) = &restart {
        problems.push(format!("A did not restart with space back: {e}"));
    }
    let refusing_after_restart = node.metric("dagfold_store_refusing");
    let b_done = load_b.wait(timeout);
    if !b_done.is_some_and(|s| s.success()) {
        problems.push(format!("the load into B did not finish: {b_done:?}"));
    }
    let t_catch = Instant::now();
    let caught_up = wait_until(timeout, || {
        node.scope(&scope).is_some_and(|s| s["root"].as_str() == Some(root_hex.as_str()) && s["applied"].as_u64() == Some(total_ops))
    });
    let catch_up_s = t_catch.elapsed().as_secs_f64();
    if !caught_up {
        problems.push(format!("A did not catch up with B: {:?}", node.scope(&scope)));
    }
    let sync_ops = node.metric("dagfold_sync_ops_received_total").unwrap_or(0.0);
    // Let the subscriber take the last events, then stop it.
    std::thread::sleep(Duration::from_secs(3));
    let _ = sub.wait(Duration::from_millis(1));
    let lines: Vec<serde_json::Value> = sub.output().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    node.stop(Duration::from_secs(30));
    b.stop(Duration::from_secs(30));
    let fin = check_store(&dir_a, Some(scope), true);
    problems.extend(fin.problems.iter().map(|p| format!("final store of A: {p}")));
    if fin.root.map(hex::encode).as_deref() != Some(root_hex.as_str()) {
        problems.push("A's final stored root is not the load generator's".into());
    }
    // Every event the subscriber received across the fault names an op that
    // is applied in the end, numbered from 1 without gap.
    for (i, l) in lines.iter().enumerate() {
        let op: Option<[u8; 32]> = l["op"].as_str().and_then(dagfold::protocol::parse_hash_hex);
        if l["seq"].as_u64() != Some(i as u64 + 1) || !op.is_some_and(|o| fin.ops.contains(&o)) {
            problems.push(format!("subscriber event {i}: {l}"));
            break;
        }
    }
    drop(tmpfs);
    Ok(json!({
        "campaign": "disk",
        "ok": problems.is_empty(),
        "fault": fault,
        "notes": notes,
        "ops": total_ops,
        "filler_bytes": filler,
        "tmpfs_mb": (fault == "enospc").then_some(a.tmpfs_mb),
        "free_kb_left": (fault == "enospc").then_some(a.free_kb),
        "fsize_limit_kb": (fault == "efbig").then_some(a.fsize_kb),
        "failed_after_s": fail_s,
        "log_line": error_line,
        "store_write_failures": write_failures,
        "applied_at_failure": applied_at_failure,
        "status_answers_while_refusing": identity_ok,
        "refused_while_failed": refused_after,
        "stop_while_refusing": {"exit": stop_status.map(|s| s.to_string()), "seconds": stop_s},
        "restart_while_full": full_restart_note,
        "store_after_fault": offline.summary(),
        "refusing_after_restart": refusing_after_restart,
        "catch_up_s": catch_up_s,
        "sync_ops_received_after_restart": sync_ops,
        "events_received": lines.len(),
        "final_store_a": fin.summary(),
        "total_s": t_all.elapsed().as_secs_f64(),
        "problems": problems,
        "work_dir": work.display().to_string(),
    }))
}
