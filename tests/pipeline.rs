//! The staged pipeline around the engine, driven directly (no transport):
//! what it commits, and when.

use std::time::{Duration, Instant};

use dagfold::core::{decode_frame, Config, Decoded, Engine, Identity};
use dagfold::protocol::KeyDelivery;
use dagfold::pipeline::{Pipeline, PipelineConfig, Work};
use dagfold::store::memory::MemStore;
use dagfold::workload::{generate, WorkloadConfig};

fn work_of(frame: &[u8]) -> Work {
    match decode_frame(frame).expect("generated frames decode") {
        Decoded::Op { id, op, bytes } => Work::Op { id, op, bytes, conn: 1, host: None },
        Decoded::Key(kd) => Work::Key { kd, host: None },
    }
}

/// A chain delivered in reverse is released by its first op in one cascade,
/// committed in parts. With the input idle afterwards, the last part is
/// committed at once, not after the orderer's idle wait for input (here
/// ten minutes, so that waiting would fail the test); the status then shows
/// every op applied and the author's root.
#[test]
fn the_last_part_of_a_cascade_commits_without_waiting_for_input() {
    let id = Identity::from_secrets([21; 32], [22; 32]);
    let w = generate(&WorkloadConfig { data_ops: 600, chain: true, ..Default::default() }, id.public_key, id.kem_public);
    let cfg = PipelineConfig { tick_ms: 600_000, commit_ops_max: 64, applied_bytes: false, ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let pipeline = Pipeline::start(cfg, Engine::new(Config::default(), id), MemStore::new(), rx, Box::new(|_| {}));
    let (prefix, data): (Vec<_>, Vec<_>) = w.messages.iter().partition(|m| !m.is_data);
    let expected = w.messages.iter().filter(|m| m.id != dagfold::protocol::ZERO).count() as u64;
    for m in prefix.iter().chain(data.iter().rev()) {
        tx.blocking_send(work_of(&m.frame)).unwrap();
    }
    let t = Instant::now();
    let status = loop {
        let st = pipeline.shared.status.read().unwrap().get(&w.scope).cloned();
        if let Some(st) = st.filter(|s| s.applied == expected) {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "not all applied while the input is open: {:?}", pipeline.shared.status.read().unwrap().get(&w.scope));
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.root, w.final_root);
    assert_eq!(status.pending, 0);
    assert_eq!(status.data_heads, w.data_heads);
    drop(tx);
    pipeline.join();
}

/// A peer's heartbeat with our heads is compared with our root as of that
/// point of the input: the fold of the ops before it, made on the
/// projector thread after the orderer, not of the ops that follow it in
/// the same commit. The author's root at that point counts no divergence,
/// another root one.
#[test]
fn a_heartbeat_is_compared_with_the_root_at_its_point_of_the_input() {
    let id = Identity::from_secrets([23; 32], [24; 32]);
    let w = generate(&WorkloadConfig { data_ops: 60, chain: true, ..Default::default() }, id.public_key, id.kem_public);
    let (prefix, data): (Vec<_>, Vec<_>) = w.messages.iter().partition(|m| !m.is_data);
    let (before, after) = data.split_at(30);
    // The state after the first 30 ops, folded by an engine of its own.
    let mut inline = Engine::new(Config::default(), id.clone());
    for m in prefix.iter().chain(before) {
        inline.handle_frame(&m.frame, 0);
    }
    let st = inline.status(&w.scope).expect("genesis applied");
    let heads: Vec<_> = st.data_heads.iter().chain(&st.governance_heads).copied().collect();
    let peer: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let pipeline = Pipeline::start(PipelineConfig { applied_bytes: false, ..Default::default() }, Engine::new(Config::default(), id), MemStore::new(), rx, Box::new(|_| {}));
    for m in prefix.iter().chain(before) {
        tx.blocking_send(work_of(&m.frame)).unwrap();
    }
    tx.blocking_send(Work::Heads { peer, origin: 1, scope: w.scope, heads: heads.clone(), root: st.root }).unwrap();
    tx.blocking_send(Work::Heads { peer, origin: 1, scope: w.scope, heads, root: [9; 32] }).unwrap();
    for m in after {
        tx.blocking_send(work_of(&m.frame)).unwrap();
    }
    drop(tx);
    let shared = pipeline.shared.clone();
    pipeline.join();
    assert_eq!(shared.divergences_heartbeat.load(std::sync::atomic::Ordering::Relaxed), 1);
    let published = shared.status.read().unwrap().get(&w.scope).cloned().expect("published");
    assert_eq!(published.root, w.final_root);
}

/// What the orderer reports of each host, summed over commits.
#[derive(Default)]
struct HostTotals(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (u32, u32)>>);

impl dagfold::pipeline::HostOutcomes for HostTotals {
    fn record(&self, outcomes: &mut dyn Iterator<Item = (std::net::IpAddr, u32, u32)>) {
        let mut totals = self.0.lock().unwrap();
        for (host, useful, total) in outcomes {
            let t = totals.entry(host).or_default();
            t.0 += useful;
            t.1 += total;
        }
    }
}

/// Issue 20: a key delivery counts in its host's turn like an op, useful
/// when accepted, not when ignored (addressed to another key, or of a key
/// already held), so a host sending junk deliveries gets a smaller share.
#[test]
fn ignored_key_deliveries_lower_their_hosts_useful_share() {
    let id = Identity::from_secrets([25; 32], [26; 32]);
    let w = generate(&WorkloadConfig { data_ops: 40, rotate_at: Some(20), ..Default::default() }, id.public_key, id.kem_public);
    let (honest, junk): (std::net::IpAddr, std::net::IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
    let totals = std::sync::Arc::new(HostTotals::default());
    let cfg = PipelineConfig { applied_bytes: false, host_outcomes: Some(totals.clone()), ..Default::default() };
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let pipeline = Pipeline::start(cfg, Engine::new(Config::default(), id), MemStore::new(), rx, Box::new(|_| {}));
    let from = |frame: &[u8], host| match work_of(frame) {
        Work::Op { id, op, bytes, conn, .. } => Work::Op { id, op, bytes, conn, host: Some(host) },
        Work::Key { kd, .. } => Work::Key { kd, host: Some(host) },
        _ => unreachable!(),
    };
    let mut deliveries = Vec::new();
    for m in &w.messages {
        tx.blocking_send(from(&m.frame, honest)).unwrap();
        if let Decoded::Key(kd) = decode_frame(&m.frame).unwrap() {
            deliveries.push(kd);
        }
    }
    assert_eq!(deliveries.len(), 2, "the first key and the rotated one");
    // Junk from the other host: the same deliveries again (their keys are
    // held) and copies addressed to another recipient.
    for kd in &deliveries {
        tx.blocking_send(Work::Key { kd: kd.clone(), host: Some(junk) }).unwrap();
        tx.blocking_send(Work::Key { kd: KeyDelivery { recipient: [9; 32], ..kd.clone() }, host: Some(junk) }).unwrap();
    }
    drop(tx);
    let shared = pipeline.shared.clone();
    pipeline.join();
    assert_eq!(shared.status.read().unwrap().get(&w.scope).map(|s| s.root), Some(w.final_root));
    let totals = totals.0.lock().unwrap();
    let n = w.messages.len() as u32;
    assert_eq!(totals.get(&honest), Some(&(n, n)), "every op applied and every key accepted is useful");
    assert_eq!(totals.get(&junk), Some(&(0, 4)), "ignored deliveries count, as nothing useful");
}
