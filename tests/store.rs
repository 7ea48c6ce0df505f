//! Real RocksDB: apply, close, reopen, continue, compare with a run that never
//! closed; crash (SIGKILL) during `dagfold import` at random points, reopen,
//! check consistency against a fresh fold of the applied set.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use dagfold::core::{Cf, Config, Engine, TableScan};
use dagfold::durable::InlineDriver;
use dagfold::protocol::codec::decode_op;
use dagfold::protocol::{Hash, PLANE_DATA};
use dagfold::store::memory::MemStore;
use dagfold::store::rocks::RocksStore;
use dagfold::store::{Store, StoreError};

fn scenario(name: &str) -> serde_json::Value {
    load_json(&format!("scenarios/{name}.json"))
}

/// Writes the scenario's node identity into a fresh store, so that the
/// key deliveries addressed to it open.
fn seed_identity(store: &mut dyn Store, scn: &serde_json::Value) {
    let id = node_identity(scn);
    store.write(&[dagfold::core::Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
}

#[test]
fn reopen_and_continue_equals_never_closed() {
    for path in scenario_files() {
        let scn = load_json(path.strip_prefix(vectors_dir()).unwrap().to_str().unwrap());
        let name = scn["name"].as_str().unwrap().to_owned();
        let msgs = messages(&scn);
        let dir = tempfile::tempdir().unwrap();
        let mut store = RocksStore::open(dir.path()).unwrap();
        seed_identity(&mut store, &scn);
        let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
        let third = msgs.len() / 3;
        let mut events = Vec::new();
        for chunk in msgs[..third].chunks(7) {
            events.extend(node.handle_frames(chunk, 0).unwrap().1);
        }
        drop(node);
        // Data ops waiting in memory for a key are lost on close (SPEC §6
        // step 4): redelivery, as gossip and sync would do, brings them back.
        let mut node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), Config::default(), 0).unwrap();
        events.extend(node.handle_frames(&msgs[..third], 0).unwrap().1);
        for chunk in msgs[third..2 * third].chunks(5) {
            events.extend(node.handle_frames(chunk, 0).unwrap().1);
        }
        drop(node);
        let mut node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), Config::default(), 0).unwrap();
        events.extend(node.handle_frames(&msgs[..2 * third], 0).unwrap().1);
        for chunk in msgs[2 * third..].chunks(3) {
            events.extend(node.handle_frames(chunk, 0).unwrap().1);
        }
        check_scopes(&name, &mut node.engine, &scn, true);
        let mut got: Vec<_> = events.into_iter().map(|e| (e.scope, e.op, e.kind, e.data)).collect();
        got.sort();
        assert_eq!(got, expected_events(&scn), "{name}: events across reopen, each once");
        // Event sequence numbers continue across reopen.
        for (scope, seq) in node.engine.event_seqs() {
            let n = expected_events(&scn).iter().filter(|e| e.0 == scope).count() as u64;
            assert_eq!(seq, n, "{name}: event seq of {}", hex::encode(scope));
        }
    }
}

#[test]
fn a_failed_write_refuses_everything_after() {
    let scn = scenario("01_causal_order");
    let msgs = messages(&scn);
    let mut store = MemStore::new();
    seed_identity(&mut store, &scn);
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    node.handle_frames(&msgs[..2], 0).unwrap();
    node.store.fail_after_writes = Some(0);
    assert!(matches!(node.handle_frames(&msgs[2..4], 0), Err(StoreError::Injected(_))));
    assert!(matches!(node.handle_frames(&msgs[4..], 0), Err(StoreError::Refusing(_))));
    // What is on "disk" is the state before the failure: reopening from it
    // gives a consistent engine holding the first two messages only.
    let disk = node.store.clone();
    let mut disk = disk;
    disk.fail_after_writes = None;
    let mut fresh = MemStore::new();
    for cf in Cf::ALL {
        disk.scan(cf, &mut |k, v| fresh.write(&[dagfold::core::Write::Put(cf, k.to_vec(), v.to_vec())], false).unwrap()).expect("the table reads back");
    }
    let reopened = InlineDriver::open(fresh, Config::default(), 0).unwrap();
    assert_eq!(reopened.engine.applied_total(), 1, "only the genesis was durable");
}

