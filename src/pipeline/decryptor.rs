//! The decryptor: opens the payload of each op authorized ahead whose key
//! is on the keyring replica (the keys the engine accepted), then holds the
//! batch's bytes in the orderer's queue budget (`gate.rs`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::histogram;

use super::metrics::note_age;
use super::{gate, Batch, Work};
use crate::protocol::crypto::open_payload;
use crate::protocol::Hash;

pub(super) fn run(rx: Receiver<Batch>, tx: Sender<Batch>, keyring: Arc<RwLock<HashMap<Hash, [u8; 32]>>>, gate: &gate::ByteGate) {
    for mut batch in rx {
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
                    i.pre.opened = Some(open_payload(key, &op.nonce, &op.scope, op.plane, &op.payload));
                }
            }
        }
        histogram!("dagfold_stage_seconds", "stage" => "decrypt").record(t.elapsed().as_secs_f64());
        if !gate.acquire(batch.bytes()) || tx.send(batch).is_err() {
            return;
        }
    }
}
