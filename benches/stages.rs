//! Per-stage costs of the receive path, and the whole engine on RocksDB.
//!
//! Run: `cargo bench --bench stages` (release profile, shared with the tests);
//! one group: `cargo bench --bench stages -- "fold shards"`.
//! Each group's throughput is per op (or per cell, per put), so the numbers
//! read directly as the per-core cost of a stage (STYLE.md: numbers before
//! code).

use std::time::{Duration, Instant};

// The node's allocator (src/bin/dagfold.rs): the fold shards allocate the
// writes that the join frees on another thread, where glibc's malloc takes
// the arena's lock (`_int_free`, `malloc_consolidate`: ~10% of the shards
// under perf with glibc).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dagfold::core::projection::Projection;
use dagfold::core::projector::shard_of;
use dagfold::core::{authorize_at, decode_frame, Cf, Commit, Config, Decoded, Engine, Fold, Identity, Prepared, Projector, ScopeRecord, ScopeStatus, VerifiedOp, Write};
use dagfold::durable::InlineDriver;
use dagfold::protocol::crypto::{open_payload, sha256, sha256_tag_pair};
use dagfold::protocol::sha_lanes::{sha256_tag_pairs_by, Lanes};
use dagfold::protocol::*;
use dagfold::store::rocks::RocksStore;
use dagfold::store::Store;
use dagfold::workload::{generate, WorkloadConfig};

fn node() -> Identity {
    Identity::from_secrets([1; 32], [2; 32])
}

fn workload(ops: usize, chain: bool) -> dagfold::workload::Workload {
    let id = node();
    generate(
        &WorkloadConfig { seed: 42, data_ops: ops, writers: 4, chain, events_per_op: 1, actions_per_op: 2, ..Default::default() },
        id.public_key,
        id.kem_public,
    )
}

fn data_frames(w: &dagfold::workload::Workload) -> Vec<Vec<u8>> {
    w.messages.iter().filter(|m| m.is_data).map(|m| m.frame.clone()).collect()
}