/// Reads the applied ops and keys of a store and folds them afresh.
fn fresh_fold_of_store(store: &RocksStore, identity: dagfold::core::Identity) -> Engine {
    let mut e = Engine::new(Config::default(), identity);
    store.scan(Cf::Keys, &mut |_, v| e.add_key(v.try_into().unwrap())).expect("the table reads back");
    let mut pending = std::collections::HashSet::new();
    store.scan(Cf::Pending, &mut |k, _| {
        pending.insert(k.to_vec());
    }).expect("the table reads back");
    let mut ops = Vec::new();
    // The ops table holds the pending ops too (each with a pending record).
    store.scan(Cf::Ops, &mut |k, _| {
        if !pending.contains(k) {
            ops.push(store.op(k.try_into().unwrap()).unwrap().unwrap())
        }
    }).expect("the table reads back");
    // Reverse id order: an arbitrary order, the cascade sorts it out.
    ops.reverse();
    for bytes in ops {
        let mut frame = vec![0u8];
        frame.extend(bytes);
        e.handle_frame(&frame, 0);
    }
    e
}

/// Checks a store left by a crash; returns (applied ops, ops stored).
fn check_store_consistent(dir: &std::path::Path, scn: &serde_json::Value) -> (u64, usize) {
    let store = RocksStore::open(dir).unwrap();
    let mut stored = 0;
    store.scan(Cf::Ops, &mut |_, _| stored += 1).expect("the table reads back");
    // Every applied op's dependencies are applied.
    let mut applied: HashMap<Hash, Vec<Hash>> = HashMap::new();
    let mut pending = std::collections::HashSet::new();
    store.scan(Cf::Pending, &mut |k, _| {
        pending.insert(k.to_vec());
    }).expect("the table reads back");
    store.scan(Cf::Ops, &mut |k, _| {
        if pending.contains(k) {
            return;
        }
        let op = decode_op(&store.op(k.try_into().unwrap()).unwrap().unwrap()).unwrap();
        let mut deps = op.parents.clone();
        if op.plane == PLANE_DATA {
            deps.extend(op.cut.iter().copied());
        }
        applied.insert(k.try_into().unwrap(), deps);
    }).expect("the table reads back");
    for (id, deps) in &applied {
        for d in deps {
            assert!(applied.contains_key(d), "applied op {} has unapplied dependency {}", hex::encode(id), hex::encode(d));
        }
    }
    let identity = node_identity(scn);
    let mut fresh = fresh_fold_of_store(&store, identity.clone());
    let mut reopened = InlineDriver::open(store, Config::default(), 0).unwrap();
    assert_eq!(reopened.engine.identity().public_key, identity.public_key);
    for scope in fresh.scope_ids() {
        let a = fresh.report(&scope).unwrap();
        let b = reopened.engine.report(&scope).unwrap_or_else(|| panic!("scope {} of the applied ops is restored", hex::encode(scope)));
        assert_eq!(a.applied, b.applied, "applied set of {}", hex::encode(scope));
        assert_eq!(a.root, b.root, "root = fold of the applied set");
        assert_eq!(a.data_heads, b.data_heads);
        assert_eq!(a.governance_heads, b.governance_heads);
    }
    // Buffered ops are exactly the stored ones, none applied.
    let buffered: BTreeSet<Hash> = reopened
        .engine
        .scope_ids()
        .iter()
        .flat_map(|s| {
            let r = reopened.engine.report(s).unwrap();
            r.pending.into_iter().chain(r.key_waiting)
        })
        .collect();
    for id in &buffered {
        assert!(!applied.contains_key(id));
    }
    (reopened.engine.applied_total(), stored)
}

