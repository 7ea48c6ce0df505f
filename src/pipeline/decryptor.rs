//! The decryptor: opens the payload of each op authorized ahead whose key
//! is on the keyring replica (the keys the engine accepted), and the key
//! deliveries to this node of keys not on it, their X25519s together
//! (x25519-dalek's serial ladder, ~43 µs each, was on the orderer's
//! thread; eight in IFMA lanes take ~51 µs); then holds the batch's bytes
//! in the orderer's queue budget (`gate.rs`).

use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::histogram;

use super::metrics::note_age;
use super::{gate, Batch, Work};
use crate::core::Identity;
use crate::protocol::crypto::{open_key_deliveries_to, open_payload};

pub(super) fn run(
    rx: Receiver<Batch>,
    tx: Sender<Batch>,
    keyring: super::Keyring,
    identity: &Identity,
    gate: &gate::ByteGate,
) {
    let stage = histogram!("dagfold_stage_seconds", "stage" => "decrypt");
    for mut batch in crate::idle::recv(&rx) {
        let t = Instant::now();
        note_age("decrypt", batch.received);
        {
            let keys = keyring.read().expect("keyring lock");
            for i in &mut batch.items {
                let Work::Op { op, .. } = &i.work else { continue };
                // Only ops authorized ahead: others may never need opening.
                if !i.valid || i.pre.auth != Some(crate::core::PreAuth::Ok) {
                    continue;
                }
                if let Some(key) = keys.get(&op.key_id) {
                    // A data op's payload decoded here too, off the
                    // orderer's thread (`Prepared::open_data`).
                    i.pre.open_data(op.plane, open_payload(key, &op.nonce, &op.scope, op.plane, &op.payload));
                }
            }
            // Deliveries the engine would open: to this node, of a key it
            // lacks (a duplicate of one opened here is opened again, and
            // ignored by the engine).
            let (ours, kds): (Vec<usize>, Vec<_>) = batch
                .items
                .iter()
                .enumerate()
                .filter_map(|(n, i)| match &i.work {
                    Work::Key { kd, .. } if kd.recipient == identity.public_key && !keys.contains_key(&kd.key_id) => Some((n, kd)),
                    _ => None,
                })
                .unzip();
            if !kds.is_empty() {
                let opened = open_key_deliveries_to(&kds, &identity.kem_secret, &identity.kem_public);
                for (n, key) in ours.into_iter().zip(opened) {
                    batch.items[n].pre.key = Some(key);
                }
            }
        }
        stage.record(t.elapsed().as_secs_f64());
        if !gate.acquire(batch.bytes()) || tx.send(batch).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};
    use super::*;
    use crate::core::Prepared;
    use crate::pipeline::Item;
    use crate::protocol::crypto::{key_id_of, seal_key_delivery};
    use crate::protocol::KeyDelivery;

    /// A data op's payload leaves the decryptor opened and decoded (the
    /// orderer then only takes it); a plaintext that does not decode, a
    /// governance op's and a tag that does not match leave it as opened,
    /// for the engine to judge as it does without the stage. The bytes the
    /// batch holds count a decoded payload by its plaintext.
    #[test]
    fn a_data_payload_is_decoded_here() {
        use crate::protocol::codec::decode_data_payload;
        use crate::protocol::crypto::seal_payload;
        use crate::protocol::{encode, Action, DataPayload, Op, PLANE_DATA, PLANE_GOVERNANCE};
        let me = Identity::from_secrets([1; 32], [2; 32]);
        let (scope, key) = ([5; 32], [6; 32]);
        let payload = DataPayload {
            root_hash: [7; 32],
            actions: vec![Action::Put { entity: "e".into(), key: b"k".to_vec(), value: b"v".to_vec() }],
            events: vec![],
        };
        let good = encode(&payload);
        let op = |plane, plain: &[u8], k: &[u8; 32], n: u8| Op {
            version: 1,
            scope,
            plane,
            author: [8; 32],
            parents: vec![[9; 32]],
            cut: vec![[10; 32]],
            hlc: 2,
            key_id: key_id_of(&key),
            nonce: [n; 12],
            payload: seal_payload(k, &[n; 12], &scope, plane, plain),
            signature: [0; 64],
        };
        let ops = [op(PLANE_DATA, &good, &key, 1), op(PLANE_DATA, &[1, 2, 3], &key, 2), op(PLANE_GOVERNANCE, &good, &key, 3), op(PLANE_DATA, &good, &[11; 32], 4)];
        let pre = Prepared { auth: Some(crate::core::PreAuth::Ok), ..Default::default() };
        let items = ops
            .iter()
            .map(|o| Item { work: Work::Op { id: [0; 32], op: o.clone(), bytes: vec![0; 100], conn: 0, host: None }, valid: true, pre: pre.clone() })
            .collect();
        let keyring = Arc::new(RwLock::new(crate::core::IdMap::from_iter([(key_id_of(&key), key)])));
        let (in_tx, in_rx) = crossbeam_channel::bounded(1);
        let (out_tx, out_rx) = crossbeam_channel::bounded(1);
        in_tx.send(Batch { seq: 0, items, received: Instant::now() }).unwrap();
        drop(in_tx);
        let gate = gate::ByteGate::new(1 << 30);
        run(in_rx, out_tx, keyring, &me, &gate);
        let batch = out_rx.recv().unwrap();
        let want = (2 * 100 + 64) * 4 + good.len() + 3 + good.len();
        assert_eq!(batch.bytes(), want as u64, "a decoded payload counted by its plaintext");
        let p: Vec<&Prepared> = batch.items.iter().map(|i| &i.pre).collect();
        assert_eq!(p[0].data, Some((decode_data_payload(&good).unwrap(), good.len())));
        assert_eq!(p[0].opened, None);
        assert_eq!((&p[1].data, &p[1].opened), (&None, &Some(Some(vec![1, 2, 3]))), "undecodable: the engine's bad_payload");
        assert_eq!((&p[2].data, &p[2].opened), (&None, &Some(Some(good.clone()))), "a governance op's");
        assert_eq!((&p[3].data, &p[3].opened), (&None, &Some(None)), "a tag that does not match");
    }

    /// The key deliveries of a batch addressed to this node, of keys it
    /// lacks, leave the decryptor opened (eleven of them: a row of eight
    /// lanes, and three more); one to another node, one of a key on the
    /// keyring and one that does not open are left for the engine, or
    /// marked as not opening.
    #[test]
    fn a_batch_s_deliveries_to_this_node_are_opened_together() {
        let me = Identity::from_secrets([1; 32], [2; 32]);
        let other = Identity::from_secrets([3; 32], [4; 32]);
        let scope = [5; 32];
        let keys: Vec<[u8; 32]> = (0..13u8).map(|i| [100 + i; 32]).collect();
        let to = |id: &Identity, key: &[u8; 32], e: u8| seal_key_delivery(scope, key, id.public_key, &id.kem_public, &[e; 32]);
        let mut kds: Vec<KeyDelivery> = keys[..11].iter().enumerate().map(|(i, k)| to(&me, k, 10 + i as u8)).collect();
        kds.push(to(&other, &keys[11], 30));
        kds.push(to(&me, &keys[12], 31));
        let mut broken = to(&me, &[99; 32], 32);
        broken.sealed[0] ^= 1;
        kds.push(broken);
        let keyring = Arc::new(RwLock::new(crate::core::IdMap::from_iter([(key_id_of(&keys[12]), keys[12])])));
        let items = kds.iter().map(|kd| Item { work: Work::Key { kd: kd.clone(), host: None }, valid: true, pre: Prepared::default() }).collect();
        let (in_tx, in_rx) = crossbeam_channel::bounded(1);
        let (out_tx, out_rx) = crossbeam_channel::bounded(1);
        in_tx.send(Batch { seq: 0, items, received: Instant::now() }).unwrap();
        drop(in_tx);
        run(in_rx, out_tx, keyring, &me, &gate::ByteGate::new(1 << 30));
        let batch = out_rx.recv().unwrap();
        let opened: Vec<Option<Option<[u8; 32]>>> = batch.items.into_iter().map(|i| i.pre.key).collect();
        for (i, key) in keys[..11].iter().enumerate() {
            assert_eq!(opened[i], Some(Some(*key)), "delivery {i} opened");
        }
        assert_eq!(opened[11], None, "to another node: not opened");
        assert_eq!(opened[12], None, "a key on the keyring: not opened again");
        assert_eq!(opened[13], Some(None), "a seal that does not open");
    }
}
