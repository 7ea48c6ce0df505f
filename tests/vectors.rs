//! Every file of `../shared/vectors`, read at test time, reproduced exactly.

mod common;

use common::*;
use std::sync::{Arc, Mutex};

use dagfold::core::{decode_frame, Cf, Config, Decoded, Engine, EventOut, ScopeReport, TableScan, Write};
use dagfold::pipeline::{Pipeline, PipelineConfig, Work};
use dagfold::store::memory::MemStore;
use dagfold::store::{Store, StoreError};
use dagfold::protocol::codec::{decode_cell, decode_data_payload, decode_gov_payload, decode_op, op_body};
use dagfold::protocol::crypto::*;
use dagfold::protocol::*;
use serde_json::Value;

fn check_scenario(path: &std::path::Path, order: &[usize], check_counts: bool) {
    let scn = load_json(path.strip_prefix(vectors_dir()).unwrap().to_str().unwrap());
    let name = scn["name"].as_str().unwrap().to_owned();
    let msgs = messages(&scn);
    let mut engine = Engine::new(Config::default(), node_identity(&scn));
    let mut events: Vec<EventOut> = Vec::new();
    for &i in order {
        engine.handle_frame(&msgs[i], 0);
        events.extend(engine.take_commit().unwrap().events);
    }
    let in_given_order = order.iter().copied().eq(0..msgs.len());
    let order_dependent = scn["divergences_order_dependent"].as_bool().unwrap_or(false)
        || scn["divergences_cascade_dependent"].as_bool().unwrap_or(false);
    check_scopes(&name, &mut engine, &scn, in_given_order || !order_dependent);
    if check_counts {
        let u = &scn["expect"]["unremembered_drops"];
        assert_eq!(engine.stats.malformed, u["malformed"].as_u64().unwrap(), "{name}: malformed");
        assert_eq!(engine.stats.bad_signature, u["bad_signature"].as_u64().unwrap(), "{name}: bad_signature");
    }
    let mut got: Vec<_> = events.into_iter().map(|e| (e.scope, e.op, e.kind, e.data)).collect();
    got.sort();
    assert_eq!(got, expected_events(&scn), "{name}: events");
}

#[test]
fn scenarios_in_given_order() {
    for path in scenario_files() {
        let n = messages(&load_json(path.strip_prefix(vectors_dir()).unwrap().to_str().unwrap())).len();
        check_scenario(&path, &(0..n).collect::<Vec<_>>(), true);
    }
}

/// SPEC vectors README: every expectation but order-dependent divergences
/// holds for any permutation; duplicates change nothing but the counts.
#[test]
fn scenarios_shuffled_and_duplicated() {
    let mut rng_state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    for path in scenario_files() {
        let n = messages(&load_json(path.strip_prefix(vectors_dir()).unwrap().to_str().unwrap())).len();
        for round in 0..3 {
            let mut order: Vec<usize> = (0..n).collect();
            if round == 2 {
                order.reverse();
            } else {
                for i in (1..n).rev() {
                    order.swap(i, (next() % (i as u64 + 1)) as usize);
                }
            }
            let shuffled_only = order.clone();
            // Duplicate every fifth message somewhere later.
            for i in (0..n).step_by(5) {
                let at = (next() % (order.len() as u64 + 1)) as usize;
                order.insert(at, shuffled_only[i]);
            }
            check_scenario(&path, &shuffled_only, true);
            check_scenario(&path, &order, false);
        }
    }
}

/// A store the test keeps a handle on while the pipeline owns it.
#[derive(Clone, Default)]
struct SharedStore(Arc<Mutex<MemStore>>);

impl TableScan for SharedStore {
    fn scan(&self, cf: Cf, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), dagfold::core::ScanFailed> {
        self.0.lock().unwrap().scan(cf, f)
    }
}

impl Store for SharedStore {
    fn write(&mut self, writes: &[Write], sync: bool) -> Result<(), StoreError> {
        self.0.lock().unwrap().write(writes, sync)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.lock().unwrap().get(cf, key)
    }

    fn op_ids_with_prefix(&self, prefix: &[u8], max: usize) -> Result<Vec<dagfold::protocol::Hash>, StoreError> {
        self.0.lock().unwrap().op_ids_with_prefix(prefix, max)
    }
}

