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
/// The same, for a batch holding an op the node's API waits on.
const AUTHORED_LINGER: Duration = Duration::from_micros(400);

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
            // moderate load that doubled the verifiers' CPU. One with an op
            // of the node's API in it lingers less (a client waits on it),
            // but some: writes one by one crossed every stage one by one,
            // and the thread switches were the largest cost per write
            // (`tools/bench api_writes`, docs/PERFORMANCE.md).
            let waited_on = items.iter().any(|i| matches!(i.work, Work::Op { authored: Some(_), .. }));
            let linger = if waited_on { AUTHORED_LINGER } else { BATCH_LINGER };
            if items.len() >= BATCH_LINGER_UNTIL.min(batch_max) || received.elapsed() >= linger {
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
