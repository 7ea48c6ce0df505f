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

/// A store that keeps every batch written, for the test to read while the
/// pipeline owns it.
#[derive(Clone, Default)]
struct Recorded(std::sync::Arc<std::sync::Mutex<(MemStore, Vec<Vec<dagfold::core::Write>>)>>);

impl dagfold::core::TableScan for Recorded {
    fn scan(&self, cf: dagfold::core::Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), dagfold::core::ScanFailed> {
        self.0.lock().unwrap().0.scan(cf, f)
    }
}

impl dagfold::store::Store for Recorded {
    fn write(&mut self, writes: &[dagfold::core::Write], sync: bool) -> Result<(), dagfold::store::StoreError> {
        let mut g = self.0.lock().unwrap();
        g.1.push(writes.to_vec());
        g.0.write(writes, sync)
    }

    fn get(&self, cf: dagfold::core::Cf, key: &[u8]) -> Result<Option<Vec<u8>>, dagfold::store::StoreError> {
        self.0.lock().unwrap().0.get(cf, key)
    }

    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<dagfold::protocol::Hash>, dagfold::store::StoreError> {
        self.0.lock().unwrap().0.op_ids_with_prefix(prefix, max)
    }
}

/// What a run of the pipeline left: every table but the event log (whose
/// records are per commit, and commits close by time), the events handed
/// out, the published roots, the heartbeat divergences and the batches.
struct Run {
    tables: Vec<std::collections::BTreeMap<Vec<u8>, Vec<u8>>>,
    events: Vec<(dagfold::protocol::Hash, u64, dagfold::protocol::Hash)>,
    roots: Vec<(dagfold::protocol::Hash, dagfold::protocol::Hash)>,
    heartbeat_divergences: u64,
    batches: Vec<Vec<dagfold::core::Write>>,
}

