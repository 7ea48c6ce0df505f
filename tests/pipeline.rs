//! The staged pipeline around the engine, driven directly (no transport):
//! what it commits, and when.

use std::time::{Duration, Instant};

use dagfold::core::{decode_frame, Config, Decoded, Engine, Identity};
use dagfold::pipeline::{Pipeline, PipelineConfig, Work};
use dagfold::store::memory::MemStore;
use dagfold::workload::{generate, WorkloadConfig};

fn work_of(frame: &[u8]) -> Work {
    match decode_frame(frame).expect("generated frames decode") {
        Decoded::Op { id, op, bytes } => Work::Op { id, op, bytes, conn: 1, host: None },
        Decoded::Key(kd) => Work::Key(kd),
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
    tx.blocking_send(Work::Heads { peer, scope: w.scope, heads: heads.clone(), root: st.root }).unwrap();
    tx.blocking_send(Work::Heads { peer, scope: w.scope, heads, root: [9; 32] }).unwrap();
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
