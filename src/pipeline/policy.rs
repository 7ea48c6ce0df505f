//! The orderer's policy: what its loop decides by time and counts (when a
//! group commit closes, how long to wait for input, when to publish the
//! statuses, when to refresh the ids wanted from peers), as a plain type
//! that reads no clock and touches no channel. Every method takes the facts
//! the orderer observed, and `now` where time matters, and says what to do;
//! the orderer thread does the I/O.

use std::time::{Duration, Instant};

/// A commit closes at `commit_ops_max` applied ops, or at this many times
/// as many received items when most of them park, are duplicates or drop.
/// In order, every item applies and the commit size is unchanged; out of
/// order, a bigger commit releases more of the ops it parked, which then
/// write no buffer records at all (`Buffered::written`) instead of a put and
/// a delete going to the WAL.
const COMMIT_ITEMS_FACTOR: usize = 4;

/// Commits handed over and not yet durable, at most, before the orderer
/// hands over the next: past it, the commit being built keeps growing
/// while the committer syncs (group commit sized by the store's sync
/// time). With only the projector's queue as the limit, a trickle of small
/// commits queued up to five deep before the committer, each write waiting
/// behind the syncs of all of them (`tools/bench api_writes`,
/// docs/PERFORMANCE.md).
const COMMITS_IN_FLIGHT_MAX: usize = 2;

/// How long the orderer waits for input with work in hand (folded items,
/// or the last part of a cascade just judged): only briefly, so that it is
/// committed at once when nothing comes.
const BUSY_INPUT_WAIT: Duration = Duration::from_micros(200);

/// The longest a busy node lets its published status lag behind its
/// durable state. Computing roots once per commit cost ~18 SHA-256 per
/// changed cell at 40k cells; at most every 20 ms, ~12.
const STATUS_INTERVAL: Duration = Duration::from_millis(20);

/// How stale the ids wanted from peers may get (see `refresh_wanted`).
const WANTED_INTERVAL: Duration = Duration::from_millis(100);

/// The numbers of the commits handed over and not yet durable.
#[derive(Default)]
pub(super) struct InFlight {
    sent: std::collections::VecDeque<u64>,
}

impl InFlight {
    /// Commit `number` was handed over.
    pub(super) fn sent(&mut self, number: u64) {
        self.sent.push_back(number);
    }

    /// Whether another may be handed over, every commit below `durable`
    /// being durable (`PipelineState::durable_commits`).
    pub(super) fn room(&mut self, durable: u64) -> bool {
        while self.sent.front().is_some_and(|n| *n < durable) {
            self.sent.pop_front();
        }
        self.sent.len() < COMMITS_IN_FLIGHT_MAX
    }
}

pub(super) struct OrderPolicy {
    /// Applied ops per commit at most (`PipelineConfig::commit_ops_max`).
    commit_ops_max: usize,
    /// The idle wait for input (`PipelineConfig::tick_ms`).
    tick: Duration,
    /// When the statuses were last computed.
    last_status: Instant,
    /// When `wanted` was last refreshed.
    last_wanted: Instant,
    /// Something changed since `wanted` was last refreshed.
    wanted_stale: bool,
}

impl OrderPolicy {
    pub(super) fn new(commit_ops_max: usize, tick: Duration, now: Instant) -> OrderPolicy {
        // Stale from the start: a restored engine may hold pending ops whose
        // missing ids nothing else will ask peers for.
        OrderPolicy { commit_ops_max, tick, last_status: now, last_wanted: now, wanted_stale: true }
    }

    /// Nothing in hand: no items folded into the commit being built, and
    /// no part of a cascade judged for it.
    pub(super) fn idle(&self, items_in_commit: usize, cascaded: bool) -> bool {
        items_in_commit == 0 && !cascaded
    }

    /// How long to wait for input: up to a tick when idle; with work in
    /// hand, only `BUSY_INPUT_WAIT`.
    pub(super) fn input_wait(&self, items_in_commit: usize, cascaded: bool) -> Duration {
        if self.idle(items_in_commit, cascaded) {
            self.tick
        } else {
            BUSY_INPUT_WAIT
        }
    }

    /// Whether the commit being built is handed over after this wait for
    /// input (group commit): when the wait brought nothing, at
    /// `commit_ops_max` applied ops or `COMMIT_ITEMS_FACTOR` times as many
    /// items, or as soon as the commit slot is free (no commit before it
    /// still waits for the projector). Otherwise it keeps folding batches.
    pub(super) fn close_commit(&self, items_in_commit: usize, applied_in_commit: usize, slot_free: bool) -> bool {
        items_in_commit == 0
            || applied_in_commit >= self.commit_ops_max
            || items_in_commit >= COMMIT_ITEMS_FACTOR * self.commit_ops_max
            || slot_free
    }

    /// Whether to compute the statuses of the scopes touched since the last
    /// ones (`pending`): at once when the input is drained, and under load
    /// at most every `STATUS_INTERVAL` (since `statuses_computed`), so that
    /// the root rehash shares the upper levels of the tree across commits.
    pub(super) fn want_status(&self, now: Instant, pending: bool, input_drained: bool) -> bool {
        pending && (input_drained || now.saturating_duration_since(self.last_status) >= STATUS_INTERVAL)
    }