fn run_with_shards(shards: usize, split: bool, id: &Identity, input: &[Work2]) -> Run {
    use dagfold::core::Cf;
    let store = Recorded::default();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ev = events.clone();
    let on_durable = Box::new(move |d: dagfold::pipeline::Committed| ev.lock().unwrap().extend(d.events.into_iter().map(|e| (e.scope, e.seq, e.op))));
    // Small commits (a commit holds whole verifier batches), so that many
    // commits each hold ops of many scopes.
    let cfg = PipelineConfig {
        applied_bytes: false,
        projector_shards: shards,
        projector_split: split,
        verify_batch_max: 16,
        commit_ops_max: 32,
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let pipeline = Pipeline::start(cfg, Engine::new(Config::default(), id.clone()), store.clone(), rx, on_durable);
    for w in input {
        let work = match w {
            Work2::Frame(f) => work_of(f),
            Work2::Heads { scope, heads, root } => {
                Work::Heads { peer: "127.0.0.1:9".parse().unwrap(), origin: 1, scope: *scope, heads: heads.clone(), root: *root }
            }
        };
        tx.blocking_send(work).unwrap();
    }
    drop(tx);
    let shared = pipeline.shared.clone();
    pipeline.join();
    let g = store.0.lock().unwrap();
    let tables = Cf::ALL.iter().filter(|cf| **cf != Cf::Events).map(|cf| g.0.table(*cf).cloned().unwrap_or_default()).collect();
    let mut events = events.lock().unwrap().clone();
    events.sort();
    let roots = shared.status.read().unwrap().values().map(|s| (s.scope, s.root)).collect();
    let heartbeat_divergences = shared.divergences_heartbeat.load(std::sync::atomic::Ordering::Relaxed);
    Run { tables, events, roots, heartbeat_divergences, batches: g.1.clone() }
}

/// The input of `projector_shards_...`: frames, and peers' heartbeats.
enum Work2 {
    Frame(Vec<u8>),
    Heads { scope: dagfold::protocol::Hash, heads: Vec<dagfold::protocol::Hash>, root: dagfold::protocol::Hash },
}

/// Issue 23: the fold split by scope into shards stores and publishes what
/// one projector does, and so does a shard in two threads (the cells'
/// fold, then the trees: `--projector-split`). Twelve scopes' ops
/// interleaved, through 1 projector shard in one thread, 1 in two, and 3
/// in two each: the same tables (cells, items, scope records with
/// their divergence counts, ops), events and published roots (each the
/// author's final root); heartbeats compared at their point of the input
/// (mid-way through a scope, its next ops and other scopes' around them,
/// in the same commit; a shard counts the point in its own folds): the right
/// roots count nothing, a wrong one one divergence. Each batch holds whole
/// commits: the scopes whose cells it writes are those of its events (here
/// every data op puts cells and emits one event), which a commit joined
/// from the parts of different commits would break.
#[test]
fn projector_shards_store_and_publish_what_one_projector_does() {
    let id = Identity::from_secrets([27; 32], [28; 32]);
    let ws: Vec<_> = (0..12)
        .map(|i| generate(&WorkloadConfig { seed: 100 + i, data_ops: 120, ..Default::default() }, id.public_key, id.kem_public))
        .collect();
    let shards: std::collections::BTreeSet<usize> = ws.iter().map(|w| dagfold::core::projector::shard_of(&w.scope, 3)).collect();
    assert_eq!(shards.len(), 3, "every shard holds a scope");
    let mut input: Vec<Work2> = Vec::new();
    let data: Vec<Vec<_>> = ws.iter().map(|w| w.messages.iter().filter(|m| m.is_data).collect()).collect();
    for w in &ws {
        input.extend(w.messages.iter().filter(|m| !m.is_data).map(|m| Work2::Frame(m.frame.clone())));
    }
    for i in 0..120 {
        for (k, w) in ws.iter().enumerate() {
            if k < 4 && (60..63).contains(&i) {
                continue; // Sent right after the heartbeat.
            }
            input.push(Work2::Frame(data[k][i].frame.clone()));
            if i == 59 && k < 4 {
                // This scope's state after its first 60 ops, from an engine
                // of its own; the fourth heartbeat's root is wrong.
                let mut inline = Engine::new(Config::default(), id.clone());
                for m in w.messages.iter().filter(|m| !m.is_data).chain(data[k][..60].iter().copied()) {
                    inline.handle_frame(&m.frame, 0);
                }
                let st = inline.status(&w.scope).unwrap();
                let heads = st.data_heads.iter().chain(&st.governance_heads).copied().collect();
                input.push(Work2::Heads { scope: w.scope, heads, root: if k == 3 { [9; 32] } else { st.root } });
                // The scope's next ops at once: mostly in the heartbeat's
                // commit, which it must be compared before.
                input.extend(data[k][60..63].iter().map(|m| Work2::Frame(m.frame.clone())));
            }
        }
    }
    let one = run_with_shards(1, false, &id, &input);
    let split = run_with_shards(1, true, &id, &input);
    let three = run_with_shards(3, true, &id, &input);
    for (other, name) in [(&split, "one shard in two threads"), (&three, "three shards in two threads each")] {
        assert!(one.tables == other.tables, "{name}: the same tables");
        assert_eq!(one.events, other.events, "{name}");
        assert_eq!(one.roots, other.roots, "{name}");
        assert_eq!(other.heartbeat_divergences, 1, "{name}");
    }
    assert_eq!(one.events.len(), 12 * 120);
    let mut want: Vec<_> = ws.iter().map(|w| (w.scope, w.final_root)).collect();
    want.sort();
    assert_eq!(three.roots, want, "the authors' roots");
    assert_eq!((one.heartbeat_divergences, three.heartbeat_divergences), (1, 1));
    let scope_of = |k: &[u8]| -> dagfold::protocol::Hash { k[..32].try_into().unwrap() };
    for (n, batch) in three.batches.iter().enumerate() {
        let (mut cells, mut evs) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for w in batch {
            match w {
                dagfold::core::Write::Put(dagfold::core::Cf::Projection, k, _) => cells.insert(scope_of(k)),
                dagfold::core::Write::Put(dagfold::core::Cf::Events, k, _) => evs.insert(scope_of(k)),
                _ => false,
            };
        }
        assert_eq!(cells, evs, "batch {n}: the scopes of its cells and of its events");
    }
    assert!(three.batches.len() > 20, "many commits: {}", three.batches.len());
}
