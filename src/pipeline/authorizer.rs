//! The authorizer: restores the ingest order of the verifiers' batches and
//! judges each valid op at its cut, on a replica of the governance index
//! that holds only the governance ops the engine accepted, ahead of the
//! engine; an author never made a member of the op's scope is unauthorized
//! without computing `G(cut)` (`core::prejudge::authorize`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::histogram;

use super::metrics::note_age;
use super::{Batch, Work};
use crate::core::prejudge::authorize;
use crate::core::governance::Governance;
use crate::protocol::OpKind;

pub(super) fn run(rx: Receiver<Batch>, tx: Sender<Batch>, gov: Arc<RwLock<Governance>>) {
    // Restores ingest order; holds at most the batches in flight.
    let mut next = 0u64;
    let mut held: BTreeMap<u64, Batch> = BTreeMap::new();
    let stage = histogram!("dagfold_stage_seconds", "stage" => "authorize");
    for batch in crate::idle::recv(&rx) {
        held.insert(batch.seq, batch);
        while let Some(mut batch) = held.remove(&next) {
            next += 1;
            let t = Instant::now();
            note_age("authorize", batch.received);
            let mut g = gov.write().expect("governance replica lock");
            for i in &mut batch.items {
                let Work::Op { op, .. } = &i.work else { continue };
                if !i.valid || op.kind() == OpKind::Genesis {
                    continue;
                }
                if op.cut_ids().iter().all(|c| g.get(c).is_some()) {
                    // A cut of another plane or scope is judged wrong_plane by
                    // the engine before this result is ever read. An author
                    // never made a member of the scope costs no `G(cut)`.
                    i.pre.auth = Some(authorize(&mut g, op));
                }
            }
            drop(g);
            stage.record(t.elapsed().as_secs_f64());
            if tx.send(batch).is_err() {
                return;
            }
        }
    }
}