/// Every scenario through the node's pipeline, where the fold runs on the
/// projector thread after the orderer: what it publishes (statuses, with
/// the projector's roots), what it makes durable (read back by a fresh
/// engine: cells, heads, verdicts, the divergences the projector counted
/// into the scope records) and the events it hands out equal the
/// scenario's expectation. Data ops waiting for a key are left out of the
/// comparison with the store: their wait is in memory, and only those
/// woken from a pending wait keep a record, which a restore judges again
/// (into a key wait once more, with the key still missing). With one
/// projector thread, with one shard in two threads (the cells' fold, then
/// the trees), and with the fold split into three shards by scope, two
/// threads each.
#[test]
fn scenarios_through_the_pipeline() {
    for (path, shards, split) in scenario_files().into_iter().flat_map(|p| [(p.clone(), 1, false), (p.clone(), 1, true), (p, 3, true)]) {
        let scn = load_json(path.strip_prefix(vectors_dir()).unwrap().to_str().unwrap());
        let name = format!("{} ({shards} projector shards, split {split})", scn["name"].as_str().unwrap());
        let store = SharedStore::default();
        let events = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        let cfg = PipelineConfig { applied_bytes: false, projector_shards: shards, projector_split: split, ..Default::default() };
        let ev = events.clone();
        let on_durable = Box::new(move |d: dagfold::pipeline::Committed| ev.lock().unwrap().extend(d.events));
        let pipeline = Pipeline::start(cfg, Engine::new(Config::default(), node_identity(&scn)), store.clone(), rx, on_durable);
        for m in messages(&scn) {
            let work = match decode_frame(&m) {
                Ok(Decoded::Op { id, op, bytes }) => Work::Op { id, op, bytes, conn: 1, host: None },
                Ok(Decoded::Key(kd)) => Work::Key { kd, host: None },
                Err(_) => Work::Malformed,
            };
            tx.blocking_send(work).unwrap();
        }
        drop(tx);
        let shared = pipeline.shared.clone();
        pipeline.join();
        let mut restored = Engine::restore(Config::default(), node_identity(&scn), &store, None, 0).expect("the tables read back");
        restored.take_commit().unwrap();
        for want in scn["expect"]["scopes"].as_array().unwrap().iter().map(expected_report) {
            let mut want = want;
            want.data_key_waiting.clear();
            let mut got = restored.report(&want.scope).unwrap_or(ScopeReport { scope: want.scope, ..Default::default() });
            got.data_key_waiting.clear();
            assert_eq!(got, want, "{name}: scope {} as stored by the pipeline", hex::encode(want.scope));
            let status = shared.status.read().unwrap().get(&want.scope).cloned();
            if let Some(st) = status {
                assert_eq!(st.root, want.root, "{name}: published root");
                assert_eq!(st.applied, want.applied.len() as u64, "{name}: published applied");
                assert_eq!(st.data_heads, want.data_heads, "{name}: published data heads");
            } else {
                assert!(want.applied.is_empty(), "{name}: a scope with applied ops has a status");
            }
        }
        let mut got: Vec<_> = events.lock().unwrap().drain(..).map(|e| (e.scope, e.op, e.kind, e.data)).collect();
        got.sort();
        assert_eq!(got, expected_events(&scn), "{name}: events");
    }
}

fn prim() -> Value {
    load_json("primitives.json")
}