fn frames_file(msgs: &[Vec<u8>]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for m in msgs {
        f.write_all(&(m.len() as u32).to_le_bytes()).unwrap();
        f.write_all(m).unwrap();
    }
    f.flush().unwrap();
    f
}

/// Bytes of the WAL files in a store's directory: how far an import that
/// commits (and syncs) every frame has got.
fn wal_bytes(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "log")).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

/// A fresh store holding the scenario's node identity.
fn seeded_store(scn: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    seed_identity(&mut store, scn);
    dir
}

#[test]
fn sigkill_during_import_leaves_a_consistent_store() {
    let scn = scenario("24_shuffled_large");
    let msgs = messages(&scn);
    let total = scn["expect"]["scopes"].as_array().unwrap().iter().map(|s| s["applied"].as_array().unwrap().len() as u64).sum::<u64>();
    let file = frames_file(&msgs);
    let bin = env!("CARGO_BIN_EXE_dagfold");
    let import = |dir: &std::path::Path, batch_frames: &str| {
        let mut c = Command::new(bin);
        c.args(["import", "--batch-frames", batch_frames, "--data-dir", dir.to_str().unwrap(), file.path().to_str().unwrap()]);
        c
    };
    // The WAL a whole import leaves: kills are aimed at fractions of it
    // (progress, not time: on a busy machine the import is slower, never
    // killed before it starts or after it ends).
    let whole = seeded_store(&scn);
    assert!(import(whole.path(), "1").output().unwrap().status.success());
    let wal_whole = wal_bytes(whole.path());
    assert!(wal_whole > 100_000, "a whole import leaves {wal_whole} bytes of WAL");
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..6 {
        let dir = seeded_store(&scn);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let percent = 5 + seed % 80;
        let kill_at = wal_whole * percent / 100;
        let mut child = import(dir.path(), "1").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while wal_bytes(dir.path()) < kill_at {
            assert!(child.try_wait().unwrap().is_none(), "round {round}: the import ended before {percent}% of its WAL");
            assert!(std::time::Instant::now() < deadline, "round {round}: the import did not reach {percent}% of its WAL");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "round {round}: the kill landed");
        let (applied, stored) = check_store_consistent(dir.path(), &scn);
        eprintln!("round {round}: killed at {percent}% of the WAL with {applied} ops applied, {stored} stored");
        assert!(stored > 0 && applied < total, "round {round}: killed mid-import ({stored} ops stored, {applied} of {total} applied)");
        // Importing everything again completes the state exactly.
        let out = import(dir.path(), &dagfold::cli::IMPORT_BATCH_FRAMES.to_string()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), Config::default(), 0).unwrap();
        check_scopes("24_shuffled_large after crash", &mut node.engine, &scn, true);
    }
}

#[test]
fn import_summary_and_truncated_input() {
    let scn = scenario("06_malformed_frames");
    let msgs = messages(&scn);
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = RocksStore::open(dir.path()).unwrap();
        seed_identity(&mut store, &scn);
    }
    let file = frames_file(&msgs);
    let bin = env!("CARGO_BIN_EXE_dagfold");
    let out = Command::new(bin).args(["import", "--data-dir", dir.path().to_str().unwrap(), file.path().to_str().unwrap()]).output().unwrap();
    assert!(out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let u = &scn["expect"]["unremembered_drops"];
    assert_eq!(summary["malformed"], u["malformed"]);
    assert_eq!(summary["bad_signature"], u["bad_signature"]);
    assert_eq!(summary["frames"].as_u64().unwrap(), msgs.len() as u64);
    // A length prefix past the end: a clear error with the offset; what came
    // before stays applied.
    let scn = scenario("01_causal_order");
    let msgs = messages(&scn);
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = RocksStore::open(dir.path()).unwrap();
        seed_identity(&mut store, &scn);
    }
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let mut offset = 0;
    for m in &msgs[..3] {
        f.write_all(&(m.len() as u32).to_le_bytes()).unwrap();
        f.write_all(m).unwrap();
        offset += 4 + m.len();
    }
    f.write_all(&1000u32.to_le_bytes()).unwrap();
    f.write_all(&[0u8; 10]).unwrap();
    f.flush().unwrap();
    let out = Command::new(bin).args(["import", "--data-dir", dir.path().to_str().unwrap(), f.path().to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("offset {offset}")), "{err}");
    let out = Command::new(bin).args(["inspect", "--data-dir", dir.path().to_str().unwrap()]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "the genesis before the bad frame is applied");
}

