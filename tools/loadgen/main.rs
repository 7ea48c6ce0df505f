//! `dagfold-loadgen`: creates a scope for a running node, generates signed,
//! encrypted ops (all before the timed phase), sends them over QUIC on many
//! streams and connections, waits until the node's status shows everything
//! applied, checks the node's root against its own fold, and reports
//! throughput, latency, the node's CPU and memory, and bytes on disk per op.
//!
//! Also `dagfold-loadgen ceiling`: the machine's verification ceiling;
//! `dagfold-loadgen file`: a generated scope as a frames file; and
//! `dagfold-loadgen send`: a frames file sent to a node, resent after every
//! lost connection (from the first op the node's heads do not cover) until
//! the node shows the expected root (the crash campaign's load).


// The same allocator as the node (src/bin/dagfold.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod api;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use dagfold::protocol::crypto::key_id_of;
use dagfold::protocol::*;
use dagfold::workload::{generate, shuffle_within_windows, sign_op, Member, WorkloadConfig};
use rand::{Rng, SeedableRng};

#[derive(Parser)]
#[command(name = "dagfold-loadgen", about = "Load generator and ceiling measurement for a dagfold node")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Send a generated scope to a node and measure it. Prints JSON: ops/s,
    /// p50/p99 from send to applied, longest_stall_ms (the longest the
    /// applied count stood still while sent ops waited, and when:
    /// longest_stall_at_s), the node's CPU and peak RSS, disk bytes per op,
    /// the root check; and what the latencies hold besides the node:
    /// status_request_p99_ms (one read of the node's status; the latencies
    /// are high by up to --sample-ms plus one read) and send_late_p99_ms
    /// (at a set rate, how late frames went out after they were due).
    Run(RunArgs),
    /// Write a generated scope as a frames file (u32 LE length, then the
    /// message) for `dagfold import`, for a node with the given keys.
    File {
        #[arg(long)]
        out: PathBuf,
        /// The node's public key (hex), as `dagfold identity` prints it.
        #[arg(long)]
        public_key: String,
        /// The node's X25519 key (hex).
        #[arg(long)]
        kem_public_key: String,
        #[arg(long, default_value_t = 100_000)]
        ops: usize,
        #[arg(long, default_value_t = 4)]
        writers: usize,
        #[arg(long)]
        chain: bool,
        /// As `run --view-lag`: any number of writers.
        #[arg(long)]
        view_lag: Option<usize>,
        #[arg(long)]
        reverse: bool,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also deliver the scope's keys to this node (`PUBLIC_KEY:KEM_PUBLIC_KEY`,
        /// hex; repeatable), so that it can read the scope too (a peer).
        #[arg(long = "extra-recipient")]
        extra_recipients: Vec<String>,
    },
    /// Send a frames file (as `file` writes it) to a node over QUIC. With
    /// --scope and --root, keep (re)sending until the node's status shows
    /// that root and every op of the file applied: after a lost connection
    /// (a killed node) it reconnects and resends the governance prefix and
    /// the data ops from the first one its heads do not cover. Prints JSON.
    Send(SendArgs),
    /// The `api_writes` workload: concurrent HTTP clients with keep-alive
    /// write one-put ops to one scope through node A's API while node B, a
    /// member and peer of A, receives them by gossip. Prints JSON: A's
    /// authored ops/s and p50/p99 from request to answer, B's rate and lag,
    /// whether their roots agree at the end.
    Api(api::ApiArgs),
    /// Measure the single-core rate of signature verification on this
    /// machine (batch of 64 with ed25519-dalek and ed25519-consensus, the
    /// project's own, and single verify_strict) and print JSON.
    Ceiling {
        /// Cores the node may use: the ceiling is the faster batch rate times this.
        #[arg(long, default_value_t = 2)]
        cores: u32,
        /// Seconds to measure each verifier, in ten slices of which the best
        /// counts (noise on a shared machine only slows a slice down).
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
}

/// Where the node is, and where to send from.
#[derive(clap::Args, Clone)]
struct NodeAddrs {
    /// The node's QUIC address.
    #[arg(long, default_value = "127.0.0.1:7400")]
    node: SocketAddr,
    /// The local address to send from (the node treats each address as
    /// one origin, served in turn with the others).
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// The node's HTTP status address.
    #[arg(long, default_value = "127.0.0.1:7401")]
    admin: SocketAddr,
    /// A key file (64 hex: an Ed25519 seed; made, owner-only, if missing)
    /// whose identity is presented in the handshake (SPEC §10); anonymous
    /// without one.
    #[arg(long)]
    identity: Option<std::path::PathBuf>,
    /// The node's public key (64 hex): the handshake aborts unless the node
    /// proves it.
    #[arg(long)]
    node_key: Option<String>,
}

