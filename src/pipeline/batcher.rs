//! The batcher: takes what the transport queued, up to a signature batch,
//! lingering a little while a batch is small, and numbers the batches so
//! that the authorizer can restore their order.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use metrics::histogram;

use super::{Batch, Item, Work};
use crate::core::Prepared;

/// How long a batch smaller than `BATCH_LINGER_UNTIL` waits for more
/// items, in steps of `BATCH_LINGER_STEP`. 3 ms rather than 1: a node
/// receiving a peer's writes by gossip at 11-14k ops/s (`tools/bench
/// api_writes`, node B) spent 0.47-0.50 of the writing node's CPU per op
/// at 1 ms and 0.42-0.43 at 3 ms (fewer, larger signature batches and
/// commits; five interleaved pairs), its lag unchanged at 6 ms. Under a
/// heavier load a batch reaches `BATCH_LINGER_UNTIL` first (at 40k ops/s,
/// in 1.6 ms).
const BATCH_LINGER: Duration = Duration::from_micros(3000);
const BATCH_LINGER_STEP: Duration = Duration::from_micros(200);
const BATCH_LINGER_UNTIL: usize = 64;

pub(super) fn run(mut ingest: tokio::sync::mpsc::Receiver<Work>, out: Sender<Batch>, batch_max: usize) {
    let mut seq = 0u64;
    while let Some(first) = ingest.blocking_recv() {
        let received = Instant::now();
        let mut items = vec![Item { work: first, valid: false, pre: Prepared::default() }];
        loop {
            while items.len() < batch_max {
                match ingest.try_recv() {
                    Ok(w) => items.push(Item { work: w, valid: false, pre: Prepared::default() }),
                    Err(_) => break,
                }
            }
            // A small batch lingers a little for more: per signature a
            // batch of 20 costs about twice one of 200, and under a
            // moderate load that doubled the verifiers' CPU. (The node's
            // own ops, which a client waits on, go to the orderer
            // directly: `Work::Own`.)
            if items.len() >= BATCH_LINGER_UNTIL.min(batch_max) || received.elapsed() >= BATCH_LINGER {
                break;
            }
            std::thread::sleep(BATCH_LINGER_STEP);
        }
        histogram!("dagfold_batch_ops").record(items.len() as f64);
        if out.send(Batch { seq, items, received }).is_err() {
            return;
        }
        seq += 1;
    }
}
