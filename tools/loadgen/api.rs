//! `dagfold-loadgen api`: the `api_writes` workload (issue: the application
//! API). Many HTTP clients with keep-alive write one-put ops to one scope
//! through node A's API while node B, a member and peer of A, receives
//! them by gossip. Reports A's authored ops/s, p50/p99 from request to
//! answer, and B's lag behind A.
//!
//! The HTTP client is a minimal keep-alive HTTP/1.1 one (a request, a
//! `content-length` answer), so that the generator's own cost stays small
//! beside the node's on a machine they share.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

#[derive(clap::Args, Clone)]
pub struct ApiArgs {
    /// Node A's API (HTTP) address: the writes go there.
    #[arg(long)]
    api: SocketAddr,
    /// Node A's API token file (`<data-dir>/api-token`).
    #[arg(long)]
    token_file: std::path::PathBuf,
    /// Node B's API address: a peer of A, made a member of the scope.
    #[arg(long)]
    peer_api: SocketAddr,
    /// Node B's API token file.
    #[arg(long)]
    peer_token_file: std::path::PathBuf,
    /// Writes (one op with one put each).
    #[arg(long, default_value_t = 100_000)]
    ops: usize,
    /// Concurrent HTTP clients, each on its own keep-alive connection.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Bytes of each put's value.
    #[arg(long, default_value_t = 16)]
    value_bytes: usize,
    /// A's pid and B's, for their CPU time and RSS.
    #[arg(long)]
    node_pid: Option<u32>,
    #[arg(long)]
    peer_pid: Option<u32>,
    /// Give up waiting for B after this long.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    #[arg(long, default_value = "api_writes")]
    name: String,
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    addr: SocketAddr,
    token: String,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr, token: &str) -> anyhow::Result<Conn> {
        let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn { addr, token: token.to_owned(), r: BufReader::new(s) })
    }

    /// A request; the status and the JSON body.
    fn call(&mut self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<(u16, Value)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        // The head and the body in one write: one segment on the wire, so
        // the server reads the request whole (two writes with nodelay cost
        // both sides a wake-up more per request).
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            self.token,
            body.len()
        );
        self.r.get_mut().write_all(request.as_bytes())?;
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let status: u16 = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("no HTTP status in {line:?}"))?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse()?;
                }
            }
        }
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf)?;
        let v = if buf.is_empty() { Value::Null } else { serde_json::from_slice(&buf)? };
        Ok((status, v))
    }

    fn ok(&mut self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let (status, v) = self.call(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!("{method} {path}: {status} {v}");
        }
        Ok(v)
    }
}

fn token(path: &std::path::Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?.trim().to_owned())
}

pub fn api(args: ApiArgs) -> anyhow::Result<Value> {
    let (ta, tb) = (token(&args.token_file)?, token(&args.peer_token_file)?);
    let mut a = Conn::open(args.api, &ta)?;
    let mut b = Conn::open(args.peer_api, &tb)?;
    let b_id = b.ok("GET", "/v1/identity", None)?;
    let scope = a.ok("POST", "/v1/scopes", Some(&json!({ "name": "api_writes" })))?["scope"].as_str().unwrap_or_default().to_owned();
    b.ok("POST", &format!("/v1/scopes/{scope}/follow"), None)?;
    let member = json!({ "public_key": b_id["public_key"], "kem_public_key": b_id["kem_public_key"], "role": "reader" });
    a.ok("POST", &format!("/v1/scopes/{scope}/members"), Some(&member))?;
    // A fresh connection each time: one left idle during the writes is
    // closed by the server's keep-alive timeout.
    let status = |addr: SocketAddr, token: &str| -> Option<Value> {
        let (code, v) = Conn::open(addr, token).ok()?.call("GET", &format!("/v1/scopes/{scope}"), None).ok()?;
        (code == 200).then_some(v)
    };
    // B holds the scope and its key before the clock starts.
    let t = Instant::now();
    while status(args.peer_api, &tb).is_none_or(|s| s["applied"].as_u64() < Some(2)) {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("node B never applied the scope's genesis and membership");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let base_applied = status(args.api, &ta).and_then(|s| s["applied"].as_u64()).unwrap_or(0);
    let cpu0 = (args.node_pid.and_then(crate::cpu_seconds), args.peer_pid.and_then(crate::cpu_seconds));
    let clients_cpu0 = crate::cpu_seconds(std::process::id());
    let next = Arc::new(AtomicUsize::new(0));
    let value = "v".repeat(args.value_bytes);
    let started = Instant::now();
    let clients: Vec<_> = (0..args.clients)
        .map(|_| {
            let (next, scope, value, token, addr, n) = (next.clone(), scope.clone(), value.clone(), ta.clone(), args.api, args.ops);
            std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
                let mut c = Conn::open(addr, &token)?;
                let path = format!("/v1/scopes/{scope}/ops");
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(lat);
                    }
                    let body = json!({ "actions": [{ "put": { "entity": "bench", "key": format!("k{i}"), "value": value } }] });
                    let t = Instant::now();
                    c.ok("POST", &path, Some(&body))?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(args.ops);
    for c in clients {
        lat.extend(c.join().map_err(|_| anyhow!("a client panicked"))??);
    }
    let authored_s = started.elapsed().as_secs_f64();
    let target = base_applied + args.ops as u64;
    let mut b_done = None;
    while b_done.is_none() {
        if status(args.peer_api, &tb).and_then(|s| s["applied"].as_u64()).is_some_and(|n| n >= target) {
            b_done = Some(started.elapsed().as_secs_f64());
        } else if started.elapsed() > Duration::from_secs(args.timeout_s) {
            bail!("node B did not apply every write within {} s", args.timeout_s);
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let b_s = b_done.unwrap();
    let (ra, rb) = (status(args.api, &ta), status(args.peer_api, &tb));
    let roots_equal = ra.as_ref().map(|s| &s["root"]) == rb.as_ref().map(|s| &s["root"]);
    lat.sort_by(|x, y| x.total_cmp(y));
    let pct = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0.0);
    let cores = |pid: Option<u32>, before: Option<f64>, secs: f64| Some((crate::cpu_seconds(pid?)? - before?) / secs);
    // Every party's CPU per write, from the first write until node B
    // applied the last: the three share the machine's cores.
    let per_write = |pid: Option<u32>, before: Option<f64>| Some((crate::cpu_seconds(pid?)? - before?) * 1e6 / args.ops as f64);
    let (node_us, peer_us, clients_us) =
        (per_write(args.node_pid, cpu0.0), per_write(args.peer_pid, cpu0.1), per_write(Some(std::process::id()), clients_cpu0));
    let all_us = node_us.zip(peer_us).zip(clients_us).map(|((a, b), c)| a + b + c);
    Ok(json!({
        "name": args.name,
        "ops": args.ops,
        "clients": args.clients,
        "ops_per_s": args.ops as f64 / authored_s,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "peer_ops_per_s": args.ops as f64 / b_s,
        "peer_lag_ms": (b_s - authored_s) * 1e3,
        "roots_equal": roots_equal,
        "node_cpu_cores": cores(args.node_pid, cpu0.0, authored_s),
        "peer_cpu_cores": cores(args.peer_pid, cpu0.1, b_s),
        "cpu_us_per_write": { "node": node_us, "peer": peer_us, "clients": clients_us, "all": all_us },
        "peak_rss_bytes": args.node_pid.and_then(|p| crate::proc_status_kb(p, "VmHWM")).map(|k| k * 1024),
    }))
}
