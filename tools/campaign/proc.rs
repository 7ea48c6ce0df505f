//! Child processes of the campaigns: `dagfold node` (started, SIGKILLed,
//! restarted), its status and metrics over HTTP, its memory from /proc.
//! Every wait is bounded.

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use dagfold::protocol::Hash;

/// The binaries the campaigns run.
#[derive(Clone, Debug)]
pub struct Bins {
    pub dagfold: PathBuf,
    pub loadgen: PathBuf,
    /// The power-cut filesystem (tools/powercut), needed by crash runs with cuts.
    pub powercut: PathBuf,
}

pub fn free_port() -> u16 {
    // A UDP port (QUIC) whose TCP twin (HTTP) is free too.
    for _ in 0..1000 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("binding a UDP socket on loopback");
        let port = udp.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair on loopback");
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `dagfold node` child: same data directory, addresses and flags across
/// restarts; stdout and stderr of every run appended to `log`.
pub struct NodeProc {
    pub name: String,
    child: Option<Child>,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
    bin: PathBuf,
    /// RLIMIT_FSIZE for the next spawns (a write error past it: EFBIG).
    pub file_size_limit: Option<u64>,
}

/// Writes `seed` as an identity key file (`dagfold subscribe --identity`),
/// owner-only, in `dir`.
pub fn key_file(dir: &Path, name: &str, seed: &[u8; 32]) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, hex::encode(seed))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

impl NodeProc {
    pub fn at(name: &str, bin: &Path, data_dir: &Path, log: &Path, listen: SocketAddr, admin: SocketAddr, extra: &[String]) -> NodeProc {
        let mut args = vec![
            "node".to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen".into(),
            listen.to_string(),
            "--admin".into(),
            admin.to_string(),
            // The campaigns' scopes are made by the load generator's keys.
            "--accept-any-scope".into(),
        ];
        args.extend(extra.iter().cloned());
        NodeProc {
            name: name.into(),
            child: None,
            listen,
            admin,
            data_dir: data_dir.to_path_buf(),
            log: log.to_path_buf(),
            args,
            bin: bin.to_path_buf(),
            file_size_limit: None,
        }
    }

    fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("opening a node log")
    }

    /// Spawns the process without waiting for it; returns a receiver of its
    /// first stdout line (the ready line), disconnected if it exits first.
    fn spawn(&mut self) -> anyhow::Result<std::sync::mpsc::Receiver<String>> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let mut log = self.log_file();
        let _ = writeln!(log, "=== campaign: starting {} ===", self.name);
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
        if let Some(limit) = self.file_size_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    // A write past the limit fails with EFBIG instead of
                    // killing the process with SIGXFSZ.
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    let lim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().map_err(|e| anyhow!("spawning {}: {e}", self.bin.display()))?;
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut log = self.log_file();
        std::thread::spawn(move || {
            let mut first = true;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if first {
                    let _ = tx.send(line.clone());
                    first = false;
                }
                let _ = writeln!(log, "stdout: {line}");
            }
        });
        self.child = Some(child);
        Ok(rx)
    }

    /// Starts the node and waits until it printed its ready line and
    /// answers /v1/identity (the store opened). Returns how long it took.
    pub fn start(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let rx = self.spawn()?;
        let line = match rx.recv_timeout(timeout) {
            Ok(l) => l,
            Err(_) => {
                let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                self.kill();
                return Err(anyhow!("{} did not start (exit {status:?}); log tail:\n{}", self.name, self.log_tail(12)));
            }
        };
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|_| anyhow!("{} printed {line:?} instead of its ready line", self.name))?;
        if v["listen"].as_str() != Some(&self.listen.to_string()) {
            return Err(anyhow!("{} listens on {} instead of {}", self.name, v["listen"], self.listen));
        }
        let left = timeout.saturating_sub(t.elapsed()).max(Duration::from_secs(5));
        if !wait_until(left, || self.get("/v1/identity").is_some_and(|(c, _)| c == 200)) {
            return Err(anyhow!("{} does not answer /v1/identity", self.name));
        }
        Ok(t.elapsed())
    }

    /// Spawns the node and SIGKILLs it after `after` (while it opens its
    /// store and restores, or just after), without waiting for it.
    pub fn start_and_kill_early(&mut self, after: Duration) -> anyhow::Result<()> {
        let _rx = self.spawn()?;
        std::thread::sleep(after);
        self.kill();
        Ok(())
    }

    /// Spawns the node without waiting for it to be up.
    pub fn spawn_only(&mut self) -> anyhow::Result<()> {
        self.spawn().map(drop)
    }

    /// Arms the power-cut filesystem to SIGKILL the node inside its next
    /// operation of `kind` (tools/powercut), waits up to `wait` for it to
    /// die, and disarms. Whether the aimed kill fired (if not, the node
    /// still runs).
    pub fn kill_aimed(&mut self, fs: &mut crate::powercut::PowerCut, kind: &str, wait: Duration) -> anyhow::Result<bool> {
        let Some(pid) = self.pid() else { return Ok(false) };
        fs.arm(kind, pid)?;
        wait_until(wait, || !self.alive());
        fs.disarm()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `timeout`. Returns the exit status when
    /// it stopped by itself.
    pub fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        dagfold::testkit::http_get(self.admin, path, Duration::from_secs(5)).ok()
    }

    pub fn scope(&self, scope: &Hash) -> Option<serde_json::Value> {
        let (code, body) = self.get(&format!("/v1/scopes/{}", hex::encode(scope)))?;
        (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    pub fn metrics(&self) -> Option<String> {
        self.get("/metrics").filter(|(c, _)| *c == 200).map(|(_, t)| t)
    }

    /// The sum of a metric over its labels (None if the node does not answer).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics().map(|t| metric_in(&t, name, None))
    }

    pub fn rss_kb(&self) -> u64 {
        self.pid().and_then(|p| proc_status_kb(p, "VmRSS:")).unwrap_or(0)
    }

    pub fn hwm_kb(&self) -> u64 {
        self.pid().and_then(|p| proc_status_kb(p, "VmHWM:")).unwrap_or(0)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The sum of `name` over its samples in a Prometheus text, optionally only
/// those whose labels contain `label` (e.g. `reason="decode"`).
pub fn metric_in(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{'))
        })
        .filter(|l| label.is_none_or(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// A child tool process (loadgen, subscriber) with its stdout to a file.
pub struct ToolProc {
    pub child: Child,
    pub out: PathBuf,
}

impl ToolProc {
    pub fn spawn(bin: &Path, args: &[String], out: &Path, err: &Path) -> anyhow::Result<ToolProc> {
        let o = std::fs::File::create(out)?;
        let e = std::fs::OpenOptions::new().create(true).append(true).open(err)?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(o))
            .stderr(Stdio::from(e))
            .spawn()
            .map_err(|e| anyhow!("spawning {}: {e}", bin.display()))?;
        Ok(ToolProc { child, out: out.to_path_buf() })
    }

    /// Waits up to `timeout` for the process to exit; kills it after.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The last JSON line of its output.
    pub fn json(&self) -> Option<serde_json::Value> {
        self.output().lines().rev().find_map(|l| serde_json::from_str(l).ok())
    }
}

impl Drop for ToolProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a tool to completion (bounded) and returns its last JSON line.
/// `dagfold-loadgen file` for the node with identity `id`: writes the frames
/// to `out` and returns the generator's JSON (scope, root, ops). `extra` is
/// passed on (`--writers`, `--extra-recipient`, ...).
pub fn loadgen_file(
    bins: &Bins,
    work: &Path,
    name: &str,
    out: &Path,
    id: &dagfold::core::Identity,
    ops: usize,
    seed: u64,
    extra: &[String],
) -> anyhow::Result<serde_json::Value> {
    let mut args: Vec<String> = vec![
        "file".into(),
        "--out".into(),
        out.display().to_string(),
        "--public-key".into(),
        hex::encode(id.public_key),
        "--kem-public-key".into(),
        hex::encode(id.kem_public),
        "--ops".into(),
        ops.to_string(),
        "--seed".into(),
        seed.to_string(),
    ];
    args.extend(extra.iter().cloned());
    run_tool(&bins.loadgen, &args, Duration::from_secs(600), work, name)
}

pub fn run_tool(bin: &Path, args: &[String], timeout: Duration, dir: &Path, name: &str) -> anyhow::Result<serde_json::Value> {
    let out = dir.join(format!("{name}.out"));
    let err = dir.join(format!("{name}.err"));
    let mut p = ToolProc::spawn(bin, args, &out, &err)?;
    match p.wait(timeout) {
        Some(st) if st.success() => p.json().ok_or_else(|| anyhow!("{name}: no JSON output")),
        Some(st) => Err(anyhow!("{name} failed ({st}): {}", tail(&std::fs::read_to_string(&err).unwrap_or_default(), 8))),
        None => Err(anyhow!("{name} timed out after {timeout:?}")),
    }
}

pub fn tail(text: &str, n: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

/// Samples a node's RSS every `every` until stopped; returns the maximum (kB).
pub struct RssSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<(u64, Vec<u64>)>>,
}

impl RssSampler {
    pub fn start(pid: u32, every: Duration) -> RssSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut max = 0;
            let mut series = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let rss = proc_status_kb(pid, "VmRSS:").unwrap_or(0);
                max = max.max(rss);
                series.push(rss);
                std::thread::sleep(every);
            }
            (max, series)
        });
        RssSampler { stop, handle: Some(handle) }
    }

    /// (max RSS kB, samples).
    pub fn finish(mut self) -> (u64, Vec<u64>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap_or_default()
    }
}