impl NodeAddrs {
    /// The endpoint to send from (presenting `--identity`), its config, the
    /// identity and the node to dial (with `--node-key`).
    fn dialing(&self) -> anyhow::Result<(quinn::Endpoint, dagfold::net::ServerConfig, Option<dagfold::net::NodeCert>, dagfold::net::PeerAddr)> {
        let ncfg = dagfold::net::ServerConfig::default();
        let seed = self.identity.as_deref().map(dagfold::node::subscribe::load_or_create_key_file).transpose()?;
        let cert = seed.as_ref().map(dagfold::net::identity_cert).transpose()?;
        let key = self.node_key.as_deref().map(|k| parse_hash_hex(k).ok_or_else(|| anyhow!("--node-key takes 64 hex characters"))).transpose()?;
        let endpoint = dagfold::net::client::client_endpoint_as(self.bind, &ncfg, cert.as_ref())?;
        Ok((endpoint, ncfg, cert, dagfold::net::PeerAddr { key, addr: self.node }))
    }
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    #[command(flatten)]
    to: NodeAddrs,
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Data ops to send.
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    #[arg(long, default_value_t = 2)]
    actions_per_op: usize,
    #[arg(long, default_value_t = 16)]
    value_bytes: usize,
    /// Share of ops that first merge another writer's view (joining heads).
    #[arg(long, default_value_t = 0.2)]
    merge_share: f64,
    #[arg(long, default_value_t = 1)]
    events_per_op: usize,
    /// Distinct keys per entity.
    #[arg(long, default_value_t = 10_000)]
    keys_per_entity: u32,
    /// One straight chain (a single writer) instead of concurrent writers.
    #[arg(long)]
    chain: bool,
    /// Each writer knows the history up to at most this many ops before its
    /// own, instead of its own view merged now and then with another's
    /// (`--merge-share`): any number of writers (without it, at most 32),
    /// at most lag + 1 concurrent heads (lag 0..=31).
    #[arg(long)]
    view_lag: Option<usize>,
    /// Scopes, each with --ops / --scopes data ops (and its genesis, its
    /// members op and the node's key delivery), sent interleaved at random,
    /// each scope's messages in order. More than one: the node's applied
    /// count comes from its `/metrics` (`dagfold_applied_total`), every op
    /// counts (governance too), and the roots of all scopes are checked at
    /// the end; --reverse, --shuffle-window and --invalid take one scope.
    #[arg(long, default_value_t = 1)]
    scopes: usize,
    /// Send the data ops in exactly reverse order.
    #[arg(long)]
    reverse: bool,
    /// Shuffle within windows of this many ops (0: causal order).
    #[arg(long, default_value_t = 0)]
    shuffle_window: usize,
    /// Share of extra duplicate sends.
    #[arg(long, default_value_t = 0.0)]
    duplicates: f64,
    /// Share of extra invalid ops (bad signature, non-member, stale key).
    #[arg(long, default_value_t = 0.0)]
    invalid: f64,
    #[arg(long, default_value_t = 2)]
    connections: usize,
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Ops per second, 0 for full speed.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up waiting for the node after this long.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Pause between two reads of the node's status. An op counts as
    /// applied when the first read that shows it returns, so each latency
    /// is high by up to this plus one read (`status_request_p99_ms`);
    /// each read costs the node an HTTP request.
    #[arg(long, default_value_t = 5)]
    sample_ms: u64,
    /// Write the latencies by when their frames were sent to this file: a
    /// line per 50 ms of the timed phase (its start in seconds, the frames
    /// sent in it, their mean and their largest latency in ms), to see
    /// where in a run its tail comes from.
    #[arg(long)]
    latency_windows: Option<PathBuf>,
    /// The node's pid, for its CPU time and RSS.
    #[arg(long)]
    node_pid: Option<u32>,
    /// The node's data directory, for bytes on disk per op.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A name for the report.
    #[arg(long, default_value = "run")]
    name: String,
}

#[derive(clap::Args, Clone)]
struct SendArgs {
    #[command(flatten)]
    to: NodeAddrs,
    /// The frames file.
    #[arg(long)]
    file: PathBuf,
    /// The scope the file creates (hex, as `file` prints it).
    #[arg(long)]
    scope: Option<String>,
    /// The root the node must reach (hex, as `file` prints it). Without it,
    /// the file is sent once and the command exits once the node has
    /// acknowledged every frame.
    #[arg(long)]
    root: Option<String>,
    /// Frames per second, 0 for full speed.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Streams (one connection): more than 1 breaks the causal order.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Shuffle the data ops within windows of this many (0: file order), so
    /// that the node buffers ops whose parents come later.
    #[arg(long, default_value_t = 0)]
    shuffle_window: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// After a complete send, how long the node's applied count may stay
    /// unchanged before the file is sent again.
    #[arg(long, default_value_t = 10_000)]
    settle_ms: u64,
    /// Pause between attempts after a lost connection.
    #[arg(long, default_value_t = 200)]
    retry_ms: u64,
    /// Give up after this long.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    #[arg(long, default_value = "send")]
    name: String,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Run(args) => match run(args) {
            Ok(report) => println!("{}", serde_json::to_string(&report).unwrap()),
            Err(e) => {
                eprintln!("dagfold-loadgen: {e}");
                std::process::exit(1);
            }
        },
        Cmd::File { out, public_key, kem_public_key, ops, writers, chain, view_lag, reverse, seed, extra_recipients } => {
            let h = |s: &str| -> [u8; 32] { parse_hash_hex(s).expect("64 hex characters") };
            let cfg = WorkloadConfig { seed, writers: if chain { 1 } else { writers }, data_ops: ops, chain, view_lag, ..Default::default() };
            let w = generate(&cfg, h(&public_key), h(&kem_public_key));
            let mut frames: Vec<&Vec<u8>> = w.messages.iter().map(|m| &m.frame).collect();
            // Deliveries for other nodes go just before the first data op.
            let mut extra: Vec<Vec<u8>> = Vec::new();
            for (n, r) in extra_recipients.iter().enumerate() {
                let (pk, kem) = r.split_once(':').expect("--extra-recipient takes PUBLIC_KEY:KEM_PUBLIC_KEY");
                for (i, k) in w.keys.iter().enumerate() {
                    let eph = dagfold::protocol::crypto::sha256_parts(&[b"loadgen/extra", &seed.to_le_bytes(), &[n as u8, i as u8]]);
                    let kd = dagfold::protocol::crypto::seal_key_delivery(w.scope, k, h(pk), &h(kem), &eph);
                    extra.push(encode(&Message::Key(kd)));
                }
            }
            let first_data = w.messages.iter().position(|m| m.is_data).unwrap_or(frames.len());
            frames.splice(first_data..first_data, extra.iter());
            if reverse {
                frames.reverse();
            }
            let mut f = std::io::BufWriter::new(std::fs::File::create(&out).expect("creating the output file"));
            use std::io::Write;
            for fr in frames {
                f.write_all(&(fr.len() as u32).to_le_bytes()).unwrap();
                f.write_all(fr).unwrap();
            }
            f.flush().unwrap();
            let ops = w.messages.iter().filter(|m| m.id != ZERO).count();
            println!(
                "{}",
                serde_json::json!({"scope": hex::encode(w.scope), "root": hex::encode(w.final_root), "messages": w.messages.len() + extra.len(), "ops": ops})
            );
        }
        Cmd::Send(args) => match send(args) {
            Ok(report) => println!("{}", serde_json::to_string(&report).unwrap()),
            Err(e) => {
                eprintln!("dagfold-loadgen: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Api(args) => match api::api(args) {
            Ok(report) => println!("{report}"),
            Err(e) => {
                eprintln!("dagfold-loadgen: {e:#}");
                std::process::exit(1);
            }
        },
        Cmd::Ceiling { cores, seconds } => println!("{}", serde_json::to_string(&ceiling(cores, seconds)).unwrap()),
    }
}

/// The lane of a frame: by its op's author (bytes 35..67 of an op frame).
/// Bytes of frames written to a stream at once (see `run`).
const COALESCE_BYTES: usize = 64 * 1024;

fn lane_of(frame: &[u8], lanes: usize) -> usize {
    if frame.len() < 67 {
        return 0;
    }
    let a = u64::from_le_bytes(frame[35..43].try_into().unwrap());
    (a % lanes as u64) as usize
}

/// The node's count of ops applied since it started (`dagfold_applied_total`
/// in its `/metrics`).
fn metrics_applied(admin: SocketAddr) -> Option<u64> {
    let (code, body) = dagfold::testkit::http_get(admin, "/metrics", Duration::from_secs(5)).ok()?;
    if code != 200 {
        return None;
    }
    body.lines().find_map(|l| l.strip_prefix("dagfold_applied_total ")).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64)
}

