//! `dagfold-loadgen api`: the `api_writes` workload (issue: the application
//! API). Many HTTP clients with keep-alive write one-put ops to one scope
//! through node A's API while node B, a member and peer of A, receives
//! them by gossip. Reports A's authored ops/s, p50/p99 from request to
//! answer, and B's lag behind A.
//!
//! The HTTP client is a minimal keep-alive HTTP/1.1 one (a request, a
//! `content-length` answer), so that the generator's own cost stays small
//! beside the node's on a machine they share. The writing clients are
//! tasks on one thread, each on its own connection with one request out
//! at a time: the answers of a commit arrive together and are read in one
//! wake-up of that thread, where a thread per client woke once per answer
//! (2026-12-05: the clients' CPU per write 19–29 µs on 64 threads,
//! docs/PERFORMANCE.md).

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
        self.r.get_mut().write_all(&request(method, path, self.addr, &self.token, body))?;
        let mut line = String::new();
        self.r.read_line(&mut line)?;
        let status = status_of(&line)?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line)?;
            match header(&line)? {
                Header::End => break,
                Header::Length(n) => len = n,
                Header::Other => {}
            }
        }
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf)?;
        Ok((status, body_of(&buf)?))
    }

    fn ok(&mut self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let (status, v) = self.call(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!("{method} {path}: {status} {v}");
        }
        Ok(v)
    }
}

/// A request's bytes: the head and the body in one write, one segment on
/// the wire, so the server reads the request whole (two writes with
/// nodelay cost both sides a wake-up more per request).
fn request(method: &str, path: &str, addr: SocketAddr, token: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn status_of(line: &str) -> anyhow::Result<u16> {
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("no HTTP status in {line:?}"))
}

enum Header {
    End,
    Length(usize),
    Other,
}

/// An answer's header line: the blank one that ends them, its length, or
/// another.
fn header(line: &str) -> anyhow::Result<Header> {
    let l = line.trim_end();
    if l.is_empty() {
        return Ok(Header::End);
    }
    match l.split_once(':') {
        Some((k, v)) if k.eq_ignore_ascii_case("content-length") => Ok(Header::Length(v.trim().parse()?)),
        _ => Ok(Header::Other),
    }
}

fn body_of(buf: &[u8]) -> anyhow::Result<Value> {
    Ok(if buf.is_empty() { Value::Null } else { serde_json::from_slice(buf)? })
}

/// A writing client: its own keep-alive connection, one write out at a
/// time, until `next` reaches `n`; each write's latency in ms.
async fn writer(addr: SocketAddr, token: String, path: String, value: String, next: Arc<AtomicUsize>, n: usize) -> anyhow::Result<Vec<f64>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let s = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    let mut r = tokio::io::BufReader::new(s);
    let mut lat = Vec::new();
    let mut line = String::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return Ok(lat);
        }
        let body = json!({ "actions": [{ "put": { "entity": "bench", "key": format!("k{i}"), "value": value } }] });
        let t = Instant::now();
        r.get_mut().write_all(&request("POST", &path, addr, &token, Some(&body))).await?;
        line.clear();
        r.read_line(&mut line).await?;
        let status = status_of(&line)?;
        let mut len = 0usize;
        loop {
            line.clear();
            r.read_line(&mut line).await?;
            match header(&line)? {
                Header::End => break,
                Header::Length(k) => len = k,
                Header::Other => {}
            }
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf).await?;
        if !(200..300).contains(&status) {
            bail!("POST {path}: {status} {}", body_of(&buf)?);
        }
        lat.push(t.elapsed().as_secs_f64() * 1e3);
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
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let path = format!("/v1/scopes/{scope}/ops");
    let mut lat = rt.block_on(async {
        let clients: Vec<_> = (0..args.clients)
            .map(|_| tokio::spawn(writer(args.api, ta.clone(), path.clone(), value.clone(), next.clone(), args.ops)))
            .collect();
        let mut lat = Vec::with_capacity(args.ops);
        for c in clients {
            lat.extend(c.await.map_err(|_| anyhow!("a client panicked"))??);
        }
        anyhow::Ok(lat)
    })?;
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
