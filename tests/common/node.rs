//! Running `dagfold node` as a child process, on loopback, for end-to-end
//! tests. Every wait is bounded.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    // Bind both a UDP and a TCP socket to find a port free for each.
    loop {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub struct NodeProc {
    pub child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
    pub args: Vec<String>,
    /// The node's first line of output (its identity and addresses).
    pub first_line: serde_json::Value,
}

impl NodeProc {
    pub fn start(data_dir: &Path, listen: SocketAddr, admin: SocketAddr, extra: &[String]) -> NodeProc {
        // The tests' scopes are made by the workload's keys.
        NodeProc::start_with_policy(data_dir, listen, admin, &[&["--accept-any-scope".to_string()], extra].concat())
    }

    /// A node with only `extra` (no `--accept-any-scope`): the node's own
    /// genesis policy unless `extra` says otherwise.
    pub fn start_with_policy(data_dir: &Path, listen: SocketAddr, admin: SocketAddr, extra: &[String]) -> NodeProc {
        let mut args = vec![
            "node".to_string(),
            "--data-dir".into(),
            data_dir.to_str().unwrap().into(),
            "--listen".into(),
            listen.to_string(),
            "--admin".into(),
            admin.to_string(),
        ];
        args.extend(extra.iter().cloned());
        let mut n = NodeProc { child: spawn(&args), listen, admin, data_dir: data_dir.to_path_buf(), args, first_line: serde_json::Value::Null };
        n.wait_ready();
        n
    }

    fn wait_ready(&mut self) {
        let stdout = self.child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("node said {line:?}"));
        assert_eq!(v["listen"].as_str().unwrap(), self.listen.to_string());
        self.first_line = v;
        wait_until(Duration::from_secs(20), || self.get("/v1/identity").is_some_and(|(c, _)| c == 200));
    }

    pub fn restart(&mut self) {
        self.child = spawn(&self.args);
        self.wait_ready();
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        dagfold::testkit::http_get(self.admin, path, Duration::from_secs(2)).ok()
    }

    pub fn identity(&self) -> ([u8; 32], [u8; 32]) {
        let (_, body) = self.get("/v1/identity").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let h = |k: &str| -> [u8; 32] { hex::decode(v[k].as_str().unwrap()).unwrap().try_into().unwrap() };
        (h("public_key"), h("kem_public_key"))
    }

    pub fn scope(&self, scope: &[u8; 32]) -> Option<serde_json::Value> {
        let (code, body) = self.get(&format!("/v1/scopes/{}", hex::encode(scope)))?;
        (code == 200).then(|| serde_json::from_str(&body).unwrap())
    }

    pub fn metric(&self, name: &str) -> f64 {
        let Some((_, text)) = self.get("/metrics") else { return 0.0 };
        text.lines()
            .filter(|l| l.starts_with(name) && (l.as_bytes().get(name.len()) == Some(&b' ') || l.as_bytes().get(name.len()) == Some(&b'{')))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The sum of a metric's series whose labels include `label` (e.g.
    /// `part="cells"`).
    pub fn metric_with(&self, name: &str, label: &str) -> f64 {
        let Some((_, text)) = self.get("/metrics") else { return 0.0 };
        let prefix = format!("{name}{{");
        text.lines()
            .filter(|l| l.starts_with(&prefix) && l.split('}').next().is_some_and(|labels| labels.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn stop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning dagfold node")
}

/// The public key (hex) of the node whose data directory is `data_dir`,
/// made there if new (`dagfold identity`; the node must not be running).
pub fn identity_key(data_dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(["identity", "--data-dir", data_dir.to_str().unwrap()])
        .output()
        .expect("running dagfold identity");
    assert!(out.status.success(), "dagfold identity: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("identity JSON");
    v["public_key"].as_str().expect("public_key").to_owned()
}

/// `--peer KEY@ADDR` for the node of `data_dir` listening on `listen`: a
/// peer configured by key, served every scope (SPEC §10).
pub fn peer_flags(data_dir: &Path, listen: SocketAddr) -> [String; 2] {
    ["--peer".to_owned(), format!("{}@{listen}", identity_key(data_dir))]
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub fn wait_until(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    wait_until_every(timeout, Duration::from_millis(50), f)
}

/// `wait_until` polling every `every`: a short one for a condition that
/// may not hold long (a kill aimed while ops flow).
pub fn wait_until_every(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(every);
    }
    false
}

/// Sends frames to a node over QUIC: `connections` connections, each with
/// `streams` unidirectional streams taking frames round-robin.
pub fn send_frames(addr: SocketAddr, frames: &[Vec<u8>], connections: usize, streams: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = dagfold::net::ServerConfig::default();
        let endpoint = dagfold::net::client_endpoint("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let lanes = connections * streams;
        let mut per_lane: Vec<Vec<Vec<u8>>> = vec![Vec::new(); lanes];
        for (i, f) in frames.iter().enumerate() {
            per_lane[i % lanes].push(f.clone());
        }
        let mut tasks = Vec::new();
        let mut lane = per_lane.into_iter();
        for _ in 0..connections {
            let conn = tokio::time::timeout(Duration::from_secs(10), dagfold::net::connect(&endpoint, addr)).await.unwrap().unwrap();
            for _ in 0..streams {
                let frames = lane.next().unwrap();
                let conn = conn.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_secs(60), dagfold::net::send_frames_uni(&conn, frames)).await
                }));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        endpoint.wait_idle().await;
    });
}

/// Sends each frame on its own stream (a malformed frame closes only its
/// own), in order, waiting for each to be acknowledged.
pub fn send_each_on_own_stream(addr: SocketAddr, frames: &[Vec<u8>]) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cfg = dagfold::net::ServerConfig::default();
        let endpoint = dagfold::net::client_endpoint("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let conn = tokio::time::timeout(Duration::from_secs(10), dagfold::net::connect(&endpoint, addr)).await.unwrap().unwrap();
        for f in frames {
            let _ = tokio::time::timeout(Duration::from_secs(10), dagfold::net::send_frames_uni(&conn, [f])).await;
        }
        conn.close(0u32.into(), b"done");
        endpoint.wait_idle().await;
    });
}
