//! Partitions. `--nodes` nodes on loopback, each with every other as a
//! peer, every directed link through a UDP relay of this process
//! ([`Relay`]: node a dials node b at the relay's address, the relay
//! forwards both ways, one upstream socket per client address), so a link
//! can be cut and healed: all of a's datagrams towards b dropped (on a's
//! connection to b and on b's connection to a), or b's towards a, or both.
//! A seeded schedule of faults (a pair cut, a one-way cut, a node isolated,
//! a node that hears but is not heard, a split in two), each held for a
//! seeded time, some past the QUIC idle timeout so that connections die
//! and are redialed, and then until it has dropped a datagram; faults
//! overlap (each is healed one or two rounds later). The load, `--scopes` scopes of the deterministic workload, goes
//! in directly (never through a relay) while the faults hold: each scope's
//! genesis and governance at one node, its data ops each at a seeded node
//! in seeded rounds, so a scope's ops are spread over nodes on both sides
//! of a cut; every node gets its key deliveries first.
//!
//! After the last heal, the campaign polls (bounded) until every node
//! holds every scope at the generator's root and applied count, then
//! checks that every node has every scope with the same root, heads and
//! applied count as the generator's and as every other node's. The report:
//! scopes, ops, faults and directed-link cuts by kind, heals, datagrams
//! dropped (each fault must have dropped some: the fault landed), the time
//! to converge after the last heal, and the scopes that diverged (0).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use dagfold::protocol::crypto::seal_key_delivery;
use dagfold::protocol::{encode, Message, ZERO};
use dagfold::workload::{generate, Workload, WorkloadConfig};
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::check::{identity_from, seed_identity};
use crate::proc::{free_port, loopback, wait_until, Bins, NodeProc};

#[derive(clap::Args, Debug, Clone)]
pub struct PartitionArgs {
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Nodes, each with every other as a peer (at least 3).
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// Scopes of the load.
    #[arg(long, default_value_t = 1000)]
    pub scopes: usize,
    /// Data ops per scope (besides its genesis and one governance op).
    #[arg(long, default_value_t = 8)]
    pub ops_per_scope: usize,
    /// Writers per scope.
    #[arg(long, default_value_t = 3)]
    pub writers: usize,
    /// Faults of the schedule (the load is spread over them: one round each).
    #[arg(long, default_value_t = 20)]
    pub cuts: usize,
    /// How long a round holds, at least and at most (ms; seeded between).
    #[arg(long, default_value_t = 1_000)]
    pub hold_ms_min: u64,
    #[arg(long, default_value_t = 5_000)]
    pub hold_ms_max: u64,
    /// Rounds held `--long-hold-ms` instead: past the QUIC idle timeout
    /// (30 s), so that the connections across the cut die and are redialed.
    #[arg(long, default_value_t = 2)]
    pub long_cuts: usize,
    #[arg(long, default_value_t = 35_000)]
    pub long_hold_ms: u64,
    /// The nodes' `--heartbeat-ms`.
    #[arg(long, default_value_t = 200)]
    pub heartbeat_ms: u64,
    /// Bound on the wait for convergence after the last heal.
    #[arg(long, default_value_t = 600)]
    pub converge_timeout_s: u64,
}

/// Which datagrams each directed node link (a → b, index `a * n + b`)
/// drops now (a count of the faults cutting it), and what it passed and
/// dropped.
struct Net {
    n: usize,
    cut: Vec<AtomicU32>,
    passed: Vec<AtomicU64>,
    dropped: Vec<AtomicU64>,
}