#[test]
fn primitive_ops() {
    let p = prim();
    let mut engine_cells: Vec<(Op, Hash, Option<Vec<u8>>)> = Vec::new();
    for v in p["ops"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let bytes = unhex(v["op_hex"].as_str().unwrap());
        let op = decode_op(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(encode(&op), bytes, "{name}: re-encoding");
        assert_eq!(hex::encode(op_body(&bytes)), v["body_hex"].as_str().unwrap(), "{name}: body");
        let id = delta_id_of_body(op_body(&bytes));
        assert_eq!(hex::encode(id), v["delta_id"].as_str().unwrap(), "{name}: delta_id");
        let seed = h32(v["secret_seed"].as_str().unwrap());
        assert_eq!(hex::encode(sig::public_key_from_seed(&seed)), v["public_key"].as_str().unwrap());
        assert_eq!(op.author, h32(v["public_key"].as_str().unwrap()));
        assert!(sig::verify(&op.author, &id, &op.signature), "{name}: signature");
        // Ed25519 signing is deterministic: we reproduce the signature.
        assert_eq!(sig::sign(&seed, &id), op.signature, "{name}: signing");
        let plain = unhex(v["plaintext_hex"].as_str().unwrap());
        match v["group_key"].as_str() {
            None => assert_eq!(op.payload, plain, "{name}: genesis payload is plaintext"),
            Some(k) => {
                let key = h32(k);
                assert_eq!(key_id_of(&key), op.key_id, "{name}: key_id");
                let opened = open_payload(&key, &op.nonce, &op.scope, op.plane, &op.payload).expect("opens");
                assert_eq!(opened, plain, "{name}: plaintext");
                assert_eq!(seal_payload(&key, &op.nonce, &op.scope, op.plane, &plain), op.payload, "{name}: sealing");
            }
        }
        if op.plane == PLANE_GOVERNANCE {
            assert_eq!(encode(&decode_gov_payload(&plain).unwrap()), plain, "{name}: gov payload round trip");
        } else {
            let dp = decode_data_payload(&plain).unwrap();
            assert_eq!(encode(&dp), plain, "{name}: data payload round trip");
            if name == "data_empty_payload" {
                assert_eq!(plain.len(), 40);
            }
        }
        engine_cells.push((op, id, v["group_key"].as_str().map(unhex)));
    }
    // The ops form one scope whose every data op's root_hash is honest: an
    // engine fed them (with their keys) applies all and never diverges.
    let mut engine = Engine::new(Config::default(), dagfold::core::Identity::from_secrets([7; 32], [8; 32]));
    for (_, _, key) in &engine_cells {
        if let Some(k) = key {
            engine.add_key(k.clone().try_into().unwrap());
        }
    }
    for (op, id, _) in &engine_cells {
        let frame = encode(&Message::Op(op.clone()));
        assert_eq!(engine.handle_frame(&frame, 0), dagfold::core::Outcome::Applied, "{}", hex::encode(id));
    }
    assert_eq!(engine.stats.divergences, 0);
}

#[test]
fn primitive_key_deliveries() {
    let p = prim();
    for v in p["key_deliveries"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let bytes = unhex(v["delivery_hex"].as_str().unwrap());
        let msg = unhex(v["message_hex"].as_str().unwrap());
        assert_eq!(msg[0], 1);
        assert_eq!(&msg[1..], &bytes[..]);
        let Message::Key(kd) = codec::decode_message(&msg).unwrap() else { panic!("{name}: a Key message") };
        assert_eq!(encode(&kd), bytes);
        let kem_secret = h32(v["recipient_kem_secret"].as_str().unwrap());
        assert_eq!(hex::encode(x25519_public(&kem_secret)), v["recipient_kem_public"].as_str().unwrap());
        assert_eq!(hex::encode(kd.recipient), v["recipient_public_key"].as_str().unwrap());
        let key = open_key_delivery(&kd, &kem_secret).unwrap_or_else(|| panic!("{name}: opens"));
        assert_eq!(hex::encode(key), v["group_key"].as_str().unwrap());
        assert_eq!(hex::encode(kd.key_id), v["key_id"].as_str().unwrap());
        // The sender's side reproduces the delivery byte for byte.
        let e = h32(v["ephemeral_secret"].as_str().unwrap());
        let sealed = seal_key_delivery(kd.scope, &key, kd.recipient, &x25519_public(&kem_secret), &e);
        assert_eq!(sealed, kd, "{name}: sealing");
        let _ = (v["shared"].as_str().unwrap(), v["wrap"].as_str().unwrap());
    }
    for v in p["key_deliveries_rejected"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let bytes = unhex(v["delivery_hex"].as_str().unwrap());
        let mut r = codec::Reader::new(&bytes);
        let kd = codec::read_key_delivery(&mut r).unwrap();
        r.finish().unwrap();
        let kem_secret = h32(v["recipient_kem_secret"].as_str().unwrap());
        assert_eq!(hex::encode(kd.recipient), v["recipient_public_key"].as_str().unwrap());
        assert!(open_key_delivery(&kd, &kem_secret).is_none(), "{name}: must not open ({})", v["note"]);
    }
}

#[test]
fn primitive_roots_and_cells() {
    let p = prim();
    for v in p["roots"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let mut pairs = Vec::new();
        let mut proj = dagfold::core::projection::Projection::default();
        for c in v["cells"].as_array().unwrap() {
            let entity = c["entity"].as_str().unwrap();
            let key = unhex(c["key"].as_str().unwrap());
            let cell_bytes = unhex(c["cell_hex"].as_str().unwrap());
            let cell = decode_cell(&cell_bytes).unwrap();
            assert_eq!(encode(&cell), cell_bytes, "{name}: cell round trip");
            let path = cell_path(entity, &key);
            assert_eq!(hex::encode(path), c["path"].as_str().unwrap(), "{name}: path");
            let leaf = cell_leaf(&path, &cell);
            assert_eq!(hex::encode(leaf), c["leaf"].as_str().unwrap(), "{name}: leaf");
            pairs.push((path, leaf));
            proj.restore(path, entity.to_owned(), key, cell);
        }
        let want = v["root"].as_str().unwrap();
        assert_eq!(hex::encode(dagfold::core::smt::reference_root(&mut pairs)), want, "{name}: reference root");
        assert_eq!(hex::encode(proj.root()), want, "{name}: incremental root");
    }
}

fn lww_of(v: &Value) -> Lww {
    Lww {
        hlc: v["hlc"].as_u64().unwrap(),
        author: h32(v["author"].as_str().unwrap()),
        index: v["index"].as_u64().unwrap() as u32,
        value: v["value"].as_str().map(unhex),
    }
}

#[test]
fn primitive_lww_order() {
    let p = prim();
    for v in p["lww_order"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let (a, b) = (lww_of(&v["a"]), lww_of(&v["b"]));
        let want = match v["greater"].as_str().unwrap() {
            "a" => std::cmp::Ordering::Greater,
            "b" => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Equal,
        };
        assert_eq!(a.cmp(&b), want, "{name}");
        assert_eq!(hex::encode(encode(&Cell { lww: Some(a), counter: 0 })), v["a_cell_hex"].as_str().unwrap());
        assert_eq!(hex::encode(encode(&Cell { lww: Some(b), counter: 0 })), v["b_cell_hex"].as_str().unwrap());
    }
}

#[test]
fn primitive_governance() {
    let p = prim();
    for v in p["governance"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let mut engine = Engine::new(Config::default(), dagfold::core::Identity::from_secrets([7; 32], [8; 32]));
        for k in v["group_keys"].as_array().unwrap() {
            engine.add_key(h32(k.as_str().unwrap()));
        }
        for o in v["ops_hex"].as_array().unwrap() {
            let mut frame = vec![0u8];
            frame.extend(unhex(o.as_str().unwrap()));
            assert_eq!(engine.handle_frame(&frame, 0), dagfold::core::Outcome::Applied, "{name}");
        }
        let g = engine.governance_at(&hashes(&v["cut"])).expect("cut is applied");
        let mut got: Vec<(String, u8)> = g.members.iter().map(|(k, r)| (hex::encode(k), *r as u8)).collect();
        got.sort();
        let mut want: Vec<(String, u8)> =
            v["members"].as_object().unwrap().iter().map(|(k, r)| (k.clone(), r.as_u64().unwrap() as u8)).collect();
        want.sort();
        assert_eq!(got, want, "{name}: members");
        assert_eq!(g.keyring, hashes(&v["keyring"]), "{name}: keyring");
    }
}

#[test]
fn primitive_signatures() {
    let p = prim();
    let mut batch = Vec::new();
    for v in p["signatures"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let pk = h32(v["public_key"].as_str().unwrap());
        let msg = h32(v["message"].as_str().unwrap());
        let sig: [u8; 64] = unhex(v["signature"].as_str().unwrap()).try_into().unwrap();
        let valid = v["valid"].as_bool().unwrap();
        assert_eq!(sig::verify(&pk, &msg, &sig), valid, "{name}");
        batch.push(((pk, msg, sig), valid));
    }
    let items: Vec<_> = batch.iter().map(|(i, _)| *i).collect();
    let want: Vec<bool> = batch.iter().map(|(_, v)| *v).collect();
    assert_eq!(sig::verify_batch(&items), want);
}
