//! The batcher: takes what the transport queued, up to a signature batch,
//! lingering a little while a batch is small, and numbers the batches so
//! that the authorizer can restore their order.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use metrics::histogram;

use super::{Batch, Item, Work};
use crate::core::Prepared;

/// How long a batch smaller than `BATCH_LINGER_UNTIL` waits for more
/// items, in steps of `BATCH_LINGER_STEP`.
const BATCH_LINGER: Duration = Duration::from_micros(1000);
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