impl Net {
    fn new(n: usize) -> Net {
        Net {
            n,
            cut: (0..n * n).map(|_| AtomicU32::new(0)).collect(),
            passed: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
            dropped: (0..n * n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether a datagram from node `a` towards node `b` goes through
    /// (and counts it).
    fn pass(&self, a: usize, b: usize) -> bool {
        let i = a * self.n + b;
        if self.cut[i].load(Ordering::Acquire) > 0 {
            self.dropped[i].fetch_add(1, Ordering::Relaxed);
            false
        } else {
            self.passed[i].fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    fn dropped_on(&self, links: &[(usize, usize)]) -> u64 {
        links.iter().map(|&(a, b)| self.dropped[a * self.n + b].load(Ordering::Relaxed)).sum()
    }

    fn total(v: &[AtomicU64]) -> u64 {
        v.iter().map(|x| x.load(Ordering::Relaxed)).sum()
    }
}

/// The relay node `from` dials node `to` through: datagrams from a client
/// (node `from`'s endpoint) go to `to` from an upstream socket of that
/// client's own, and what comes back on it goes to the client; each way
/// through `Net::pass`.
struct Relay {
    addr: SocketAddr,
}

impl Relay {
    async fn start(net: Arc<Net>, from: usize, to: usize, target: SocketAddr) -> anyhow::Result<Relay> {
        let listen = Arc::new(tokio::net::UdpSocket::bind("127.0.0.1:0").await?);
        let addr = listen.local_addr()?;
        tokio::spawn(async move {
            let mut upstream: HashMap<SocketAddr, Arc<tokio::net::UdpSocket>> = HashMap::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                // An error here is an ICMP report of an earlier send: not fatal.
                let Ok((len, client)) = listen.recv_from(&mut buf).await else { continue };
                let up = match upstream.get(&client) {
                    Some(u) => u.clone(),
                    None => {
                        let Ok(u) = tokio::net::UdpSocket::bind("127.0.0.1:0").await else { continue };
                        if u.connect(target).await.is_err() {
                            continue;
                        }
                        let u = Arc::new(u);
                        tokio::spawn(back(u.clone(), listen.clone(), client, net.clone(), to, from));
                        upstream.insert(client, u.clone());
                        u
                    }
                };
                if net.pass(from, to) {
                    let _ = up.send(&buf[..len]).await;
                }
            }
        });
        Ok(Relay { addr })
    }
}

/// What node `to` sends back on one client's upstream socket, to the client.
async fn back(up: Arc<tokio::net::UdpSocket>, listen: Arc<tokio::net::UdpSocket>, client: SocketAddr, net: Arc<Net>, to: usize, from: usize) {
    let mut buf = vec![0u8; 65_536];
    loop {
        // Connection refused (the node is down) is reported here: go on.
        let Ok(len) = up.recv(&mut buf).await else { continue };
        if net.pass(to, from) {
            let _ = listen.send_to(&buf[..len], client).await;
        }
    }
}

#[derive(Clone, Debug)]
struct Fault {
    kind: &'static str,
    /// The directed node links it cuts.
    links: Vec<(usize, usize)>,
    /// The round after which it is healed.
    until: usize,
}

/// The seeded schedule: one fault per round, healed after one or two rounds.
fn schedule(n: usize, rounds: usize, rng: &mut rand::rngs::StdRng) -> Vec<Fault> {
    let both = |a: usize, b: usize| vec![(a, b), (b, a)];
    (0..rounds)
        .map(|r| {
            let a = rng.gen_range(0..n);
            let b = (a + rng.gen_range(1..n)) % n;
            let (kind, links) = match rng.gen_range(0..5u32) {
                0 => ("pair", both(a, b)),
                1 => ("one_way", vec![(a, b)]),
                2 => ("isolate", (0..n).filter(|&o| o != a).flat_map(|o| both(a, o)).collect()),
                // a hears everyone and no one hears it.
                3 => ("mute", (0..n).filter(|&o| o != a).map(|o| (a, o)).collect()),
                _ => {
                    // A minority (2 ..= n/2 nodes, a among them; 1 of 3)
                    // against the rest.
                    let size = rng.gen_range((n / 2).min(2)..=n / 2);
                    let mut side = vec![a];
                    while side.len() < size {
                        let o = rng.gen_range(0..n);
                        if !side.contains(&o) {
                            side.push(o);
                        }
                    }
                    let links = side.iter().flat_map(|&x| (0..n).filter(|o| !side.contains(o)).flat_map(move |o| both(x, o))).collect();
                    ("split", links)
                }
            };
            Fault { kind, links, until: r + rng.gen_range(1..=2) }
        })
        .collect()
}

/// A scope of the load: its frames by node and round, and what every node
/// must end with.
struct ScopeLoad {
    w: Workload,
    /// Ops (genesis, governance, data) that every node must apply.
    ops: u64,
}

/// Sends each node its frames, in order, on one connection and stream
/// each, all nodes at once.
async fn send_all(endpoint: &quinn::Endpoint, listens: &[SocketAddr], per_node: Vec<Vec<Vec<u8>>>) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for (i, frames) in per_node.into_iter().enumerate() {
        if frames.is_empty() {
            continue;
        }
        let (endpoint, addr) = (endpoint.clone(), listens[i]);
        tasks.push(tokio::spawn(async move {
            let conn = tokio::time::timeout(Duration::from_secs(30), dagfold::net::connect(&endpoint, addr))
                .await
                .map_err(|_| anyhow!("connecting to node {i}: timed out"))?
                .map_err(|e| anyhow!("connecting to node {i}: {e}"))?;
            tokio::time::timeout(Duration::from_secs(300), dagfold::net::send_frames_uni(&conn, frames))
                .await
                .map_err(|_| anyhow!("sending to node {i}: timed out"))?
                .map_err(|e| anyhow!("sending to node {i}: {e}"))?;
            conn.close(0u32.into(), b"done");
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// A node's status of a scope, reduced to what must agree: root, sorted
/// heads, applied count.
fn state_of(v: &serde_json::Value) -> Option<(String, Vec<String>, Vec<String>, u64)> {
    let sorted = |k: &str| -> Option<Vec<String>> {
        let mut h: Vec<String> = v[k].as_array()?.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect();
        h.sort();
        Some(h)
    };
    Some((v["root"].as_str()?.to_owned(), sorted("data_heads")?, sorted("governance_heads")?, v["applied"].as_u64()?))
}

pub fn run(a: &PartitionArgs, bins: &Bins, work: &Path) -> anyhow::Result<serde_json::Value> {
    let n = a.nodes;
    if n < 3 {
        return Err(anyhow!("--nodes takes at least 3"));
    }
    if a.cuts == 0 || a.hold_ms_min > a.hold_ms_max {
        return Err(anyhow!("--cuts takes at least 1, and --hold-ms-min at most --hold-ms-max"));
    }
    let t_all = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let rounds = a.cuts;
    let faults = schedule(n, rounds, &mut rng);
    let holds: Vec<u64> = (0..rounds).map(|_| rng.gen_range(a.hold_ms_min..=a.hold_ms_max)).collect();
    let mut long = vec![false; rounds];
    for _ in 0..a.long_cuts.min(rounds) {
        loop {
            let r = rng.gen_range(0..rounds);
            if !long[r] {
                long[r] = true;
                break;
            }
        }
    }
    let rerun = format!(
        "tools/partition-campaign --seed {} --nodes {n} --scopes {} --ops-per-scope {} --writers {} --cuts {} --hold-ms-min {} --hold-ms-max {} --long-cuts {} --long-hold-ms {} --heartbeat-ms {}",
        a.seed, a.scopes, a.ops_per_scope, a.writers, a.cuts, a.hold_ms_min, a.hold_ms_max, a.long_cuts, a.long_hold_ms, a.heartbeat_ms
    );
    eprintln!("partition: seed {}; rerun with: {rerun}", a.seed);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let net = Arc::new(Net::new(n));
    let ids: Vec<dagfold::core::Identity> = (0..n).map(|i| identity_from(a.seed, &format!("partition-node-{i}"))).collect();
    let listens: Vec<SocketAddr> = (0..n).map(|_| loopback(free_port())).collect();
    // relays[i][j]: where node i dials node j.
    let mut relays: Vec<Vec<Option<Relay>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            relays[i][j] = Some(rt.block_on(Relay::start(net.clone(), i, j, listens[j]))?);
        }
    }
    let mut nodes = Vec::new();
    for i in 0..n {
        let dir = work.join(format!("node{i}"));
        seed_identity(&dir, &ids[i])?;
        let mut extra = vec!["--heartbeat-ms".to_string(), a.heartbeat_ms.to_string()];
        for j in (0..n).filter(|&j| j != i) {
            let relay = relays[i][j].as_ref().unwrap();
            extra.extend(["--peer".to_string(), format!("{}@{}", hex::encode(ids[j].public_key), relay.addr)]);
        }
        let log = work.join(format!("node{i}.log"));
        let mut node = NodeProc::at(&format!("node{i}"), &bins.dagfold, &dir, &log, listens[i], loopback(free_port()), &extra);
        node.start(Duration::from_secs(60))?;
        nodes.push(node);
    }

    // The load: each scope's genesis and governance at one node in round 0,
    // its data ops each at a seeded node in seeded rounds (in causal order).
    let t_gen = Instant::now();
    let mut loads = Vec::with_capacity(a.scopes);
    // per_round[r][node]: frames in order.
    let mut per_round: Vec<Vec<Vec<Vec<u8>>>> = vec![vec![Vec::new(); n]; rounds];
    let mut keys: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
    for s in 0..a.scopes {
        let cfg = WorkloadConfig {
            seed: a.seed.wrapping_mul(1_000_003).wrapping_add(s as u64),
            writers: a.writers,
            data_ops: a.ops_per_scope,
            merge_share: 0.5,
            events_per_op: 0,
            ..Default::default()
        };
        let w = generate(&cfg, ids[0].public_key, ids[0].kem_public);
        for (i, id) in ids.iter().enumerate() {
            for (k, key) in w.keys.iter().enumerate() {
                let kd = seal_key_delivery(w.scope, key, id.public_key, &id.kem_public, &[k as u8 + 1; 32]);
                keys[i].push(encode(&Message::Key(kd)));
            }
        }
        let home = rng.gen_range(0..n);
        let mut data_rounds: Vec<usize> = (0..a.ops_per_scope).map(|_| rng.gen_range(0..rounds)).collect();
        data_rounds.sort();
        let mut d = 0;
        for m in w.messages.iter().filter(|m| m.id != ZERO) {
            if m.is_data {
                per_round[data_rounds[d]][rng.gen_range(0..n)].push(m.frame.clone());
                d += 1;
            } else {
                per_round[0][home].push(m.frame.clone());
            }
        }
        let ops = w.messages.iter().filter(|m| m.id != ZERO).count() as u64;
        loads.push(ScopeLoad { w, ops });
    }
    let total_ops: u64 = loads.iter().map(|l| l.ops).sum();
    eprintln!("partition: {} scopes, {total_ops} ops generated in {:.1}s", a.scopes, t_gen.elapsed().as_secs_f64());

    let endpoint = rt.block_on(async { dagfold::net::client_endpoint("127.0.0.1:0".parse().unwrap(), &dagfold::net::ServerConfig::default()) })?;
    rt.block_on(send_all(&endpoint, &listens, keys))?;

    // The rounds.
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    let mut active: Vec<(usize, u64)> = Vec::new(); // (fault, dropped at its start)
    let mut fault_reports = Vec::new();
    let mut heals = 0u64;
    let mut link_cuts = 0u64;
    // Time faults were held past their schedule, until they dropped a datagram.
    let mut extended_ms = 0u64;
    let mut problems: Vec<String> = Vec::new();
    let heal = |f: usize, at_start: u64, heals: &mut u64, fault_reports: &mut Vec<serde_json::Value>, problems: &mut Vec<String>| {
        let fault = &faults[f];
        let dropped = net.dropped_on(&fault.links) - at_start;
        for &(x, y) in &fault.links {
            net.cut[x * n + y].fetch_sub(1, Ordering::AcqRel);
        }
        *heals += 1;
        if dropped == 0 {
            problems.push(format!("fault {f} ({}) dropped no datagram: it did not land", fault.kind));
        }
        fault_reports.push(json!({"fault": f, "kind": fault.kind, "links": fault.links, "dropped": dropped}));
    };
    let t_load = Instant::now();
    for r in 0..rounds {
        // Heal what ends before this round.
        let mut k = 0;
        while k < active.len() {
            let (f, at) = active[k];
            if faults[f].until <= r {
                heal(f, at, &mut heals, &mut fault_reports, &mut problems);
                active.remove(k);
            } else {
                k += 1;
            }
        }
        let fault = &faults[r];
        let at_start = net.dropped_on(&fault.links);
        for &(x, y) in &fault.links {
            net.cut[x * n + y].fetch_add(1, Ordering::AcqRel);
        }
        link_cuts += fault.links.len() as u64;
        *kinds.entry(fault.kind).or_default() += 1;
        active.push((r, at_start));
        let hold = Duration::from_millis(if long[r] { a.long_hold_ms } else { holds[r] });
        let started = Instant::now();
        let frames: usize = per_round[r].iter().map(Vec::len).sum();
        eprintln!("partition: round {r}: {} {:?} for {:?}, {frames} frames", fault.kind, fault.links, hold);
        rt.block_on(send_all(&endpoint, &listens, std::mem::take(&mut per_round[r])))?;
        // The schedule holds the fault for its time (not a wait for a
        // condition: the nodes go on under it), and then until it dropped a
        // datagram (bounded): a link can be quiet for seconds after a cut,
        // its QUIC probe timeout backed off, and a fault that dropped
        // nothing tested nothing.
        std::thread::sleep(hold.saturating_sub(started.elapsed()));
        let held = Instant::now();
        wait_until(Duration::from_secs(30), || net.dropped_on(&fault.links) > at_start);
        extended_ms += held.elapsed().as_millis() as u64;
        for (i, node) in nodes.iter_mut().enumerate() {
            if !node.alive() {
                return Err(anyhow!("node {i} exited during round {r}; log tail:\n{}", node.log_tail(12)));
            }
        }
    }
    for (f, at) in std::mem::take(&mut active) {
        heal(f, at, &mut heals, &mut fault_reports, &mut problems);
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let last_heal = Instant::now();
    eprintln!("partition: all healed after {load_s:.1}s; waiting for convergence");

    // Converged: every node at every scope's root and applied count. Each
    // poll asks only for the (node, scope) pairs not yet there.
    let mut left: Vec<Vec<usize>> = (0..n).map(|_| (0..a.scopes).collect()).collect();
    let converged = wait_until(Duration::from_secs(a.converge_timeout_s), || {
        left = std::thread::scope(|ts| {
            let handles: Vec<_> = nodes
                .iter()
                .zip(left.iter())
                .map(|(node, l)| {
                    let loads = &loads;
                    ts.spawn(move || {
                        l.iter()
                            .copied()
                            .filter(|&s| {
                                let load = &loads[s];
                                !node.scope(&load.w.scope).is_some_and(|v| {
                                    v["root"] == hex::encode(load.w.final_root) && v["applied"].as_u64() == Some(load.ops)
                                })
                            })
                            .collect::<Vec<usize>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
        });
        left.iter().all(Vec::is_empty)
    });
    let converge_s = last_heal.elapsed().as_secs_f64();
    let not_converged: usize = left.iter().map(Vec::len).sum();
    eprintln!("partition: converged: {converged} after {converge_s:.1}s ({not_converged} node-scope pairs left)");
    if !converged {
        problems.push(format!("{not_converged} (node, scope) pairs not at the generator's root and count after {}s", a.converge_timeout_s));
        for (i, l) in left.iter().enumerate() {
            if let Some(&s) = l.first() {
                problems.push(format!("node {i}: {} scopes left, e.g. {} is {:?}", l.len(), hex::encode(loads[s].w.scope), nodes[i].scope(&loads[s].w.scope)));
            }
        }
    }

    // Every node against the generator and against every other node.
    let mut diverged = 0u64;
    let mut missing = 0u64;
    for load in &loads {
        let want_data: Vec<String> = {
            let mut v: Vec<String> = load.w.data_heads.iter().map(hex::encode).collect();
            v.sort();
            v
        };
        let want_gov: Vec<String> = {
            let mut v: Vec<String> = load.w.governance_heads.iter().map(hex::encode).collect();
            v.sort();
            v
        };
        let want = (hex::encode(load.w.final_root), want_data, want_gov, load.ops);
        let states: Vec<Option<_>> = nodes.iter().map(|node| node.scope(&load.w.scope).as_ref().and_then(state_of)).collect();
        missing += states.iter().filter(|s| s.is_none()).count() as u64;
        let agree = states.iter().all(|s| s.as_ref() == Some(&want));
        if !agree {
            diverged += 1;
            if diverged <= 5 {
                problems.push(format!("scope {}: nodes {:?}, generator {:?}", hex::encode(load.w.scope), states, want));
            }
        }
    }
    if diverged > 5 {
        problems.push(format!("... {diverged} scopes differ in all"));
    }

    let metric = |name: &str| -> f64 { nodes.iter().filter_map(|node| node.metric(name)).sum() };
    let figures = json!({
        "sync_requests_sent": metric("dagfold_sync_requests_sent_total"),
        "sync_ops_received": metric("dagfold_sync_ops_received_total"),
        "sync_timeouts": metric("dagfold_sync_timeouts_total"),
        "gossip_dropped": metric("dagfold_gossip_dropped_total"),
        "peer_dial_failures": metric("dagfold_peer_dial_failures_total"),
        "heartbeats_received": metric("dagfold_heartbeats_received_total"),
        "ops_dropped": metric("dagfold_engine_dropped_total"),
    });
    let mut exits = Vec::new();
    for node in nodes.iter_mut() {
        exits.push(node.stop(Duration::from_secs(30)).map(|s| s.to_string()));
    }
    Ok(json!({
        "campaign": "partition",
        "ok": problems.is_empty(),
        "seed": a.seed,
        "rerun": rerun,
        "nodes": n,
        "scopes": a.scopes,
        "ops": total_ops,
        "faults": rounds,
        "faults_by_kind": kinds,
        "long_faults": long.iter().filter(|l| **l).count(),
        "directed_link_cuts": link_cuts,
        "heals": heals,
        "held_past_schedule_s": extended_ms as f64 / 1000.0,
        "datagrams_passed": Net::total(&net.passed),
        "datagrams_dropped": Net::total(&net.dropped),
        "load_s": load_s,
        "converged": converged,
        "converge_after_last_heal_s": converge_s,
        "scopes_diverged": diverged,
        "scope_statuses_missing": missing,
        "node_figures": figures,
        "node_exits": exits,
        "fault_log": fault_reports,
        "total_s": t_all.elapsed().as_secs_f64(),
        "problems": problems,
        "work_dir": work.display().to_string(),
    }))
}