fn status(admin: SocketAddr, scope: &Hash) -> Option<serde_json::Value> {
    let (code, body) = dagfold::testkit::http_get(admin, &format!("/v1/scopes/{}", hex::encode(scope)), Duration::from_secs(5)).ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime + stime, in seconds, of a process's or a thread's `stat` line
/// (the fields after the name, which is in parentheses).
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// utime + stime of each thread of a process, in seconds, summed by thread
/// name (the kernel's `comm`, cut at 15 bytes: `dagfold-verifie` for every
/// verifier). A thread that ends between two readings drops out of the
/// second.
fn thread_cpu_seconds(pid: u32) -> Option<std::collections::BTreeMap<String, f64>> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some(open), Some(close), Some(seconds)) = (stat.find('('), stat.rfind(')'), stat_cpu_seconds(&stat)) else { continue };
        *out.entry(stat[open + 1..close].to_string()).or_insert(0.0) += seconds;
    }
    Some(out)
}

/// µs of CPU per op of each thread name between two `thread_cpu_seconds`.
fn thread_cpu_per_op(
    t0: &Option<std::collections::BTreeMap<String, f64>>,
    t1: Option<std::collections::BTreeMap<String, f64>>,
    ops: u64,
) -> Option<serde_json::Value> {
    let (t0, t1) = (t0.as_ref()?, t1?);
    let per_op: serde_json::Map<String, serde_json::Value> = t1
        .into_iter()
        .map(|(name, s)| (s - t0.get(&name).copied().unwrap_or(0.0), name))
        .filter(|(d, _)| *d > 0.0)
        .map(|(d, name)| (name, serde_json::json!((d * 1e6 / ops.max(1) as f64 * 100.0).round() / 100.0)))
        .collect();
    Some(serde_json::Value::Object(per_op))
}

fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn invalid_ops(w: &dagfold::workload::Workload, n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xBAD);
    let data: Vec<&dagfold::workload::Generated> = w.messages.iter().filter(|m| m.is_data).collect();
    let stranger = Member { seed: rng.gen(), public_key: [0; 32] };
    let stranger = Member { public_key: sig::public_key_from_seed(&stranger.seed), seed: stranger.seed };
    (0..n)
        .map(|i| {
            let base = data[rng.gen_range(0..data.len())];
            let Message::Op(mut op) = dagfold::core::decode_frame(&base.frame)
                .map(|d| match d {
                    dagfold::core::Decoded::Op { op, .. } => Message::Op(op),
                    dagfold::core::Decoded::Key(k) => Message::Key(k),
                })
                .unwrap()
            else {
                unreachable!()
            };
            op.hlc += 1 + i as u64;
            match i % 3 {
                0 => {
                    // Bad signature.
                    let (mut frame, _) = sign_op(&mut op, &w.writers[0]);
                    let last = frame.len() - 1;
                    frame[last] ^= 1;
                    frame
                }
                1 => sign_op(&mut op, &stranger).0, // unauthorized
                _ => {
                    op.key_id = key_id_of(&rng.gen::<[u8; 32]>()); // stale_key
                    sign_op(&mut op, &w.writers[0]).0
                }
            }
        })
        .collect()
}

