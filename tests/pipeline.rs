//! The staged pipeline around the engine, driven directly (no transport):
//! what it commits, and when.

use std::time::{Duration, Instant};

use dagfold::core::{decode_frame, Config, Decoded, Engine, Identity};
use dagfold::pipeline::{Pipeline, PipelineConfig, Work};
use dagfold::store::memory::MemStore;
use dagfold::workload::{generate, WorkloadConfig};

fn work_of(frame: &[u8]) -> Work {
    match decode_frame(frame).expect("generated frames decode") {
        Decoded::Op { id, op, bytes } => Work::Op { id, op, bytes, origin: 1, host: None },
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