#[test]
fn identity_is_created_once_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_dagfold");
    let a = Command::new(bin).args(["identity", "--data-dir", dir.path().to_str().unwrap()]).output().unwrap();
    let b = Command::new(bin).args(["identity", "--data-dir", dir.path().to_str().unwrap()]).output().unwrap();
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["public_key"].as_str().unwrap().len(), 64);
    assert_eq!(v["kem_public_key"].as_str().unwrap().len(), 64);
}

/// An op buffered and released within one commit never reaches the disk;
/// one still buffered at the commit does.
#[test]
fn buffer_records_within_one_commit_cancel_out() {
    let scn = scenario("02_reversed_delivery");
    let msgs = messages(&scn);
    let mut store = MemStore::new();
    seed_identity(&mut store, &scn);
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    let half = msgs.len() / 2;
    node.handle_frames(&msgs[..half], 0).unwrap();
    let pending_on_disk = node.store.table(Cf::Pending).map(|t| t.len()).unwrap_or(0);
    let (buffered, _) = node.engine.buffered_total();
    assert!(buffered > 0);
    assert_eq!(pending_on_disk + node.store.table(Cf::KeyWaits).map(|t| t.len()).unwrap_or(0), buffered as usize);
    node.handle_frames(&msgs[half..], 0).unwrap();
    assert_eq!(node.store.table(Cf::Pending).map(|t| t.len()).unwrap_or(0), 0);
    check_scopes("02 in two commits", &mut node.engine, &scn, true);
    // All in one commit: no pending record is ever written.
    let mut store = MemStore::new();
    seed_identity(&mut store, &scn);
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    node.handle_frames(&msgs, 0).unwrap();
    assert!(node.store.table(Cf::Pending).is_none_or(|t| t.is_empty()));
    check_scopes("02 in one commit", &mut node.engine, &scn, true);
}

