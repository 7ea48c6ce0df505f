//! `sim`: the seeded multi-node simulation (`dagfold::sim`) over a range of
//! seeds, side by side on `--threads`; every failure is reported with its
//! seed and the command that replays it. No node process, no network: the
//! nodes are engines in this process, on a simulated network and clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use dagfold::sim::{replay_command, SimStats};
use serde_json::json;

#[derive(clap::Args)]
pub struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 10_000)]
    pub seeds: u64,
    /// The first seed (`--from S --seeds N` runs S..S+N).
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Seeds run side by side (each run is one thread and deterministic).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

pub fn run(a: &SimArgs) -> serde_json::Value {
    let started = Instant::now();
    let next = AtomicU64::new(a.from);
    let end = a.from.saturating_add(a.seeds);
    let done = AtomicU64::new(0);
    let total = Mutex::new(SimStats::default());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..a.threads.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= end {
                    return;
                }
                match std::panic::catch_unwind(|| dagfold::sim::run(seed)) {
                    Ok(Ok(stats)) => total.lock().unwrap().add(&stats),
                    Ok(Err(f)) => {
                        eprintln!("dagfold-campaign: {f}");
                        failures.lock().unwrap().push(json!({"seed": seed, "what": f.what, "at_ms": f.at_ms, "replay": f.replay_command()}));
                    }
                    Err(_) => {
                        eprintln!("dagfold-campaign: simulation seed {seed} panicked\nreplay: {}", replay_command(seed));
                        failures.lock().unwrap().push(json!({"seed": seed, "what": "panic", "replay": replay_command(seed)}));
                    }
                }
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if n.is_multiple_of(500) {
                    eprintln!("dagfold-campaign: sim: {n} of {} seeds, {:.1} s", a.seeds, started.elapsed().as_secs_f64());
                }
            });
        }
    });
    let t = total.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    json!({
        "ok": failures.is_empty(),
        "mode": "sim",
        "from": a.from,
        "seeds": a.seeds,
        "threads": a.threads,
        "failures": failures.len(),
        "problems": failures,
        "seconds": (seconds * 10.0).round() / 10.0,
        "nodes": t.nodes,
        "scopes": t.scopes,
        "ops": t.ops,
        "messages_sent": t.messages_sent,
        "messages_delivered": t.messages_delivered,
        "dropped": t.dropped,
        "duplicated": t.duplicated,
        "cut": t.cut,
        "partitions": t.partitions,
        "asymmetric_cuts": t.asymmetric_cuts,
        "crashes": t.crashes,
        "store_faults": t.store_faults,
        "restarts": t.restarts,
        "client_sends": t.client_sends,
        "client_resends": t.client_resends,
        "heartbeats": t.heartbeats,
        "sync_requests": t.sync_requests,
        "sync_ops_served": t.sync_ops_served,
        "gossip": t.gossip,
        "commits": t.commits,
        "events_checked": t.events_checked,
        "cold_reads": t.cold_reads,
        "key_timeouts": t.key_timeouts,
        "converge_ms_max": t.converge_ms,
        "steps": t.steps,
    })
}