fn stages(c: &mut Criterion) {
    let w = workload(2048, false);
    let frames = data_frames(&w);
    let decoded: Vec<(Hash, Op)> = frames
        .iter()
        .map(|f| match decode_frame(f).unwrap() {
            Decoded::Op { id, op, .. } => (id, op),
            _ => unreachable!(),
        })
        .collect();

    let mut g = c.benchmark_group("stage");
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    g.bench_function("decode+verify (single)", |b| {
        b.iter(|| {
            i = (i + 1) % frames.len();
            let Decoded::Op { id, op, .. } = decode_frame(black_box(&frames[i])).unwrap() else { unreachable!() };
            assert!(sig::verify(&op.author, &id, &op.signature));
        })
    });
    g.throughput(Throughput::Elements(64));
    let batch: Vec<([u8; 32], [u8; 32], [u8; 64])> = decoded[..64].iter().map(|(id, op)| (op.author, *id, op.signature)).collect();
    g.bench_function("verify_batch 64 (per op)", |b| b.iter(|| assert!(sig::verify_batch(black_box(&batch)).iter().all(|v| *v))));
    g.throughput(Throughput::Elements(1));
    // Authorize with a cached cut: G(cut) from the cache, then the rule.
    let mut engine = Engine::new(Config::default(), node());
    for m in w.messages.iter().filter(|m| !m.is_data) {
        engine.handle_frame(&m.frame, 0);
    }
    let op0 = decoded[0].1.clone();
    g.bench_function("authorize (cached cut)", |b| {
        b.iter(|| {
            let gstate = engine.governance_at(black_box(&op0.cut)).unwrap();
            assert_eq!(authorize_at(&gstate, &op0), dagfold::core::PreAuth::Ok);
        })
    });
    let key = w.keys[0];
    g.bench_function("decrypt", |b| {
        b.iter(|| {
            i = (i + 1) % decoded.len();
            let op = &decoded[i].1;
            open_payload(&key, &op.nonce, &op.scope, op.plane, black_box(&op.payload)).unwrap()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("fold+root");
    g.throughput(Throughput::Elements(1));
    for cells in [10_000u32, 1_000_000] {
        let mut p = Projection::default();
        for k in 0..cells {
            p.apply(1, &[1; 32], &[Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![1; 16] }]);
        }
        p.root();
        let mut hlc = 2;
        g.bench_function(format!("one Put + root at {cells} cells"), |b| {
            b.iter(|| {
                hlc += 1;
                let k = (hlc as u32).wrapping_mul(2_654_435_761) % cells;
                p.apply(hlc, &[1; 32], &[Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![2; 16] }]);
                black_box(p.root())
            })
        });
    }
    // The shape of a loaded node: 40k cells, a root every ~200 ops of two
    // actions (root checks and statuses), so the upper levels are shared.
    let cells = 40_000u32;
    let mut p = Projection::default();
    for k in 0..cells {
        p.apply(1, &[1; 32], &[Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![1; 16] }]);
    }
    p.root();
    let mut hlc = 2u64;
    g.throughput(Throughput::Elements(200));
    g.bench_function(format!("200 ops of 2 Puts + root at {cells} cells (per op)"), |b| {
        b.iter(|| {
            for _ in 0..200 {
                hlc += 1;
                let k = (hlc as u32).wrapping_mul(2_654_435_761) % cells;
                let put = |k: u32| Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![2; 16] };
                p.apply(hlc, &[1; 32], &[put(k), put((k + 7919) % cells)]);
            }
            black_box(p.root())
        })
    });
    // A chain: every op's root is checked (SPEC §8), one at a time as the
    // engine did before baa3431, or as checkpoints computed together.
    g.throughput(Throughput::Elements(256));
    for (together, check) in [(false, true), (true, true), (false, false)] {
        let name = if !check { "no check (the fold alone)" } else if together { "checkpoints computed together" } else { "root after each" };
        g.bench_function(format!("256 ops of 2 Puts, each checked, at {cells} cells: {name} (per op)"), |b| {
            let mut roots = Vec::with_capacity(256);
            b.iter(|| {
                roots.clear();
                for _ in 0..256 {
                    hlc += 1;
                    let k = (hlc as u32).wrapping_mul(2_654_435_761) % cells;
                    let put = |k: u32| Action::Put { entity: "e".into(), key: k.to_le_bytes().to_vec(), value: vec![2; 16] };
                    p.apply(hlc, &[1; 32], &[put(k), put((k + 7919) % cells)]);
                    if together {
                        p.checkpoint();
                    } else if check {
                        roots.push(p.root());
                    }
                }
                p.take_checkpoint_roots(&mut roots);
                black_box(roots.len())
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("tag pairs");
    let pairs: Vec<(Hash, Hash)> = (0..64u32).map(|i| (sha256(&i.to_le_bytes()), sha256(&[i as u8, 1]))).collect();
    g.throughput(Throughput::Elements(64));
    g.bench_function("64 one by one (sha2)", |b| {
        b.iter(|| pairs.iter().map(|(a, b)| sha256_tag_pair(1, a, b)[0]).fold(0u8, |x, y| x ^ y))
    });
    let mut out = Vec::new();
    for lanes in Lanes::available().iter().copied().filter(|&l| l != Lanes::Sha2) {
        let name = match lanes {
            Lanes::Ni => "64 four at a time (sha_lanes, SHA-NI)",
            _ => "64 sixteen at a time (sha_lanes, AVX-512F)",
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                sha256_tag_pairs_by(lanes, 1, black_box(&pairs), &mut out);
                out[63]
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rocksdb");
    g.throughput(Throughput::Elements(256));
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    let mut n = 0u64;
    g.bench_function("commit of 256 puts (300 B), WAL synced", |b| {
        b.iter_batched(
            || {
                (0..256)
                    .map(|_| {
                        n += 1;
                        Write::Put(Cf::Ops, dagfold::protocol::crypto::sha256(&n.to_le_bytes()).to_vec(), vec![7u8; 300])
                    })
                    .collect::<Vec<_>>()
            },
            |writes| store.write(&writes, true).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The whole engine on RocksDB: 100,000 data ops, batches of 256 frames per
/// atomic, WAL-synced commit, batch-verified, causal and reversed.
fn engine_on_rocksdb(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine on rocksdb, 100k ops");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(60));
    g.throughput(Throughput::Elements(100_000));
    for (name, chain, reverse) in [("causal, 4 writers", false, false), ("reversed chain", true, true)] {
        let w = workload(100_000, chain);
        let mut frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
        if reverse {
            frames.reverse();
        }
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().unwrap();
                    let mut store = RocksStore::open(dir.path()).unwrap();
                    let id = node();
                    store.write(&[Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
                    let mut d = InlineDriver::open(store, Config::default(), 0).unwrap();
                    let t = Instant::now();
                    for chunk in frames.chunks(256) {
                        d.handle_frames(chunk, 0).unwrap();
                    }
                    total += t.elapsed();
                    assert_eq!(d.engine.scope_root(&w.scope), Some(w.final_root));
                }
                total
            })
        });
    }
    g.finish();
}

/// The commit stage alone (`pipeline::commit_stage`: the encoder, the
/// committer and its publisher, as the node runs them) over the commits the engine makes of
/// 100,000 causal data ops (4 writers, one scope) in groups of 1,024
/// frames, each with its scope's status, written to RocksDB with the WAL
/// synced: the committer's own rate, the cap one committer thread puts on
/// a node however many cores it has (ARCHITECTURE.md, "Cost per stage").
fn commit_stage(c: &mut Criterion) {
    type Made = (Vec<Write>, Vec<(Hash, Hash)>, Vec<dagfold::core::EventOut>, u64, Vec<dagfold::core::ScopeStatus>);
    let made = std::cell::OnceCell::new();
    let mut g = c.benchmark_group("commit stage");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    g.throughput(Throughput::Elements(100_000));
    for sync in [true, false] {
    let name = if sync { "causal, commits of 1,024 frames, WAL synced" } else { "causal, commits of 1,024 frames, not synced" };
    g.bench_function(name, |b| {
        let commits: &Vec<Made> = made.get_or_init(|| {
            let w = workload(100_000, false);
            let mut engine = Engine::new(Config::default(), node());
            let mut out = Vec::new();
            for chunk in w.messages.chunks(1024) {
                for m in chunk {
                    match decode_frame(&m.frame).unwrap() {
                        Decoded::Op { id, op, bytes } => {
                            engine.handle_checked(VerifiedOp { id, op, bytes, pre: Default::default() }, true, 0);
                        }
                        Decoded::Key(kd) => {
                            engine.handle_key(&kd, 0);
                        }
                    }
                }
                let commit = engine.take_commit().unwrap();
                let statuses = engine.status(&w.scope).into_iter().collect();
                out.push((commit.writes, commit.applied, commit.events, commit.number, statuses));
            }
            assert_eq!(engine.scope_root(&w.scope), Some(w.final_root));
            out
        });
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dir = tempfile::tempdir().unwrap();
                let store = RocksStore::open(dir.path()).unwrap();
                let input: Vec<(Commit, Vec<dagfold::core::ScopeStatus>)> = commits
                    .iter()
                    .map(|(writes, applied, events, number, statuses)| {
                        let commit =
                            Commit { writes: writes.clone(), applied: applied.clone(), events: events.clone(), number: *number, ..Default::default() };
                        (commit, statuses.clone())
                    })
                    .collect();
                let t = Instant::now();
                let handed = dagfold::pipeline::commit_stage(store, input, sync);
                total += t.elapsed();
                assert!(handed >= 100_000, "{handed} ops published");
            }
            total
        })
    });
    }
    g.finish();
}

/// Scopes and data ops per scope of the fold shards' workload: many
/// scopes, each with a history of its own, as a server holds them.
const SHARDED_SCOPES: u64 = 128;
const SHARDED_OPS_PER_SCOPE: usize = 1_000;
/// Ops per commit, about what a loaded node groups (`commit_ops_max` is
/// 4,096; a verifier batch of 512 closes one when the committer waits).
const SHARDED_COMMIT_OPS: usize = 1_024;

/// The fold stage of the node (`pipeline::fold_stage`: the real split,
/// shard threads and join) over 128 scopes × 1,000 honest data ops (4
/// writers each, their ops interleaved across scopes, commits of 1,024
/// ops), in one shard and in two, each on its own thread: ops/s of each,
/// whose ratio is what a second core gives the fold (issue 23: ≥ 1.7);
/// and in one shard whose cells and trees are two threads
/// (`--projector-split`), what a second core gives one scope.
fn fold_shards(c: &mut Criterion) {
    // Made once, and only when a benchmark of the group runs (the filter).
    let made = std::cell::OnceCell::new();
    let mut g = c.benchmark_group("fold shards");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(SHARDED_SCOPES * SHARDED_OPS_PER_SCOPE as u64));
    let mut writes_of = Vec::new();
    for (shards, split) in [(1usize, false), (2, false), (1, true)] {
        let mut writes = 0usize;
        let name = if split { format!("{SHARDED_SCOPES} scopes, {shards} shard(s) in two threads") } else { format!("{SHARDED_SCOPES} scopes, {shards} shard(s)") };
        g.bench_function(name, |b| {
            let commits = &made.get_or_init(sharded_workload).commits;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let input = as_commits(commits);
                    writes = 0;
                    let t = Instant::now();
                    dagfold::pipeline::fold_stage(Projector::default().split(shards), split, input, |c, _| writes += c.writes.len());
                    total += t.elapsed();
                }
                total
            })
        });
        writes_of.push(writes);
    }
    // (Of those that ran: the filter may leave one out.)
    writes_of.retain(|w| *w > 0);
    assert!(writes_of.windows(2).all(|w| w[0] == w[1]), "the same writes in one shard and in two: {writes_of:?}");
    g.finish();

    // The whole pipeline on RocksDB (WAL synced), the same frames signed
    // and verified: what a second shard gives the node on this machine.
    let mut g = c.benchmark_group("pipeline, fold shards");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(30));
    g.throughput(Throughput::Elements(SHARDED_SCOPES * SHARDED_OPS_PER_SCOPE as u64));
    for shards in [1usize, 2] {
        g.bench_function(format!("{SHARDED_SCOPES} scopes, {shards} shard(s)"), |b| {
            let frames = &made.get_or_init(sharded_workload).frames;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().unwrap();
                    let store = RocksStore::open(dir.path()).unwrap();
                    let cfg = dagfold::pipeline::PipelineConfig { applied_bytes: false, projector_shards: shards, ..Default::default() };
                    let (tx, rx) = tokio::sync::mpsc::channel(4096);
                    let t = Instant::now();
                    let p = dagfold::pipeline::Pipeline::start(cfg, Engine::new(Config::default(), node()), store, rx, Box::new(|_| {}));
                    for f in frames {
                        let work = match decode_frame(f).unwrap() {
                            Decoded::Op { id, op, bytes } => dagfold::pipeline::Work::Op { id, op, bytes, conn: 1, host: None },
                            Decoded::Key(kd) => dagfold::pipeline::Work::Key { kd, host: None },
                        };
                        tx.blocking_send(work).unwrap();
                    }
                    drop(tx);
                    let shared = p.shared.clone();
                    p.join();
                    total += t.elapsed();
                    let applied: u64 = shared.status.read().unwrap().values().map(|s| s.applied).sum();
                    assert!(applied >= SHARDED_SCOPES * SHARDED_OPS_PER_SCOPE as u64);
                }
                total
            })
        });
    }
    g.finish();
}