/// The event log holds one record per commit and scope; reading from any
/// sequence number, across record boundaries, gives each event once.
#[test]
fn event_log_reads_from_any_sequence_number() {
    let id = dagfold::core::Identity::from_secrets([9; 32], [10; 32]);
    let w = dagfold::workload::generate(
        &dagfold::workload::WorkloadConfig { data_ops: 120, events_per_op: 2, ..Default::default() },
        id.public_key,
        id.kem_public,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    store.write(&[dagfold::core::Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    let mut all = Vec::new();
    for (i, chunk) in frames.chunks(7).enumerate() {
        let take = if i % 3 == 0 { chunk.len() } else { 1 };
        all.extend(node.handle_frames(&chunk[..take], 0).unwrap().1);
        all.extend(node.handle_frames(&chunk[take..], 0).unwrap().1);
    }
    assert_eq!(all.len(), 240);
    let reader = node.store.reader();
    for from in [1u64, 2, 3, 50, 51, 239, 240] {
        let got = reader.events(&w.scope, from, 240, 10_000).unwrap();
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (from..=240).collect::<Vec<_>>(), "from {from}");
        for (seq, v) in &got {
            let e = &all[*seq as usize - 1];
            assert_eq!(&v[..32], e.op.as_slice());
        }
    }
    assert_eq!(reader.events(&w.scope, 10, 20, 5).unwrap().len(), 5, "bounded by max");
    assert!(reader.events(&w.scope, 241, 300, 10).unwrap().is_empty());
}

/// With a small in-memory index, applied ops move to the cold index (the
/// store's ops table) and are answered from there: a duplicate of an old op
/// is a duplicate, an op naming an old op as parent applies, an op naming
/// an old governance op as parent is `wrong_plane`, and after a reopen the
/// same holds while the in-memory index starts empty.
#[test]
fn the_cold_index_answers_for_ops_that_left_memory() {
    use dagfold::core::{OpState, Outcome, Reason};
    use dagfold::workload::{generate, sign_op, WorkloadConfig};
    let id = dagfold::core::Identity::from_secrets([11; 32], [12; 32]);
    let w = generate(&WorkloadConfig { data_ops: 1_500, rotate_at: Some(700), ..Default::default() }, id.public_key, id.kem_public);
    let cfg = Config { hot_applied_max: 50, cold_filter_bytes: 4_096, ..Config::default() };
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    store.write(&[dagfold::core::Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
    let mut node = InlineDriver::open(store, cfg.clone(), 0).unwrap();
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    for chunk in frames.chunks(20) {
        node.handle_frames(chunk, 0).unwrap();
    }
    let applied = node.engine.applied_total();
    assert_eq!(applied, w.messages.iter().filter(|m| m.id != [0; 32]).count() as u64);
    let (indexed, _) = node.engine.index_sizes();
    assert!(indexed <= 50 + 2 * 20, "{indexed} ops in memory");
    assert!(node.engine.stats.cold_evicted > 1_400);
    let status = node.engine.status(&w.scope).unwrap();
    assert_eq!(status.root, w.final_root);

    // An early data op and an early governance op, long gone from memory.
    let first_data = w.messages.iter().find(|m| m.is_data).unwrap();
    let genesis = &w.messages[0];
    assert_eq!(node.engine.op_state(&first_data.id), OpState::Applied);
    let old = decode_op(&first_data.frame[1..]).unwrap();
    let author = w.writers.iter().find(|m| m.public_key == old.author).unwrap();
    let child = |parents: Vec<Hash>, later: u64| {
        let mut op = old.clone();
        op.parents = parents;
        op.hlc = old.hlc + 1 + later;
        sign_op(&mut op, author).0
    };

    for round in 0..2 {
        let (outcomes, _) = node.handle_frames(&frames, 0).unwrap();
        assert!(
            outcomes.iter().zip(&w.messages).all(|(o, m)| m.id == [0; 32] || *o == Outcome::Duplicate),
            "round {round}: every op again is a duplicate"
        );
        assert_eq!(node.engine.applied_total(), applied + round);
        let (o, _) = node.handle_frames(&[child(vec![genesis.id], round)], 0).unwrap();
        assert_eq!(o, vec![Outcome::Dropped(Reason::WrongPlane)], "round {round}");
        if round == 0 {
            let (o, _) = node.handle_frames(&[child(vec![first_data.id], 0)], 0).unwrap();
            assert_eq!(o, vec![Outcome::Applied]);
        }
        assert!(node.engine.stats.cold_hits > 0);
        drop(node);
        node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), cfg.clone(), 0).unwrap();
        // In memory: the remembered drops only (one per round so far).
        assert_eq!(node.engine.index_sizes().0, round as usize + 1, "reopened with nothing applied in memory");
        assert_eq!(node.engine.applied_total(), applied + 1);
        assert_eq!(node.engine.op_state(&first_data.id), OpState::Applied);
    }
}

/// A cascade committed in parts (`set_cascade_budget`, as the node does):
/// every part is a consistent store, a crash between parts is healed by
/// reopening (which judges the rest), and going on to the end gives the
/// state of one cascade.
#[test]
fn a_cascade_committed_in_parts_survives_a_crash_between_them() {
    let scn = scenario("02_reversed_delivery");
    let msgs = messages(&scn);
    let mut store = MemStore::new();
    seed_identity(&mut store, &scn);
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    node.engine.set_cascade_budget(3);
    node.handle_frames(&msgs, 0).unwrap();
    let mut parts = 1;
    let mut crashed_between = 0;
    while node.engine.cascade_remaining() {
        // The store now holds pending ops whose dependencies are all applied.
        // (The ops table holds every pending op's encoding, and applied
        // ops are those without a pending record.)
        let ops = node.store.table(Cf::Ops).unwrap();
        let ready = node.store.table(Cf::Pending).map_or(0, |t| {
            t.keys()
                .filter(|k| {
                    let op = decode_op(&ops[*k]).unwrap();
                    let ready = op.dependencies().all(|d| ops.contains_key(d.as_slice()) && !t.contains_key(d.as_slice()));
                    ready
                })
                .count()
        });
        assert!(ready > 0, "part {parts}: the rest of the cascade is on disk, ready");
        // A crash here: reopening judges the rest and gives the final state.
        let mut reopened = InlineDriver::open(node.store.clone(), Config::default(), 0).unwrap();
        assert!(!reopened.engine.cascade_remaining());
        check_scopes(&format!("02 reopened after part {parts}"), &mut reopened.engine, &scn, true);
        crashed_between += 1;
        node.engine.continue_cascade(0);
        node.commit().unwrap();
        parts += 1;
    }
    assert!(parts > 3, "the cascade went in {parts} parts");
    assert_eq!(crashed_between, parts - 1);
    check_scopes("02 in parts", &mut node.engine, &scn, true);
}

/// A thread's niceness, from /proc (field 19 of its stat).
#[cfg(target_os = "linux")]
fn niceness(stat: &str) -> i32 {
    stat.rsplit_once(')').unwrap().1.split_whitespace().nth(16).unwrap().parse().unwrap()
}

#[cfg(target_os = "linux")]
#[test]
fn rocksdb_flush_threads_run_niced_and_compaction_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let _store = RocksStore::open(dir.path()).unwrap();
    let (mut flush, mut compaction) = (Vec::new(), Vec::new());
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
        if comm.starts_with("rocksdb:high") {
            flush.push(niceness(&stat));
        } else if comm.starts_with("rocksdb:low") {
            compaction.push(niceness(&stat));
        }
    }
    assert!(!flush.is_empty(), "RocksDB's flush threads are started by the open");
    assert!(!compaction.is_empty(), "RocksDB's compaction threads are started by the open");
    // Relative to the niceness the suite runs at (`nice -n 19 cargo test`
    // starts every thread there): the flush threads are raised to
    // FLUSH_NICE, never lowered; compaction keeps the process's.
    // SAFETY: getpriority of this process has no memory effects.
    let process = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let flush_nice = process.max(dagfold::store::rocks::FLUSH_NICE);
    assert!(flush.iter().all(|n| *n == flush_nice), "flush threads at {flush:?}, the process at {process}");
    assert!(compaction.iter().all(|n| *n == process), "compaction at {compaction:?}, the process at {process}");
    if process >= dagfold::store::rocks::FLUSH_NICE {
        eprintln!(
            "the suite runs at niceness {process}, at or past FLUSH_NICE ({}): that the flush threads are niced below compaction cannot be seen here",
            dagfold::store::rocks::FLUSH_NICE
        );
    }
}

