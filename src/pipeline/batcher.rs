//! The batcher: takes what the transport queued, up to a signature batch,
//! lingering a little while a batch is small, and numbers the batches so
//! that the authorizer can restore their order.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use metrics::histogram;

use super::{Batch, Item, Work};
use crate::core::Prepared;

/// How long a batch smaller than `BATCH_LINGER_UNTIL` waits for more
/// items, looking again after each nap (`linger_step`). 3 ms rather than 1: a node
/// receiving a peer's writes by gossip at 11-14k ops/s (`tools/bench
/// api_writes`, node B) spent 0.47-0.50 of the writing node's CPU per op
/// at 1 ms and 0.42-0.43 at 3 ms (fewer, larger signature batches and
/// commits; five interleaved pairs), its lag unchanged at 6 ms. Under a
/// heavier load a batch reaches `BATCH_LINGER_UNTIL` first (at 40k ops/s,
/// in 1.6 ms).
const BATCH_LINGER: Duration = Duration::from_micros(3000);
const BATCH_LINGER_STEP: Duration = Duration::from_micros(200);
const BATCH_LINGER_UNTIL: usize = 64;
const BATCH_LINGER_NAP_MAX: Duration = Duration::from_micros(1000);

/// How long a lingering batch of `have` items, `waited` after its first,
/// sleeps before it looks again: the time it would take to reach
/// `BATCH_LINGER_UNTIL` at the rate its items came so far, at least
/// `BATCH_LINGER_STEP`, and at most `BATCH_LINGER_NAP_MAX` and what is
/// left of `BATCH_LINGER`. Under a heavy load it looks again every step,
/// as before; under a light one it sleeps through the linger in four naps
/// instead of fifteen (at 20k ops/s the batcher's wake-ups were ~7% of
/// the node's CPU, `tools/bench steady_1m`). The cap bounds how late a
/// burst after a lull is seen.
fn linger_step(have: usize, waited: Duration) -> Duration {
    let left = BATCH_LINGER.saturating_sub(waited).min(BATCH_LINGER_NAP_MAX);
    let missing = BATCH_LINGER_UNTIL.saturating_sub(have) as u32;
    let to_fill = waited * missing / have.max(1) as u32;
    to_fill.clamp(BATCH_LINGER_STEP, left.max(BATCH_LINGER_STEP))
}

pub(super) fn run(mut ingest: tokio::sync::mpsc::Receiver<Work>, out: Sender<Batch>, batch_max: usize) {
    let mut seq = 0u64;
    let batch_ops = histogram!("dagfold_batch_ops");
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
            let waited = received.elapsed();
            if items.len() >= BATCH_LINGER_UNTIL.min(batch_max) || waited >= BATCH_LINGER {
                break;
            }
            std::thread::sleep(linger_step(items.len(), waited));
        }
        batch_ops.record(items.len() as f64);
        if out.send(Batch { seq, items, received }).is_err() {
            return;
        }
        seq += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    /// A batch filling fast looks again every step; a slow one sleeps for
    /// the time its rate says it needs, never past the linger's end.
    #[test]
    fn the_linger_sleeps_as_long_as_the_rate_says_within_the_linger() {
        // The first look: no rate yet.
        assert_eq!(linger_step(1, Duration::ZERO), BATCH_LINGER_STEP);
        // 32 items in 400 µs: 32 more in ~400 µs.
        assert_eq!(linger_step(32, US(400)), US(400));
        // 48 items in 200 µs: ~67 µs to go, but never below a step.
        assert_eq!(linger_step(48, US(200)), BATCH_LINGER_STEP);
        // 2 items in 200 µs: 6.2 ms to fill, cut to a nap.
        assert_eq!(linger_step(2, US(200)), BATCH_LINGER_NAP_MAX);
        // 16 items in 300 µs: 0.9 ms to fill.
        assert_eq!(linger_step(16, US(300)), US(900));
        // 16 items in 500 µs: 1.5 ms to fill, cut to a nap.
        assert_eq!(linger_step(16, US(500)), BATCH_LINGER_NAP_MAX);
        // 2 items in 2.5 ms: only 0.5 ms of the linger left.
        assert_eq!(linger_step(2, US(2500)), US(500));
        // At the linger's end: one step (the caller closes the batch).
        assert_eq!(linger_step(3, BATCH_LINGER), BATCH_LINGER_STEP);
    }
}
