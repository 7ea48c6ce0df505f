//! Storage faults as a countdown (redb's fuzzer, RocksDB's db_stress): a
//! small scenario through the inline driver on a store that fails its N-th
//! operation (a write, a read, a read of the cold index), for every N the
//! scenario makes. The step the fault lands in is an error, and so is every
//! later one, with nothing more written; reopened on what the store holds,
//! the engine equals the model, a run without faults after the same number
//! of acknowledged commits (every acknowledged op there, nothing
//! half-applied); fed the whole scenario again it ends where that run ends,
//! every event handed out once, and a restart after that agrees.
//! docs/RELIABILITY.md, "Storage faults as a countdown".

use dagfold::core::{Cf, Config, EventOut, Identity, Outcome, ScopeStatus, Write, META_IDENTITY};
use dagfold::durable::InlineDriver;
use dagfold::store::faulty::{Countdown, FaultyStore};
use dagfold::store::memory::MemStore;
use dagfold::store::{Store, StoreError};
use dagfold::workload::{generate, WorkloadConfig};

/// Data ops of the scenario run for every N in the suite (~1 s in all).
const DATA_OPS: usize = 24;

fn identity() -> Identity {
    Identity::from_secrets([41; 32], [42; 32])
}

/// Few applied ops in memory: duplicates and dependencies are read back
/// from the store (the cold index), and those reads count too.
fn config() -> Config {
    Config { hot_applied_max: 4, cold_filter_bytes: 4096, ..Config::default() }
}

/// The workload's messages (a genesis, members, key deliveries, a key
/// rotation halfway, data ops of three writers).
fn messages(data_ops: usize) -> Vec<Vec<u8>> {
    let id = identity();
    let cfg = WorkloadConfig { seed: 7, writers: 3, data_ops, rotate_at: Some(data_ops / 2), ..Default::default() };
    generate(&cfg, id.public_key, id.kem_public).messages.into_iter().map(|m| m.frame).collect()
}

/// The scenario's steps, one commit each: the messages in chunks of four,
/// each reversed (ops wait on each other: pending, then a cascade), each
/// but the first two followed by the chunk two before it again (duplicates
/// of ops the in-memory index has let go).
fn steps(data_ops: usize) -> Vec<Vec<Vec<u8>>> {
    let chunks: Vec<Vec<Vec<u8>>> = messages(data_ops).chunks(4).map(|c| c.iter().rev().cloned().collect()).collect();
    let mut steps = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        steps.push(c.clone());
        if i >= 2 {
            steps.push(chunks[i - 2].clone());
        }
    }
    steps
}

/// A store holding the node's identity (written outside the countdown), so
/// that the key deliveries addressed to it open.
fn seeded(countdown: Option<u64>) -> FaultyStore {
    let mut store = MemStore::new();
    store.write(&[Write::Put(Cf::Meta, META_IDENTITY.to_vec(), identity().encode())], true).unwrap();
    FaultyStore::new(store, Countdown::new(countdown))
}

/// What a restart finds in `store`, opened without faults.
fn reopen(store: &FaultyStore) -> InlineDriver<FaultyStore> {
    let durable = store.durable.lock().unwrap().reopened();
    InlineDriver::open(FaultyStore::new(durable, Countdown::new(None)), config(), 0).expect("reopening")
}

/// What the model compares: each scope's status, without the data ops
/// waiting in memory for a key (a restart forgets them: SPEC §6 step 4),
/// and the ops applied in all.
#[derive(Debug, PartialEq, Eq)]
struct State {
    statuses: Vec<ScopeStatus>,
    applied: u64,
}

fn state(node: &mut InlineDriver<FaultyStore>) -> State {
    let e = &mut node.engine;
    let statuses = e.scope_ids().iter().filter_map(|s| e.status(s)).map(|s| ScopeStatus { data_key_waiting: 0, ..s }).collect();
    State { statuses, applied: e.applied_total() }
}

/// The run without faults: the state once opened and after each step, the
/// events, and the store operations it made.
struct Model {
    states: Vec<State>,
    events: Vec<EventOut>,
    operations: u64,
}

fn model(steps: &[Vec<Vec<u8>>]) -> Model {
    let store = seeded(None);
    let mut node = InlineDriver::open(store.clone(), config(), 0).unwrap();
    let mut states = vec![state(&mut node)];
    let mut events = Vec::new();
    for s in steps {
        events.extend(node.handle_frames(s, 0).unwrap().1);
        states.push(state(&mut node));
    }
    assert!(node.engine.stats.cold_hits > 0, "the scenario reads the cold index");
    Model { states, events, operations: store.countdown.done() }
}

