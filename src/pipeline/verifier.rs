//! The verifiers (`verifier_threads` of them): each checks the signatures
//! of a batch in one batch verification, copies of ops found valid before
//! skipping the curve arithmetic (`verified.rs`).

use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use metrics::{counter, gauge, histogram};

use super::metrics::note_age;
use super::{verified, Batch, Work};
use crate::protocol::{Hash, Op};

/// Niceness of the verifier threads. The orderer and the committer are each
/// one thread, and every op passes through both in turn: when the two cores
/// are contended, time given to them is throughput, while the verifiers
/// work ahead of the orderer (its queue is full under load) and lose nothing
/// by waiting. A verifier is the first to yield the core, never starved:
/// CFS still gives it about a tenth of a core against a busy thread, and all
/// of whatever is idle. Shuffled, 200k ops, this alone, three pairs: node
/// CPU 1.55–1.66 → 1.71–1.78 cores of 2 (ARCHITECTURE.md).
const VERIFIER_NICE: i32 = 10;

pub(super) fn run(rx: Receiver<Batch>, tx: Sender<Batch>, cache: &verified::VerifiedCache) {
    lower_priority(VERIFIER_NICE);
    // 1 when `R` points are decompressed with AVX-512 IFMA (the CPU has it
    // and the self-test against dalek passed), 0 on dalek's serial path.
    gauge!("dagfold_verify_ifma_decompression").set(if crate::protocol::edwards_lanes::accelerated() { 1.0 } else { 0.0 });
    let verified_total = counter!("dagfold_verified_total");
    let skipped_total = counter!("dagfold_verify_known_copies_total");
    // The node's cache of decompressed keys (`protocol::sig`), shared by
    // the verifiers.
    let key_hits = gauge!("dagfold_key_cache_hits_total");
    let key_misses = gauge!("dagfold_key_cache_misses_total");
    let stage = histogram!("dagfold_stage_seconds", "stage" => "verify");
    for mut batch in crate::idle::recv(&rx) {
        let t = Instant::now();
        note_age("verify", batch.received);
        let ops: Vec<(&Hash, &Op)> = batch
            .items
            .iter()
            .filter_map(|i| match &i.work {
                Work::Op { id, op, .. } => Some((id, op)),
                _ => None,
            })
            .collect();
        // Copies of ops verified before are valid as they are (verified.rs).
        let known = cache.known_valid(ops.iter().map(|(id, op)| (*id, &op.signature)));
        let sigs: Vec<([u8; 32], [u8; 32], [u8; 64])> = ops
            .iter()
            .zip(&known)
            .filter(|(_, k)| !**k)
            .map(|((id, op), _)| (op.author, **id, op.signature))
            .collect();
        let mut checked = crate::protocol::sig::verify_batch(&sigs).into_iter();
        let valid: Vec<bool> = known.iter().map(|&k| k || checked.next().expect("one verdict per op checked")).collect();
        cache.record(
            ops.iter().zip(known.iter().zip(&valid)).filter(|(_, (k, v))| !**k && **v).map(|((id, op), _)| (*id, &op.signature)),
        );
        drop(ops);
        let mut valid_of_op = valid.iter();
        for i in &mut batch.items {
            if matches!(i.work, Work::Op { .. }) {
                i.valid = *valid_of_op.next().expect("one per op");
            }
        }
        stage.record(t.elapsed().as_secs_f64());
        verified_total.increment(sigs.len() as u64);
        let (hits, misses) = crate::protocol::sig::key_cache_counts();
        key_hits.set(hits as f64);
        key_misses.set(misses as f64);
        skipped_total.increment((known.len() - sigs.len()) as u64);
        if tx.send(batch).is_err() {
            return;
        }
    }
}

/// Sets the calling thread's niceness; should it fail, the thread runs as
/// before.
fn lower_priority(nice: i32) {
    if !crate::niceness::lower_this_thread(nice) && cfg!(target_os = "linux") {
        eprintln!("dagfold: could not lower the priority of {:?}", std::thread::current().name());
    }
}