/// The fold shards' workload: its frames (every scope's governance, then
/// the data ops interleaved across scopes) and the engine's commits of
/// them, their folds and records (and, with `statuses`, the statuses of
/// the scopes each commit touched, whose roots the fold fills, as the
/// orderer hands them on).
struct Sharded {
    frames: Vec<Vec<u8>>,
    commits: Vec<FoldCommit>,
}

/// One commit of a fold workload: its folds, its scope records, and the
/// statuses of the scopes it touched.
type FoldCommit = (Vec<Fold>, Vec<(Hash, ScopeRecord)>, Vec<ScopeStatus>);

fn sharded_workload() -> Sharded {
    fold_workload(SHARDED_SCOPES, SHARDED_OPS_PER_SCOPE, false)
}

fn fold_workload(scopes: u64, ops_per_scope: usize, statuses: bool) -> Sharded {
    let id = node();
    let t = Instant::now();
    let ws: Vec<_> = (0..scopes)
        .map(|i| {
            let cfg = WorkloadConfig { seed: 1_000 + i, data_ops: ops_per_scope, writers: 4, ..Default::default() };
            generate(&cfg, id.public_key, id.kem_public)
        })
        .collect();
    // The engine's commits with their folds, as the orderer hands them on
    // (signatures taken as verified: the fold is what is measured).
    let mut engine = Engine::new(Config::default(), id.clone());
    let _ = engine.take_projector();
    let mut commits = Vec::new();
    let prefix = ws.iter().flat_map(|w| w.messages.iter().filter(|m| !m.is_data));
    let data: Vec<Vec<_>> = ws.iter().map(|w| w.messages.iter().filter(|m| m.is_data).collect()).collect();
    let interleaved = (0..ops_per_scope).flat_map(|i| data.iter().map(move |d| d[i]));
    let frames: Vec<Vec<u8>> = prefix.chain(interleaved).map(|m| m.frame.clone()).collect();
    let mut take = |engine: &mut Engine| {
        let c = engine.take_commit().unwrap();
        let taken = engine.take_statuses();
        let s = if statuses { taken } else { Vec::new() };
        commits.push((c.folds, c.records, s));
    };
    for (n, frame) in frames.iter().enumerate() {
        let outcome = match decode_frame(frame).unwrap() {
            Decoded::Op { id, op, bytes } => engine.handle_checked(VerifiedOp { id, op, bytes, pre: Default::default() }, true, 0),
            Decoded::Key(kd) => engine.handle_key(&kd, 0),
        };
        assert!(matches!(outcome, dagfold::core::Outcome::Applied | dagfold::core::Outcome::KeyAccepted), "{outcome:?}");
        if (n + 1) % SHARDED_COMMIT_OPS == 0 {
            take(&mut engine);
        }
    }
    take(&mut engine);
    let ops: usize = commits.iter().map(|(f, _, _)| f.len()).sum();
    assert_eq!(ops as u64, scopes * ops_per_scope as u64);
    let share = ws.iter().filter(|w| shard_of(&w.scope, 2) == 0).count();
    eprintln!(
        "fold workload: {} scopes, {ops} data ops in {} commits (made in {:.1} s); of two shards the first holds {share} scopes",
        ws.len(),
        commits.len(),
        t.elapsed().as_secs_f64()
    );
    Sharded { frames, commits }
}