    /// The statuses are being computed, at `now`.
    pub(super) fn statuses_computed(&mut self, now: Instant) {
        self.last_status = now;
    }

    /// Whether to refresh the ids wanted from peers now, `changed` saying
    /// whether this round changed anything: only when something changed
    /// since the last refresh, and at most every `WANTED_INTERVAL`, idle
    /// ticks included; a change seen too early is remembered until then.
    /// `Engine::wanted` prunes the ids waited on that were unknown (up to
    /// one per buffered op under an orphan flood), and syncs read them once
    /// a heartbeat (≥ 200 ms apart).
    pub(super) fn refresh_wanted(&mut self, now: Instant, changed: bool) -> bool {
        self.wanted_stale |= changed;
        if self.wanted_stale && now.saturating_duration_since(self.last_wanted) >= WANTED_INTERVAL {
            self.last_wanted = now;
            self.wanted_stale = false;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS_MAX: usize = 64;
    const MS: Duration = Duration::from_millis(1);

    fn policy(t0: Instant) -> OrderPolicy {
        OrderPolicy::new(OPS_MAX, 100 * MS, t0)
    }

    #[test]
    fn a_commit_closes_at_commit_ops_max_applied_ops() {
        let p = policy(Instant::now());
        // The slot is taken (the commit before waits): the commit stays
        // open below the bounds.
        assert!(!p.close_commit(OPS_MAX, OPS_MAX - 1, false));
        assert!(p.close_commit(OPS_MAX, OPS_MAX, false));
    }

    #[test]
    fn a_commit_closes_at_four_times_commit_ops_max_items() {
        let p = policy(Instant::now());
        // Out of order: most items park, few apply.
        assert!(!p.close_commit(4 * OPS_MAX - 1, 1, false));
        assert!(p.close_commit(4 * OPS_MAX, 1, false));
    }

    #[test]
    fn a_commit_closes_as_soon_as_the_slot_is_free() {
        let p = policy(Instant::now());
        assert!(!p.close_commit(1, 1, false));
        assert!(p.close_commit(1, 1, true));
    }

    #[test]
    fn at_most_two_commits_are_in_flight() {
        let mut f = InFlight::default();
        assert!(f.room(0));
        f.sent(0);
        assert!(f.room(0));
        f.sent(1);
        // Neither durable: the next waits, its commit growing.
        assert!(!f.room(0));
        // Commit 0 durable (`durable_commits` is one past it).
        assert!(f.room(1));
        f.sent(4);
        assert!(!f.room(1));
        // Numbers skipped by empty rounds never block: 4 durable clears 1.
        assert!(f.room(5) && f.room(5));
        f.sent(5);
        f.sent(6);
        assert!(!f.room(5));
    }

    #[test]
    fn a_commit_closes_when_the_wait_brought_nothing() {
        // A part of a cascade, or an idle tick: handed over at once.
        let p = policy(Instant::now());
        assert!(p.close_commit(0, 0, false));
    }

    #[test]
    fn the_idle_wait_is_a_tick_and_the_busy_wait_200_us() {
        let p = policy(Instant::now());
        assert!(p.idle(0, false));
        assert_eq!(p.input_wait(0, false), 100 * MS);
        // Items folded into the commit, or a part of a cascade just judged.
        assert!(!p.idle(1, false) && !p.idle(0, true));
        assert_eq!(p.input_wait(1, false), Duration::from_micros(200));
        assert_eq!(p.input_wait(0, true), Duration::from_micros(200));
    }

    #[test]
    fn statuses_are_computed_at_once_when_drained_and_at_most_every_20_ms_under_load() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        // No scope touched: nothing to compute, drained or not.
        assert!(!p.want_status(t0 + 50 * MS, false, true));
        assert!(!p.want_status(t0 + 50 * MS, false, false));
        // Drained: at once, however recent the last ones.
        assert!(p.want_status(t0 + MS, true, true));
        p.statuses_computed(t0 + MS);
        assert!(p.want_status(t0 + MS, true, true));
        // Under load: 20 ms after the last ones.
        p.statuses_computed(t0 + 2 * MS);
        assert!(!p.want_status(t0 + 21 * MS, true, false));
        assert!(p.want_status(t0 + 22 * MS, true, false));
    }

    #[test]
    fn wanted_is_refreshed_at_most_every_100_ms_and_only_when_stale() {
        let t0 = Instant::now();
        let mut p = policy(t0);
        // Stale from the start, refreshed once the interval has passed.
        assert!(!p.refresh_wanted(t0 + 99 * MS, false));
        assert!(p.refresh_wanted(t0 + 100 * MS, false));
        // Nothing changed since: never, however long.
        assert!(!p.refresh_wanted(t0 + 1000 * MS, false));
        // A change, long enough after the last refresh: at once.
        assert!(p.refresh_wanted(t0 + 1000 * MS, true));
        // A change 50 ms later waits for the interval, and is not forgotten.
        assert!(!p.refresh_wanted(t0 + 1050 * MS, true));
        assert!(!p.refresh_wanted(t0 + 1099 * MS, false));
        assert!(p.refresh_wanted(t0 + 1100 * MS, false));
        assert!(!p.refresh_wanted(t0 + 1300 * MS, false));
    }
}