/// Each scope's events once, numbered from 1 without a gap, and the same
/// as the model's (by op, kind and data: the order of a scope's events
/// may differ once a restart made its ops come in another order).
fn check_events(n: u64, got: &[EventOut], model: &[EventOut]) {
    let key = |e: &EventOut| (e.scope, e.op, e.kind.clone(), e.data.clone());
    let mut seqs: Vec<_> = got.iter().map(|e| (e.scope, e.seq)).collect();
    seqs.sort();
    for (i, w) in seqs.windows(2).enumerate() {
        assert!(w[0].0 != w[1].0 || w[1].1 == w[0].1 + 1, "N={n}: event seqs {:?} at {i}", w);
    }
    let (mut got, mut want): (Vec<_>, Vec<_>) = (got.iter().map(key).collect(), model.iter().map(key).collect());
    got.sort();
    want.sort();
    assert_eq!(got, want, "N={n}: the events, each once");
}

/// One run whose `n`-th store operation fails, checked against the model.
fn check_fault_at(n: u64, steps: &[Vec<Vec<u8>>], model: &Model) {
    let store = seeded(Some(n));
    let mut acked = 0usize;
    let mut events = Vec::new();
    let mut fault: Option<(StoreError, u64)> = None;
    match InlineDriver::open(store.clone(), config(), 0) {
        Err(e) => fault = Some((e, store.durable.lock().unwrap().writes)),
        Ok(mut node) => {
            for s in steps {
                match node.handle_frames(s, 0) {
                    Ok((_, ev)) => {
                        assert!(fault.is_none() && !store.countdown.landed(), "N={n}: a step succeeded after the fault");
                        acked += 1;
                        events.extend(ev);
                    }
                    Err(e) if fault.is_none() => fault = Some((e, store.durable.lock().unwrap().writes)),
                    Err(e) => assert!(matches!(e, StoreError::Refusing(_) | StoreError::ColdRead(_)), "N={n}: after the fault: {e}"),
                }
            }
        }
    }
    assert!(store.countdown.landed(), "N={n}: the fault landed");
    let (e, writes) = fault.unwrap_or_else(|| panic!("N={n}: the fault stopped nothing"));
    assert!(matches!(e, StoreError::Injected(_) | StoreError::ColdRead(_)), "N={n}: {e}");
    assert_eq!(store.durable.lock().unwrap().writes, writes, "N={n}: nothing written after the fault ({e})");
    let mut node = reopen(&store);
    assert_eq!(state(&mut node), model.states[acked], "N={n} ({e}): reopened after {acked} acknowledged steps");
    for s in steps {
        events.extend(node.handle_frames(s, 0).unwrap().1);
    }
    assert_eq!(state(&mut node), *model.states.last().unwrap(), "N={n}: the whole scenario again");
    check_events(n, &events, &model.events);
    assert_eq!(state(&mut reopen(&node.store)), *model.states.last().unwrap(), "N={n}: restarted once more");
}

/// Every N over the scenario: the N-th write, read or read of the cold
/// index fails.
#[test]
fn a_fault_at_every_store_operation_stops_writing_and_reopens_as_the_model() {
    countdown(DATA_OPS);
}

/// The long version (docs/RELIABILITY.md): `DAGFOLD_COUNTDOWN_DATA_OPS` data
/// ops, 200 unless set; `cargo test --release --test faults -- --ignored`.
#[test]
#[ignore]
fn countdown_long() {
    let data_ops = std::env::var("DAGFOLD_COUNTDOWN_DATA_OPS").map_or(200, |v| v.parse().expect("a number of data ops"));
    countdown(data_ops);
}

fn countdown(data_ops: usize) {
    let t = std::time::Instant::now();
    let steps = steps(data_ops);
    let model = model(&steps);
    assert!(model.operations > steps.len() as u64, "reads counted beside the writes");
    for n in 1..=model.operations {
        check_fault_at(n, &steps, &model);
    }
    eprintln!(
        "countdown: {data_ops} data ops in {} steps; a fault at each of the {} store operations, every one checked, in {:.1} s",
        steps.len(),
        model.operations,
        t.elapsed().as_secs_f64()
    );
}