/// The fold of many small scopes, as `tools/bench scopes_10k` sends them
/// (10,000 scopes of 4 writers, 18 data ops each, interleaved across the
/// scopes, so that a commit touches each scope once), one shard, with each
/// commit's statuses: a new scope's cells and tree growing from empty, and
/// a root per touched scope per commit; and without the statuses. Per op,
/// against `fold shards`' 128 scopes of 1,000 ops, it is what the many
/// scopes cost the fold, and what their statuses' roots cost.
fn fold_many_scopes(c: &mut Criterion) {
    const SCOPES: u64 = 10_000;
    const OPS_PER_SCOPE: usize = 18;
    let made = std::cell::OnceCell::new();
    let mut g = c.benchmark_group("fold many scopes");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(SCOPES * OPS_PER_SCOPE as u64));
    for statuses in [true, false] {
        let name = format!("{SCOPES} scopes of {OPS_PER_SCOPE} ops, 1 shard, {}", if statuses { "statuses" } else { "no statuses" });
        g.bench_function(name, |b| {
            let commits = &made.get_or_init(|| fold_workload(SCOPES, OPS_PER_SCOPE, true)).commits;
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut input = as_commits(commits);
                    if !statuses {
                        input.iter_mut().for_each(|(_, s)| s.clear());
                    }
                    let mut roots = 0usize;
                    let t = Instant::now();
                    dagfold::pipeline::fold_stage(Projector::default().split(1), false, input, |_, s| roots += s.len());
                    total += t.elapsed();
                    let want = if statuses { SCOPES * OPS_PER_SCOPE as u64 / 2 } else { 0 };
                    assert!(roots as u64 >= want, "a status per touched scope per commit: {roots}");
                }
                total
            })
        });
    }
    g.finish();
}