/// The index of cells by entity (`Cf::Items`) is written with the cells;
/// a store written before it (cells, no index records) gets it built at
/// open, the same records; a store that has it is left as it is.
#[test]
fn the_cell_index_is_written_with_the_cells_and_built_for_an_older_store() {
    let items = |store: &RocksStore| {
        let mut records = Vec::new();
        store.scan(Cf::Items, &mut |k, v| records.push((k.to_vec(), v.to_vec()))).expect("the table reads back");
        records
    };
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    let id = dagfold::store::load_or_create_identity(&mut store).unwrap();
    let cfg = dagfold::workload::WorkloadConfig { seed: 5, data_ops: 300, writers: 2, ..Default::default() };
    let w = dagfold::workload::generate(&cfg, id.public_key, id.kem_public);
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    node.handle_frames(&frames, 0).unwrap();
    let written = items(&node.store);
    let mut cells = 0;
    node.store.scan(Cf::Projection, &mut |_, _| cells += 1).expect("the table reads back");
    assert!(cells > 0);
    let entities = written.iter().filter(|(k, _)| k[32] == 0).count();
    assert_eq!(written.len() - entities, cells, "one index record a cell");
    assert!((1..=4).contains(&entities), "the workload's entities e0..e3: {entities}");
    drop(node);

    // Reopened with its index: nothing written.
    let node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), Config::default(), 0).unwrap();
    assert_eq!(items(&node.store), written);
    // As an older store: the index records deleted, then reopened.
    // The engine's cold index holds the database open too.
    let InlineDriver { engine, mut store, .. } = node;
    drop(engine);
    let deletes: Vec<dagfold::core::Write> = written.iter().map(|(k, _)| dagfold::core::Write::Delete(Cf::Items, k.clone())).collect();
    store.write(&deletes, true).unwrap();
    store.flush().unwrap();
    drop(store);
    let node = InlineDriver::open(RocksStore::open(dir.path()).unwrap(), Config::default(), 0).unwrap();
    assert_eq!(items(&node.store), written, "built at open, the same records");
}