/// A duplicate of an op the in-memory index let go, whose read back from
/// the store fails: an error, never "unknown" (it was taken for unknown,
/// applied again with a second event, and the next restart panicked on the
/// scope's applied count).
#[test]
fn a_failed_cold_read_is_an_error_never_unknown() {
    let msgs = messages(DATA_OPS);
    let store = seeded(None);
    let mut node = InlineDriver::open(store.clone(), config(), 0).unwrap();
    assert!(!node.handle_frames(&msgs, 0).unwrap().1.is_empty());
    let applied = node.engine.applied_total();
    let reads = node.engine.stats.cold_reads;
    // The first data op (after the genesis, the members and the key).
    let first_data = msgs.iter().find(|m| dagfold::core::decode_frame(m).is_ok_and(|d| is_data(&d))).unwrap();
    store.countdown.fail_next();
    assert_eq!(node.engine.handle_frame(first_data, 0), Outcome::StoreFailed);
    assert!(store.countdown.landed());
    assert_eq!(node.engine.stats.cold_reads, reads + 1, "read back from the store");
    let writes = store.durable.lock().unwrap().writes;
    assert!(matches!(node.commit(), Err(StoreError::ColdRead(_))));
    assert!(matches!(node.handle_frames(&msgs[..1], 0), Err(StoreError::ColdRead(_))), "and at every later commit");
    assert_eq!(store.durable.lock().unwrap().writes, writes, "nothing written");
    let mut node = reopen(&store);
    assert_eq!(node.engine.applied_total(), applied);
    let (outcomes, again) = node.handle_frames(&msgs, 0).unwrap();
    assert!(again.is_empty(), "no second event");
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Duplicate | Outcome::KeyIgnored)), "{outcomes:?}");
    assert_eq!(reopen(&node.store).engine.applied_total(), applied);
}

fn is_data(d: &dagfold::core::Decoded) -> bool {
    matches!(d, dagfold::core::Decoded::Op { op, .. } if op.plane == dagfold::protocol::PLANE_DATA)
}

/// The same through the node's pipeline: the orderer's engine stops on the
/// failed read, the node refuses from then on, saying why, and nothing more
/// is written.
#[test]
fn a_failed_cold_read_stops_the_pipeline() {
    use dagfold::core::{decode_frame, Decoded};
    use dagfold::pipeline::{Pipeline, PipelineConfig, Work};
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let work_of = |frame: &[u8]| match decode_frame(frame).expect("generated frames decode") {
        Decoded::Op { id, op, bytes } => Work::Op { id, op, bytes, conn: 1, host: None },
        Decoded::Key(kd) => Work::Key { kd, host: None },
    };
    let msgs = messages(DATA_OPS);
    let store = seeded(None);
    // Opened as the node opens it: restored, with the store's cold index.
    let engine = InlineDriver::open(store.clone(), config(), 0).unwrap().engine;
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let pipeline = Pipeline::start(PipelineConfig { applied_bytes: false, ..Default::default() }, engine, store.clone(), rx, Box::new(|_| {}));
    let applied = || pipeline.shared.status.read().unwrap().values().map(|s| s.applied).sum::<u64>();
    let t = Instant::now();
    // In two halves, each waited for: the second's commits let the first
    // data op leave the in-memory index (its commit is durable by then).
    let half = msgs.len() / 2;
    for (part, upto) in [(&msgs[..half], half), (&msgs[half..], msgs.len())] {
        let mut inline = InlineDriver::open(seeded(None), config(), 0).unwrap();
        inline.handle_frames(&msgs[..upto], 0).unwrap();
        let expected = inline.engine.applied_total();
        for m in part {
            tx.blocking_send(work_of(m)).unwrap();
        }
        while applied() < expected {
            assert!(t.elapsed() < Duration::from_secs(60), "applied {} of {expected}", applied());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let expected = applied();
    let writes = store.durable.lock().unwrap().writes;
    store.countdown.fail_next();
    // The first data op again: the duplicate check reads it back.
    // Again until it is read back: a duplicate found in memory (the orderer
    // lets ops go between commits) makes no store operation.
    let first_data = msgs.iter().find(|m| decode_frame(m).is_ok_and(|d| is_data(&d))).unwrap();
    while !store.countdown.landed() {
        tx.blocking_send(work_of(first_data)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(60), "never read back");
        std::thread::sleep(Duration::from_millis(20));
    }
    while !pipeline.shared.refusing.load(Ordering::SeqCst) {
        assert!(t.elapsed() < Duration::from_secs(60), "not refusing");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(store.countdown.landed());
    let why = pipeline.shared.refusing_reason.lock().unwrap().clone().unwrap();
    assert!(why.contains("injected"), "{why}");
    for m in &msgs {
        tx.blocking_send(work_of(m)).unwrap();
    }
    drop(tx);
    pipeline.join();
    assert_eq!(store.durable.lock().unwrap().writes, writes, "nothing written after the failed read");
    assert_eq!(reopen(&store).engine.applied_total(), expected);
}