/// The commits of a fold workload, numbered, as the fold stage takes them.
fn as_commits(commits: &[FoldCommit]) -> Vec<(Commit, Vec<ScopeStatus>)> {
    commits
        .iter()
        .enumerate()
        .map(|(n, (folds, records, statuses))| {
            (Commit { folds: folds.clone(), records: records.clone(), number: n as u64, ..Default::default() }, statuses.clone())
        })
        .collect()
}

/// What the stages before the orderer hand it for one message: an op with
/// its signature checked, its authorization at its cut and its payload
/// opened (and, a data op's, decoded), or a key delivery opened. Held by
/// value, as the pipeline's items are (a box would add an allocation per
/// op that the node does not make).
#[allow(clippy::large_enum_variant)]
enum Ordered {
    Op(VerifiedOp),
    Key(KeyDelivery, Option<Option<[u8; 32]>>),
}

/// The order in which `order_items` delivers its data ops.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    Causal,
    Shuffled,
    Reversed,
}

/// A message of the order stage's workload: its id (an op's), its frame,
/// what the stages before the orderer computed, and whether it is a key
/// delivery.
type Prepped = (Hash, Vec<u8>, Prepared, bool);

/// The order stage's workload (`Order`): 100,000 data ops of one scope
/// after its governance ops and key deliveries. Causal: 4 writers, in
/// order; shuffled: the same ops shuffled in windows of 10,000 with 10%
/// duplicates, as `tools/bench shuffled` sends them; reversed: a chain of
/// one writer sent last op first, as `tools/bench reversed` sends it
/// (every op parked, then one cascade). Each message with what the stages
/// before the orderer compute for it on its arrival (an authorizer's
/// replica that has applied what came before it).
fn order_items(order: Order) -> (dagfold::workload::Workload, Vec<Prepped>) {
    use rand::{Rng, SeedableRng};
    let w = workload(100_000, order == Order::Reversed);
    let keys: std::collections::HashMap<Hash, [u8; 32]> = w.keys.iter().map(|k| (crypto::key_id_of(k), *k)).collect();
    let (mut frames, mut data): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
    for m in &w.messages {
        if m.is_data {
            data.push(m.frame.clone());
        } else {
            frames.push(m.frame.clone());
        }
    }
    if order == Order::Reversed {
        data.reverse();
    }
    if order == Order::Shuffled {
        let order = dagfold::workload::shuffle_within_windows(data.len(), 10_000, 7);
        data = order.into_iter().map(|i| std::mem::take(&mut data[i])).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for _ in 0..data.len() / 10 {
            let copy = data[rng.gen_range(0..data.len())].clone();
            let at = rng.gen_range(0..=data.len());
            data.insert(at, copy);
        }
    }
    frames.extend(data);
    let mut replica = Engine::new(Config::default(), node());
    let mut items = Vec::new();
    for frame in frames {
        match decode_frame(&frame).unwrap() {
            Decoded::Op { id, op, bytes } => {
                let mut pre = Prepared { auth: replica.governance_at(op.cut_ids()).map(|g| authorize_at(&g, &op)), ..Default::default() };
                if let Some(key) = keys.get(&op.key_id) {
                    pre.open_data(op.plane, open_payload(key, &op.nonce, &op.scope, op.plane, &op.payload));
                }
                items.push((id, frame, pre, false));
                replica.handle_checked(VerifiedOp { id, op, bytes, pre: Default::default() }, true, 0);
            }
            Decoded::Key(kd) => {
                items.push(([0; 32], frame, Prepared::default(), true));
                replica.handle_key(&kd, 0);
            }
        }
    }
    (w, items)
}