fn run(a: RunArgs) -> anyhow::Result<serde_json::Value> {
    let (code, body) = dagfold::testkit::http_get(a.to.admin, "/v1/identity", Duration::from_secs(5))
        .map_err(|e| anyhow!("cannot reach the node's status at {}: {e}", a.to.admin))?;
    if code != 200 {
        return Err(anyhow!("/v1/identity answered {code}"));
    }
    let idv: serde_json::Value = serde_json::from_str(&body)?;
    let h = |k: &str| -> [u8; 32] { parse_hash_hex(idv[k].as_str().unwrap()).unwrap() };
    let (node_pk, node_kem) = (h("public_key"), h("kem_public_key"));
    let scopes = a.scopes.max(1);
    if scopes > 1 && (a.reverse || a.shuffle_window > 1 || a.invalid > 0.0) {
        return Err(anyhow!("--reverse, --shuffle-window and --invalid take one scope"));
    }
    if !a.ops.is_multiple_of(scopes) {
        return Err(anyhow!("--ops {} is not a multiple of --scopes {scopes}", a.ops));
    }
    if a.view_lag.is_none() && !a.chain && !(1..=32).contains(&a.writers) {
        return Err(anyhow!("--writers {} takes --view-lag (without it, 1..=32 writers)", a.writers));
    }
    eprintln!("loadgen: generating {} ops in {scopes} scope(s) (signing and encrypting before the timed phase)", a.ops);
    let t_gen = Instant::now();
    let cfg = |seed: u64| WorkloadConfig {
        seed,
        writers: if a.chain { 1 } else { a.writers },
        data_ops: a.ops / scopes,
        actions_per_op: a.actions_per_op,
        value_bytes: a.value_bytes,
        merge_share: a.merge_share,
        events_per_op: a.events_per_op,
        keys_per_entity: a.keys_per_entity,
        rotate_at: None,
        chain: a.chain,
        remove_writer_at: None,
        view_lag: a.view_lag,
    };
    // Scope i of many from its own seed, on every core (this is before the
    // timed phase).
    let seed_of = |i: usize| if scopes == 1 { a.seed } else { a.seed.wrapping_mul(1_000_003).wrapping_add(i as u64) };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(scopes);
    let mut ws: Vec<dagfold::workload::Workload> = std::thread::scope(|t| {
        let parts: Vec<_> = (0..threads)
            .map(|k| {
                let cfg = &cfg;
                t.spawn(move || (k..scopes).step_by(threads).map(|i| (i, generate(&cfg(seed_of(i)), node_pk, node_kem))).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<_> = parts.into_iter().flat_map(|p| p.join().expect("generator thread")).collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, w)| w).collect()
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0xD0B);
    let expected_applied = ws.iter().flat_map(|w| &w.messages).filter(|m| m.id != ZERO).count() as u64;
    let invalid = invalid_ops(&ws[0], (a.ops as f64 * a.invalid) as usize, a.seed);
    // What is sent before the timed stream (one scope: its genesis, members
    // and key delivery), the timed frames, and what counts: one scope's data
    // ops (the node's count less `base`), or every op of many scopes.
    let (prefix, mut data, counted): (Vec<Vec<u8>>, Vec<Vec<u8>>, u64) = if scopes == 1 {
        // The frames are moved, not copied (10^7 ops are ~4 GB of them).
        let (prefix, data): (Vec<_>, Vec<_>) = std::mem::take(&mut ws[0].messages).into_iter().partition(|m| !m.is_data);
        let prefix = prefix.into_iter().map(|m| m.frame).collect();
        let mut data: Vec<Vec<u8>> = data.into_iter().map(|m| m.frame).collect();
        if a.reverse {
            data.reverse();
        }
        if a.shuffle_window > 1 {
            let order = shuffle_within_windows(data.len(), a.shuffle_window, a.seed);
            data = order.into_iter().map(|i| std::mem::take(&mut data[i])).collect();
        }
        (prefix, data, a.ops as u64)
    } else {
        // One ticket per message, shuffled: the k-th ticket of scope s
        // stands for s's k-th message, so each scope stays in order.
        let mut tickets: Vec<u32> = ws.iter().enumerate().flat_map(|(s, w)| std::iter::repeat_n(s as u32, w.messages.len())).collect();
        for i in (1..tickets.len()).rev() {
            tickets.swap(i, rng.gen_range(0..=i));
        }
        let mut next = vec![0usize; scopes];
        let data = tickets
            .into_iter()
            .map(|s| {
                let k = &mut next[s as usize];
                *k += 1;
                std::mem::take(&mut ws[s as usize].messages[*k - 1].frame)
            })
            .collect();
        (Vec::new(), data, expected_applied)
    };
    let dups = (data.len() as f64 * a.duplicates) as usize;
    let mut extra: Vec<Vec<u8>> = (0..dups).map(|_| data[rng.gen_range(0..data.len())].clone()).collect();
    extra.extend(invalid);
    for f in extra {
        let at = rng.gen_range(0..=data.len());
        data.insert(at.min(data.len()), f);
    }
    eprintln!("loadgen: generated in {:.1} s; sending {} frames", t_gen.elapsed().as_secs_f64(), data.len() + prefix.len());
    // The generator threads' memory, freed, is given back now: left to the
    // allocator's purge delay, the sender's first allocations purged it
    // inside the timed phase, 15–20 ms in one madvise while the node sat
    // idle (`perf sched`), and every frame written before it waited too.
    dagfold::idle::collect_now();
    // The node's applied count: the scope's status, or with many scopes
    // the node's total (a fresh node: every op it applied is one of ours).
    let applied_now = |admin: SocketAddr| -> Option<u64> {
        if scopes == 1 {
            status(admin, &ws[0].scope)?["applied"].as_u64()
        } else {
            metrics_applied(admin)
        }
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let cpu0 = a.node_pid.and_then(cpu_seconds);
    let threads0 = a.node_pid.and_then(thread_cpu_seconds);
    let own_cpu0 = cpu_seconds(std::process::id());
    let lanes = a.connections.max(1) * a.streams.max(1);
    let sent = Arc::new(AtomicU64::new(0));
    // Send times of data frames by position (for latency), ms since t0.
    let n_data = data.len();
    let send_ms: Arc<Vec<AtomicU64>> = Arc::new((0..n_data).map(|_| AtomicU64::new(u64::MAX)).collect());
    let t0 = Instant::now();
    let result = rt.block_on(async {
        let (endpoint, ncfg, cert, peer) = a.to.dialing()?;
        let first = dagfold::net::connect_peer(&endpoint, &ncfg, cert.as_ref(), &peer).await?;
        dagfold::net::send_frames_uni(&first, &prefix).await?;
        let mut conns = vec![first];
        for _ in 1..a.connections.max(1) {
            conns.push(dagfold::net::connect_peer(&endpoint, &ncfg, cert.as_ref(), &peer).await?);
        }
        let data = Arc::new(data);
        let mut tasks = Vec::new();
        for lane in 0..lanes {
            let conn = conns[lane % conns.len()].clone();
            let data = data.clone();
            let sent = sent.clone();
            let send_ms = send_ms.clone();
            let rate = a.rate;
            tasks.push(tokio::spawn(async move {
                let mut s = conn.open_uni().await?;
                let start = Instant::now();
                let mut k = 0u64;
                // Each author's ops go on one lane, in order: a causal
                // stream stays causal per writer at the node.
                let mine: Vec<usize> = (0..data.len()).filter(|i| lane_of(&data[*i], lanes) == lane).collect();
                // The lane's share of the rate.
                let rate_per_lane = if rate == 0 { 0.0 } else { rate as f64 * mine.len() as f64 / data.len().max(1) as f64 };
                // Frames that are due go out together, up to COALESCE_BYTES
                // a write: at full speed that is one write per ~200 ops, not
                // two per op, so the sender's cost stays far below the node's.
                let due_at = |k: u64| Duration::from_secs_f64(k as f64 / rate_per_lane);
                let mut buf: Vec<u8> = Vec::with_capacity(COALESCE_BYTES + 4096);
                let mut batch: Vec<usize> = Vec::new();
                // At a set rate: how late each frame went out after it was due.
                let mut late_us: Vec<u64> = Vec::new();
                let mut next = mine.into_iter().peekable();
                while next.peek().is_some() {
                    if rate_per_lane > 0.0 {
                        let el = start.elapsed();
                        if due_at(k) > el {
                            tokio::time::sleep(due_at(k) - el).await;
                        }
                    }
                    let el = start.elapsed();
                    while let Some(&i) = next.peek() {
                        if buf.len() >= COALESCE_BYTES || (rate_per_lane > 0.0 && due_at(k) > el) {
                            break;
                        }
                        buf.extend_from_slice(&(data[i].len() as u32).to_le_bytes());
                        buf.extend_from_slice(&data[i]);
                        batch.push(i);
                        next.next();
                        if rate_per_lane > 0.0 {
                            late_us.push(el.saturating_sub(due_at(k)).as_micros() as u64);
                        }
                        k += 1;
                    }
                    let now_us = t0.elapsed().as_micros() as u64;
                    for &i in &batch {
                        send_ms[i].store(now_us, Ordering::Relaxed);
                    }
                    s.write_all(&buf).await?;
                    sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    buf.clear();
                    batch.clear();
                }
                s.finish()?;
                let _ = s.stopped().await;
                Ok::<Vec<u64>, anyhow::Error>(late_us)
            }));
        }
        // Sample the node's applied count while sending.
        let mut samples: Vec<(u64, u64)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
        let mut last_print = Instant::now();
        let mut peak_rss_kb = 0u64;
        let mut rss_series: Vec<u64> = Vec::new();
        let base = prefix.iter().filter(|f| f.first() == Some(&MESSAGE_OP)).count() as u64;
        let mut request_us: Vec<u64> = Vec::new();
        loop {
            let t_req = Instant::now();
            let applied = tokio::task::block_in_place(|| applied_now(a.to.admin)).unwrap_or(0);
            request_us.push(t_req.elapsed().as_micros() as u64);
            samples.push((t0.elapsed().as_micros() as u64, applied.saturating_sub(base)));
            if let Some(pid) = a.node_pid {
                let rss = proc_status_kb(pid, "VmRSS:").unwrap_or(0);
                peak_rss_kb = peak_rss_kb.max(rss);
                rss_series.push(rss);
            }
            if last_print.elapsed() > Duration::from_secs(1) {
                last_print = Instant::now();
                eprintln!(
                    "loadgen: {:>6.1} s  sent {:>9}  applied {:>9}/{}",
                    t0.elapsed().as_secs_f64(),
                    sent.load(Ordering::Relaxed),
                    applied,
                    expected_applied
                );
            }
            if applied >= expected_applied {
                break;
            }
            if Instant::now() > deadline {
                return Err(anyhow!("timed out with {applied}/{expected_applied} applied"));
            }
            tokio::time::sleep(Duration::from_millis(a.sample_ms)).await;
        };
        let mut late_us: Vec<u64> = Vec::new();
        for t in tasks {
            late_us.extend(t.await??);
        }
        Ok::<_, anyhow::Error>((samples, peak_rss_kb, rss_series, request_us, late_us))
    });
    let elapsed = t0.elapsed();
    // The CPU of the timed phase, read before the root checks below: with
    // many scopes those are as many HTTP requests, which are not the
    // workload's.
    let (cpu1, threads1, own_cpu1) = (a.node_pid.and_then(cpu_seconds), a.node_pid.and_then(thread_cpu_seconds), cpu_seconds(std::process::id()));
    let (samples, peak_rss_kb, rss_series, request_us, late_us) = result?;
    // Every scope's root against the fold of its ops (after the timed phase).
    let (mut applied, mut wrong_roots) = (0u64, Vec::new());
    for w in &ws {
        let st = status(a.to.admin, &w.scope).with_context(|| format!("no status for scope {}", hex::encode(w.scope)))?;
        applied += st["applied"].as_u64().unwrap_or(0);
        if st["root"] != hex::encode(w.final_root) {
            wrong_roots.push(format!("scope {}: node {} vs fold {}", hex::encode(w.scope), st["root"], hex::encode(w.final_root)));
        }
    }
    let root_ok = wrong_roots.is_empty();
    // Latency: the i-th data frame (in send order) counts as applied at the
    // first sample whose applied count exceeds its position. Exact for
    // causal order; for other orders it is the time until as many ops as
    // were sent up to it were applied.
    let mut order: Vec<(u64, usize)> = (0..n_data).map(|i| (send_ms[i].load(Ordering::Relaxed), i)).collect();
    order.sort();
    let mut lat: Vec<f64> = Vec::with_capacity(n_data);
    let mut s = 0;
    let valid_data = counted;
    for (rank, (sent_us, _)) in order.iter().enumerate() {
        let target = applied_by(rank as u64 + 1, valid_data, n_data);
        while s < samples.len() && samples[s].1 < target {
            s += 1;
        }
        let applied_us = samples.get(s).map(|x| x.0).unwrap_or(elapsed.as_micros() as u64);
        lat.push(applied_us.saturating_sub(*sent_us) as f64 / 1000.0);
    }
    // The longest the applied count stood still while sent ops waited: one
    // such stall longer than the p99 target decides the p99 of a short run.
    let (stall_ms, stall_at_s) = longest_stall(&samples, &order, valid_data);
    if let Some(path) = &a.latency_windows {
        std::fs::write(path, latency_windows(&order, &lat)).with_context(|| format!("writing {}", path.display()))?;
    }
    lat.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0.0);
    // Cores used over the timed phase, from CPU seconds before and after.
    let cores = |c0: Option<f64>, c1: Option<f64>| Some((c1? - c0?) / elapsed.as_secs_f64());
    let cpu = cores(cpu0, cpu1);
    // Where the node's CPU went over the timed phase, by thread (its stages).
    let thread_cpu = thread_cpu_per_op(&threads0, threads1, counted);
    // The sender shares the machine with the node: what it takes of it.
    let own_cpu = cores(own_cpu0, own_cpu1);
    let disk = a.data_dir.as_deref().map(dagfold::store::dir_bytes);
    let rss_tail_flat = if rss_series.len() > 10 {
        let half = &rss_series[rss_series.len() / 2..];
        let (mn, mx) = (half.iter().min().unwrap(), half.iter().max().unwrap());
        Some(*mx as f64 / (*mn).max(1) as f64)
    } else {
        None
    };
    let report = serde_json::json!({
        "name": a.name,
        "ops": counted,
        "scopes": scopes,
        "writers": a.writers,
        "frames_sent": n_data + prefix.len(),
        "seconds": elapsed.as_secs_f64(),
        "ops_per_s": counted as f64 / elapsed.as_secs_f64(),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "root_ok": root_ok,
        "node_cpu_cores": cpu,
        "node_thread_cpu_us_per_op": thread_cpu,
        "loadgen_cpu_cores": own_cpu,
        "peak_rss_bytes": a.node_pid.and_then(|p| proc_status_kb(p, "VmHWM:")).map(|k| k * 1024).or(Some(peak_rss_kb * 1024)),
        "rss_second_half_max_over_min": rss_tail_flat,
        "disk_bytes_per_op": disk.map(|d| d as f64 / counted as f64),
        "applied": applied,
        "longest_stall_ms": stall_ms,
        "longest_stall_at_s": stall_at_s,
        "status_requests": request_us.len(),
        "status_request_p99_ms": p99_ms(request_us),
        "send_late_p99_ms": p99_ms(late_us),
    });
    if !root_ok {
        return Err(anyhow!("root mismatch in {} scope(s), first {}; report {report}", wrong_roots.len(), wrong_roots[0]));
    }
    Ok(report)
}

/// The 99th percentile of durations in µs, in ms (0 for none).
fn p99_ms(mut us: Vec<u64>) -> f64 {
    us.sort_unstable();
    us.get(us.len().saturating_sub(1) * 99 / 100).map_or(0.0, |u| *u as f64 / 1000.0)
}

/// How many ops count as due once `sent` of `frames` frames went out, when
/// `valid` of them apply: the frames in send order stand for the applied
/// ops in equal shares (exact in causal order without invalid frames).
fn applied_by(sent: u64, valid: u64, frames: usize) -> u64 {
    (sent * valid).div_ceil(frames.max(1) as u64)
}

/// `lat[j]`, the latency of the `j`-th frame of `order` (by send time,
/// µs), summed up per 50 ms of send time: the window's start (s), its
/// frames, their mean and largest latency (ms), a line each.
fn latency_windows(order: &[(u64, usize)], lat: &[f64]) -> String {
    const WINDOW_US: u64 = 50_000;
    let mut out = String::new();
    let mut j = 0;
    while j < order.len() {
        let w = order[j].0 / WINDOW_US;
        let n = order[j..].iter().take_while(|(t, _)| t / WINDOW_US == w).count();
        let l = &lat[j..j + n];
        let max = l.iter().copied().fold(0.0, f64::max);
        out += &format!("{:.2} {} {:.1} {:.1}\n", (w * WINDOW_US) as f64 / 1e6, n, l.iter().sum::<f64>() / n as f64, max);
        j += n;
    }
    out
}

/// The longest interval between two samples of the applied count with no
/// progress while more had been sent than applied, in ms, and when it began
/// (seconds from the start). `samples`: (µs, applied); `sends`: (µs, frame),
/// sorted; `valid` of the frames apply (as for the latencies).
fn longest_stall(samples: &[(u64, u64)], sends: &[(u64, usize)], valid: u64) -> (f64, f64) {
    let mut best = (0u64, 0u64);
    let mut since: Option<(u64, u64)> = None;
    for &(t, applied) in samples {
        let sent = applied_by(sends.partition_point(|s| s.0 <= t) as u64, valid, sends.len());
        match since {
            Some((t0, a0)) if applied == a0 => {
                if t - t0 > best.0 {
                    best = (t - t0, t0);
                }
            }
            _ => since = (sent > applied).then_some((t, applied)),
        }
    }
    (best.0 as f64 / 1000.0, best.1 as f64 / 1e6)
}

/// Rates of batch verification of 64 signatures by `nkeys` distinct keys.
fn batch_rates(nkeys: usize, seconds: f64) -> serde_json::Value {
    use ed25519_dalek::{Signer, SigningKey};
    let n = 64;
    let keys: Vec<SigningKey> = (0..nkeys).map(|i| SigningKey::from_bytes(&[i as u8 + 1; 32])).collect();
    let msgs: Vec<[u8; 32]> = (0..n).map(|i| dagfold::protocol::crypto::sha256(&[i as u8])).collect();
    let sigs: Vec<ed25519_dalek::Signature> = (0..n).map(|i| keys[i % nkeys].sign(&msgs[i])).collect();
    let vks: Vec<ed25519_dalek::VerifyingKey> = (0..n).map(|i| keys[i % nkeys].verifying_key()).collect();
    // The best of ten slices: on a shared machine noise only ever slows a
    // slice down, so the best one is the nearest to what the core can do,
    // and the ceiling errs high (the ratios to it low), never low.
    let rate = |f: &mut dyn FnMut() -> usize| -> f64 {
        let mut best = 0f64;
        for _ in 0..10 {
            let t = Instant::now();
            let mut count = 0usize;
            while t.elapsed().as_secs_f64() < seconds / 10.0 {
                count += f();
            }
            best = best.max(count as f64 / t.elapsed().as_secs_f64());
        }
        best
    };
    let msg_refs: Vec<&[u8]> = msgs.iter().map(|m| m.as_slice()).collect();
    // Keys parsed inside the timed loop, as a node receiving bytes must.
    let dalek = rate(&mut || {
        let vks: Vec<ed25519_dalek::VerifyingKey> =
            vks.iter().map(|k| ed25519_dalek::VerifyingKey::from_bytes(&k.to_bytes()).unwrap()).collect();
        ed25519_dalek::verify_batch(&msg_refs, &sigs, &vks).unwrap();
        n
    });
    let consensus = rate(&mut || {
        let mut v = ed25519_consensus::batch::Verifier::new();
        for i in 0..n {
            let vk = ed25519_consensus::VerificationKeyBytes::from(vks[i].to_bytes());
            v.queue((vk, ed25519_consensus::Signature::from(sigs[i].to_bytes()), &msgs[i]));
        }
        v.verify(rand::thread_rng()).unwrap();
        n
    });
    // The same batch again and again: its keys come from the node's key
    // cache after the first (as a group's authors' keys do in
    // the node), so it is named for it.
    let items: Vec<([u8; 32], [u8; 32], [u8; 64])> = (0..n).map(|i| (vks[i].to_bytes(), msgs[i], sigs[i].to_bytes())).collect();
    let own = rate(&mut || {
        assert!(sig::verify_batch(&items).iter().all(|v| *v));
        n
    });
    let strict = rate(&mut || {
        for i in 0..8 {
            ed25519_dalek::VerifyingKey::from_bytes(&vks[i].to_bytes()).unwrap().verify_strict(&msgs[i], &sigs[i]).unwrap();
        }
        8
    });
    serde_json::json!({
        "keys_in_batch": nkeys,
        "dalek_verify_batch_64_per_s": dalek,
        "consensus_batch_64_per_s": consensus,
        "own_batch_64_keys_seen_per_s": own,
        "verify_strict_per_s": strict,
    })
}

/// The machine's ceiling: the faster of ed25519-dalek's and
/// ed25519-consensus's batch-64 rate on one core, times the cores, with 64
/// distinct keys per batch (as NUMBERS.md measures it). For reference, also
/// with 4 keys per batch, as the workloads have 4 writers: ed25519-consensus
/// and our verifier merge the terms of one key, so that ceiling is higher.
fn ceiling(cores: u32, seconds: f64) -> serde_json::Value {
    let four = batch_rates(4, seconds);
    let distinct = batch_rates(64, seconds);
    let best = |v: &serde_json::Value| {
        v["dalek_verify_batch_64_per_s"].as_f64().unwrap().max(v["consensus_batch_64_per_s"].as_f64().unwrap())
    };
    serde_json::json!({
        "cores": cores,
        "ceiling_ops_per_s": best(&distinct) * cores as f64,
        "ceiling_four_keys_ops_per_s": best(&four) * cores as f64,
        "four_keys": four,
        "distinct_keys": distinct,
    })
}

/// The file's frames, split into the non-data prefix (genesis, governance,
/// key deliveries: always resent, they are few) and the data ops with their
/// ids and parents.
struct FramesFile {
    prefix: Vec<Vec<u8>>,
    data: Vec<(Hash, Vec<Hash>, Vec<u8>)>,
    /// Distinct ops (genesis and governance included): `applied` when done.
    ops: u64,
}

fn read_frames_file(path: &std::path::Path) -> anyhow::Result<FramesFile> {
    let f = std::fs::File::open(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let mut r = dagfold::durable::FileFrames::new(std::io::BufReader::new(f));
    let (mut prefix, mut data) = (Vec::new(), Vec::new());
    let mut ids = std::collections::HashSet::new();
    while let Some(item) = r.next_frame()? {
        let dagfold::durable::FrameItem::Frame(frame) = item else { return Err(anyhow!("oversized frame in the file")) };
        match dagfold::core::decode_frame(&frame) {
            Ok(dagfold::core::Decoded::Op { id, op, .. }) => {
                ids.insert(id);
                if op.plane == PLANE_DATA {
                    data.push((id, op.parents.clone(), frame));
                } else {
                    prefix.push(frame);
                }
            }
            Ok(dagfold::core::Decoded::Key(_)) | Err(_) => prefix.push(frame),
        }
    }
    Ok(FramesFile { prefix, data, ops: ids.len() as u64 })
}

/// Index of the first data op (in sending order) that is not an ancestor of
/// (or one of) the node's data heads: everything before it is applied, as
/// the applied set is closed under ancestry.
fn first_unapplied(file: &FramesFile, index: &std::collections::HashMap<Hash, usize>, status: Option<&serde_json::Value>) -> usize {
    let Some(st) = status else { return 0 };
    let heads: Vec<Hash> = st["data_heads"]
        .as_array()
        .map(|a| a.iter().filter_map(|h| parse_hash_hex(h.as_str()?)).collect())
        .unwrap_or_default();
    let mut covered = vec![false; file.data.len()];
    let mut work: Vec<usize> = heads.iter().filter_map(|h| index.get(h).copied()).collect();
    while let Some(i) = work.pop() {
        if std::mem::replace(&mut covered[i], true) {
            continue;
        }
        work.extend(file.data[i].1.iter().filter_map(|p| index.get(p).copied()));
    }
    covered.iter().position(|c| !c).unwrap_or(file.data.len())
}

fn send(a: SendArgs) -> anyhow::Result<serde_json::Value> {
    let mut file = read_frames_file(&a.file)?;
    if a.shuffle_window > 1 {
        let order = shuffle_within_windows(file.data.len(), a.shuffle_window, a.seed);
        let mut data: Vec<Option<(Hash, Vec<Hash>, Vec<u8>)>> = std::mem::take(&mut file.data).into_iter().map(Some).collect();
        file.data = order.into_iter().map(|i| data[i].take().expect("a permutation")).collect();
    }
    let index: std::collections::HashMap<Hash, usize> = file.data.iter().enumerate().map(|(i, d)| (d.0, i)).collect();
    let h = |s: &str| -> anyhow::Result<Hash> { parse_hash_hex(s).ok_or_else(|| anyhow!("not 64 hex characters: {s:?}")) };
    let scope = a.scope.as_deref().map(h).transpose()?;
    let root = a.root.as_deref().map(h).transpose()?;
    let target = match (scope, root) {
        (Some(s), Some(r)) => Some((s, r)),
        (None, None) => None,
        _ => return Err(anyhow!("--scope and --root go together")),
    };
    let want_ops = file.ops;
    let done = |st: &Option<serde_json::Value>| -> bool {
        let (Some((_, r)), Some(st)) = (target, st) else { return false };
        st["root"] == hex::encode(r) && st["applied"].as_u64() == Some(want_ops)
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(a.timeout_s);
    let (mut attempts, mut lost, mut resends, mut frames_sent) = (0u64, 0u64, 0u64, 0u64);
    let mut last_error: Option<String> = None;
    let mut final_status = None;
    let total_frames = file.prefix.len() + file.data.len();
    let file = Arc::new(file);
    rt.block_on(async {
        let (endpoint, ncfg, cert, peer) = a.to.dialing()?;
        let (ncfg, cert) = (Arc::new(ncfg), Arc::new(cert));
        loop {
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "timed out after {attempts} attempts; last error: {last_error:?}; status: {final_status:?}"
                ));
            }
            let st = match target {
                Some((s, _)) => tokio::task::block_in_place(|| status(a.to.admin, &s)),
                None => None,
            };
            if done(&st) {
                final_status = st;
                return Ok(());
            }
            let start = if target.is_some() { first_unapplied(&file, &index, st.as_ref()) } else { 0 };
            attempts += 1;
            if attempts > 1 {
                resends += 1;
            }
            let sent = Arc::new(AtomicU64::new(0));
            let attempt = {
                let file = file.clone();
                let sent = sent.clone();
                let (endpoint, ncfg, cert) = (endpoint.clone(), ncfg.clone(), cert.clone());
                let (rate, streams) = (a.rate, a.streams.max(1));
                async move {
                    let conn = dagfold::net::connect_peer(&endpoint, &ncfg, cert.as_ref().as_ref(), &peer).await?;
                    dagfold::net::send_frames_uni(&conn, &file.prefix).await?;
                    sent.fetch_add(file.prefix.len() as u64, Ordering::Relaxed);
                    let mut tasks = Vec::new();
                    for lane in 0..streams {
                        let (conn, file, sent) = (conn.clone(), file.clone(), sent.clone());
                        tasks.push(tokio::spawn(async move {
                            let mut s = conn.open_uni().await?;
                            let per_lane = if rate == 0 { 0.0 } else { rate as f64 / streams as f64 };
                            let began = Instant::now();
                            let mut k = 0u64;
                            let mut i = start + lane;
                            while i < file.data.len() {
                                if per_lane > 0.0 {
                                    let due = Duration::from_secs_f64(k as f64 / per_lane);
                                    let el = began.elapsed();
                                    if due > el {
                                        tokio::time::sleep(due - el).await;
                                    }
                                }
                                dagfold::net::write_frame(&mut s, &file.data[i].2).await?;
                                sent.fetch_add(1, Ordering::Relaxed);
                                k += 1;
                                i += streams;
                            }
                            s.finish()?;
                            match s.stopped().await {
                                Ok(None) => Ok(()),
                                Ok(Some(code)) => Err(anyhow!("stream stopped by the node with code {code}")),
                                Err(e) => Err(anyhow!("not acknowledged: {e}")),
                            }
                        }));
                    }
                    for t in tasks {
                        t.await??;
                    }
                    conn.close(0u32.into(), b"sent");
                    Ok::<(), anyhow::Error>(())
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let result = match tokio::time::timeout(left, attempt).await {
                Ok(r) => r,
                Err(_) => Err(anyhow!("attempt timed out")),
            };
            frames_sent += sent.load(Ordering::Relaxed);
            if let Err(e) = result {
                lost += 1;
                eprintln!("loadgen send: attempt {attempts} from data op {start} failed ({e}); retrying");
                last_error = Some(e.to_string());
                tokio::time::sleep(Duration::from_millis(a.retry_ms)).await;
                continue;
            }
            let Some((s, _)) = target else { return Ok(()) };
            // Sent and acknowledged: wait while the node makes progress.
            let mut last_applied = None;
            let mut last_change = Instant::now();
            loop {
                let st = tokio::task::block_in_place(|| status(a.to.admin, &s));
                if done(&st) {
                    final_status = st;
                    return Ok(());
                }
                let applied = st.as_ref().and_then(|v| v["applied"].as_u64());
                if applied != last_applied {
                    last_applied = applied;
                    last_change = Instant::now();
                }
                if last_change.elapsed() > Duration::from_millis(a.settle_ms) || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "name": a.name,
        "frames": total_frames,
        "ops": file.ops,
        "attempts": attempts,
        "connections_lost": lost,
        "resends": resends,
        "frames_sent": frames_sent,
        "seconds": seconds,
        "ops_per_s": file.data.len() as f64 / seconds,
        "root_ok": target.is_some().then_some(true),
        "applied": final_status.as_ref().map(|s| s["applied"].clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::latency_windows;

    #[test]
    fn latencies_are_summed_up_per_50_ms_of_send_time() {
        // Sent at 0, 10 and 49.999 ms (one window), then 120 ms (the third;
        // the second has no frame, so no line).
        let order = [(0, 3), (10_000, 0), (49_999, 1), (120_000, 2)];
        let lat = [4.0, 2.0, 9.0, 1.5];
        assert_eq!(latency_windows(&order, &lat), "0.00 3 5.0 9.0\n0.10 1 1.5 1.5\n");
        assert_eq!(latency_windows(&[], &[]), "");
    }
}