/// `--memtable-bytes-max` (`RocksStore::open_tuned`): 400 KB of ops
/// through memtables capped at 64 KiB reach table files without a flush
/// asked for; uncapped (32 MiB), the same writes stay in the memtable.
#[test]
fn a_memtable_cap_flushes_small_tables() {
    use dagfold::core::Write;
    let table_files = |dir: &std::path::Path| {
        std::fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "sst")).count()
    };
    for cap in [Some(64 << 10), None] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut s = RocksStore::open_tuned(&path, cap).unwrap();
        for i in 0u32..400 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_be_bytes());
            s.write(&[Write::Put(Cf::Ops, key.to_vec(), vec![7; 1000])], false).unwrap();
        }
        // Flushes run in the background: wait for one (or, uncapped, for
        // the time one would take).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while table_files(&path) == 0 && cap.is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if cap.is_some() {
            assert!(table_files(&path) > 0, "capped: flushed to table files");
        } else {
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(table_files(&path), 0, "uncapped: still in the memtable");
        }
    }
}

#[test]
fn table_bytes_are_counted_per_table_in_memtables_then_files() {
    use dagfold::core::{Cf, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    let bytes = |store: &RocksStore, cf: Cf| store.table_bytes().into_iter().find(|(c, ..)| *c == cf).map(|(_, f, m)| (f, m)).unwrap();
    let (files0, _) = bytes(&store, Cf::Ops);
    assert_eq!(files0, 0);
    let writes: Vec<Write> = (0..2000u32).map(|i| Write::Put(Cf::Ops, i.to_be_bytes().to_vec(), vec![i as u8; 300])).collect();
    store.write(&writes, false).unwrap();
    let (_, mem) = bytes(&store, Cf::Ops);
    assert!(mem > 0, "the puts are in the ops table's memtable");
    store.flush().unwrap();
    let (files, _) = bytes(&store, Cf::Ops);
    assert!(files > 10_000, "the ops table's files hold the puts (LZ4-compressed): {files} bytes");
    assert_eq!(bytes(&store, Cf::Items).0, 0, "another table's are its own");
}

/// The ops table stores an op in fewer bytes than it was signed: LZ4 over
/// 16 KiB blocks finds the scope, author, key id and cut the ops beside
/// it repeat: 0.83 of the signed bytes for these 20,000 ops, where RocksDB's
/// default 4 KiB blocks kept 0.88 (`store::rocks`, docs/PERFORMANCE.md).
/// Deterministic: the same ops compress the same.
#[test]
fn the_ops_table_keeps_an_op_in_fewer_bytes_than_it_was_signed() {
    use dagfold::workload::{generate, WorkloadConfig};
    let id = dagfold::core::Identity::from_secrets([11; 32], [12; 32]);
    let w = generate(&WorkloadConfig { data_ops: 20_000, view_lag: Some(4), ..Default::default() }, id.public_key, id.kem_public);
    let ops: Vec<&dagfold::workload::Generated> = w.messages.iter().filter(|m| m.id != [0; 32]).collect();
    let signed: usize = ops.iter().map(|m| m.frame.len() - 1).sum();
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    for chunk in ops.chunks(500) {
        let writes: Vec<dagfold::core::Write> =
            chunk.iter().map(|m| dagfold::core::Write::Put(Cf::Ops, m.id.to_vec(), m.frame[1..].to_vec())).collect();
        store.write(&writes, false).unwrap();
    }
    store.flush().unwrap();
    let (_, files, _) = store.table_bytes().into_iter().find(|t| t.0 == Cf::Ops).unwrap();
    let (per_op, signed_per_op) = (files as f64 / ops.len() as f64, signed as f64 / ops.len() as f64);
    eprintln!("the ops table: {per_op:.1} B/op, {signed_per_op:.1} B/op as signed");
    assert!(per_op < 0.85 * signed_per_op, "{per_op:.1} B/op stored, {signed_per_op:.1} as signed");
}

/// An applied data op is stored by the engine smaller than it was signed:
/// its parents, applied ops in the same table, by their ids' first 16
/// bytes (`core::oprecord`), which saves 16 bytes for each of the ~2.5
/// parents of these ops; and every op reads back byte for byte as it was
/// signed (`Store::op`), after a reopen too. The table's share of the
/// signed bytes is deterministic: the same ops, the same records.
#[test]
fn an_applied_op_is_stored_by_reference_to_its_parents_and_reads_back_as_signed() {
    use dagfold::core::oprecord;
    use dagfold::workload::{generate, WorkloadConfig};
    let id = dagfold::core::Identity::from_secrets([11; 32], [12; 32]);
    let w = generate(&WorkloadConfig { data_ops: 20_000, view_lag: Some(4), ..Default::default() }, id.public_key, id.kem_public);
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    let ops: Vec<&dagfold::workload::Generated> = w.messages.iter().filter(|m| m.id != [0; 32]).collect();
    let signed: usize = ops.iter().map(|m| m.frame.len() - 1).sum();
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    store.write(&[dagfold::core::Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    for chunk in frames.chunks(500) {
        node.handle_frames(chunk, 0).unwrap();
    }
    let scope = w.scope;
    assert_eq!(node.engine.status(&scope).unwrap().applied as usize, ops.len(), "every op applied");
    node.store.flush().unwrap();
    let (_, files, _) = node.store.table_bytes().into_iter().find(|t| t.0 == Cf::Ops).unwrap();
    let (per_op, signed_per_op) = (files as f64 / ops.len() as f64, signed as f64 / ops.len() as f64);
    eprintln!("the ops table through the engine: {per_op:.1} B/op, {signed_per_op:.1} B/op as signed");
    // 0.83 with every op stored as signed (the test above).
    assert!(per_op < 0.78 * signed_per_op, "{per_op:.1} B/op stored, {signed_per_op:.1} as signed");
    let mut compact = 0;
    node.store
        .scan(Cf::Ops, &mut |_, v| compact += usize::from(oprecord::is_compact(v)))
        .expect("the table reads back");
    let with_parents = ops
        .iter()
        .filter(|m| {
            let op = decode_op(&m.frame[1..]).unwrap();
            op.plane == PLANE_DATA && !op.parents.is_empty()
        })
        .count();
    assert_eq!(compact, with_parents, "every data op with parents, and no other, is stored by reference");
    drop(node);
    let store = RocksStore::open(dir.path()).unwrap();
    let reader = store.reader();
    for m in &ops {
        assert_eq!(store.op(&m.id).unwrap().as_deref(), Some(&m.frame[1..]), "the store gives the op as signed");
        assert_eq!(reader.op(&m.id).unwrap().as_deref(), Some(&m.frame[1..]), "and so does its reader");
    }
}