/// The order stage alone: the engine as the orderer runs it, its fold
/// handed out (`Engine::take_projector`), over `order_items`' workloads
/// (causal, shuffled, reversed) as the stages before it deliver them
/// (`Ordered`: what the verifiers, the authorizer and the decryptor
/// compute), a commit taken every 1,024 frames (and every 1,024 ops of a
/// cascade) with its scope's status, and sent to a thread
/// that frees it (the projector and committer do, in the node). Its rate
/// is the cap one orderer thread puts on a node however many cores it has
/// (ARCHITECTURE.md, "Cost per stage"); the orderer's thread adds the
/// commit's split and its channels.
fn order_stage(c: &mut Criterion) {
    let mut g = c.benchmark_group("order stage");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(100_000));
    for (name, order) in [
        ("causal, commits of 1,024 frames", Order::Causal),
        ("shuffled, commits of 1,024 frames", Order::Shuffled),
        ("reversed chain, commits of 1,024 frames", Order::Reversed),
    ] {
        let made = std::cell::OnceCell::new();
        g.bench_function(name, |b| {
            let (w, items) = made.get_or_init(|| order_items(order));
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let input: Vec<Ordered> = items
                        .iter()
                        .map(|(id, frame, pre, key)| match decode_frame(frame).unwrap() {
                            Decoded::Op { op, bytes, .. } => Ordered::Op(VerifiedOp { id: *id, op, bytes, pre: pre.clone() }),
                            Decoded::Key(kd) if *key => {
                                let opened = w.keys.iter().find(|k| crypto::key_id_of(k) == kd.key_id).copied();
                                Ordered::Key(kd, Some(opened))
                            }
                            Decoded::Key(_) => unreachable!(),
                        })
                        .collect();
                    let mut engine = Engine::new(Config::default(), node());
                    let _projector = engine.take_projector();
                    // A cascade in commits of 1,024 ops at most, as the node's.
                    engine.set_cascade_budget(1024);
                    let (tx, rx) = crossbeam_channel::bounded::<(Commit, Vec<dagfold::core::ScopeStatus>)>(4);
                    let freer = std::thread::spawn(move || rx.into_iter().count());
                    let mut input = input.into_iter();
                    let t = Instant::now();
                    loop {
                        let chunk: Vec<Ordered> = input.by_ref().take(1024).collect();
                        if chunk.is_empty() {
                            if !engine.cascade_remaining() {
                                break;
                            }
                            engine.continue_cascade(0);
                        }
                        for item in chunk {
                            match item {
                                Ordered::Op(v) => {
                                    engine.handle_checked(v, true, 0);
                                }
                                Ordered::Key(kd, opened) => {
                                    engine.handle_key_opened(&kd, opened, 0);
                                }
                            }
                        }
                        let commit = engine.take_commit().unwrap();
                        let statuses = engine.take_statuses();
                        tx.send((commit, statuses)).unwrap();
                    }
                    drop(tx);
                    let commits = freer.join().unwrap();
                    total += t.elapsed();
                    assert!(commits >= 98, "{commits} commits");
                    assert_eq!(engine.status(&w.scope).map(|s| s.applied), Some(100_002), "every op applied");
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, stages, engine_on_rocksdb, commit_stage, order_stage);
criterion_group!(sharded, fold_shards, fold_many_scopes);
criterion_main!(benches, sharded);
