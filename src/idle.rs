//! Freed memory back to the system when a thread goes idle.
//!
//! The node's allocator is mimalloc (`src/bin/dagfold.rs`). It returns a
//! freed page to the system only when the thread that owns the page next
//! calls into it; memory another thread frees (a frame allocated on a
//! network thread, freed by the orderer) waits on its owner's list the same
//! way. A thread that goes idle after a burst so keeps every page it freed,
//! or was given back, resident: ~200 MB of a node idle after 180,000 ops
//! (docs/PERFORMANCE.md, "memory by part"). Under load nothing changes:
//! the pipeline's threads collect once when their input has stayed empty
//! for `IDLE`, and not again until they have worked since; the network's,
//! when their runtime parks them, at most once per `IDLE`.
//! Purging at once instead (`MIMALLOC_PURGE_DELAY=0`) cost the node ~30%
//! more CPU per op.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, TryRecvError};

// The node links mimalloc, and with it this function of its C API.
use mimalloc as _;
extern "C" {
    fn mi_collect(force: bool);
}

/// How long a thread waits with nothing to do before it collects.
pub const IDLE: Duration = Duration::from_secs(1);

/// Gives the pages this thread's heap holds free (its own frees, and those
/// other threads made of its memory) back to the system.
pub fn collect() {
    // SAFETY: `mi_collect` has no preconditions; it touches only the
    // calling thread's heap, and memory no one holds.
    unsafe { mi_collect(false) }
}

/// Gives back to the system, at once, every page any thread freed and the
/// allocator still holds, its purge delay ignored: for a process about to
/// start timing, so that the purge of what it freed before does not land
/// inside the timed phase.
pub fn collect_now() {
    // SAFETY: as in `collect`; `force` only skips the purge delay.
    unsafe { mi_collect(true) }
}

/// A thread's idle spells: it collects once per spell of `IDLE` or more
/// without work, and not again until it has worked since.
#[derive(Default)]
pub struct Spell {
    /// When it last worked, if it has since it last collected.
    worked: Option<Instant>,
}

impl Spell {
    pub fn worked(&mut self) {
        self.worked = Some(Instant::now());
    }

    /// Collects if the thread worked since it last did, and `IDLE` or more
    /// ago; whether it did.
    pub fn idle(&mut self) -> bool {
        let due = self.worked.is_some_and(|t| t.elapsed() >= IDLE);
        if due {
            self.worked = None;
            collect();
        }
        due
    }
}

/// The next item of `rx` within `wait`, as `Receiver::recv_timeout` gives
/// it, but the thread parked as soon as `rx` is empty. crossbeam's own
/// blocking receive first spins and then calls `sched_yield` four times
/// before it parks; on a machine with fewer cores than busy threads each
/// yield is a switch to another thread and back, and in `api_writes` the
/// pipeline's threads spent ~10% of node A's CPU there (`perf record`,
/// 2026-12-07). A `Select` of the one receive parks at once (the orderer's
/// `select!` never yielded).
pub fn recv_parked<T>(rx: &Receiver<T>, wait: Duration) -> Result<T, RecvTimeoutError> {
    match rx.try_recv() {
        Ok(item) => return Ok(item),
        Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
        Err(TryRecvError::Empty) => {}
    }
    let mut select = Select::new();
    select.recv(rx);
    match select.select_timeout(wait) {
        Ok(op) => op.recv(rx).map_err(|_| RecvTimeoutError::Disconnected),
        Err(_) => Err(RecvTimeoutError::Timeout),
    }
}

/// The next item of `rx`, waiting as long as it takes, the thread
/// collecting once per idle spell of `IDLE` (`spell`); none once `rx` is
/// closed and empty.
pub fn next<T>(rx: &Receiver<T>, spell: &mut Spell) -> Option<T> {
    loop {
        match recv_parked(rx, IDLE) {
            Ok(item) => {
                spell.worked();
                return Some(item);
            }
            Err(RecvTimeoutError::Timeout) => {
                spell.idle();
            }
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// The items of `rx` until it is closed and empty, as its iterator gives
/// them, the thread collecting once per idle spell (`next`).
pub fn recv<T>(rx: &Receiver<T>) -> impl Iterator<Item = T> + '_ {
    let mut spell = Spell::default();
    std::iter::from_fn(move || next(rx, &mut spell))
}

thread_local! {
    /// A runtime thread's last collect, and whether it was unparked since.
    static PARKED: Cell<(Option<Instant>, bool)> = const { Cell::new((None, false)) };
}

/// For a runtime's `on_thread_unpark`.
pub fn on_unpark() {
    PARKED.with(|p| p.set((p.get().0, true)));
}

/// For a runtime's `on_thread_park`: collects if the thread was unparked
/// since it last did, and that was `IDLE` ago or more. A runtime gives no
/// idle spell to wait for (a thread parks between any two tasks), so a
/// busy thread collects about once per `IDLE`, an idle one once after its
/// last wake-up.
pub fn on_park() {
    PARKED.with(|p| {
        let now = Instant::now();
        match p.get() {
            (Some(last), true) if now.duration_since(last) < IDLE => {}
            (_, true) => {
                collect();
                p.set((Some(now), false));
            }
            (_, false) => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread collects once per idle spell: not before `IDLE` has passed
    /// since it last worked, once after, and not again until it has worked.
    #[test]
    fn a_spell_collects_once_after_idle() {
        let mut spell = Spell::default();
        assert!(!spell.idle(), "a thread that never worked has nothing to collect");
        spell.worked();
        assert!(!spell.idle(), "not within IDLE of its work");
        std::thread::sleep(IDLE + Duration::from_millis(50));
        assert!(spell.idle(), "once IDLE has passed");
        assert!(!spell.idle(), "once per spell");
        spell.worked();
        std::thread::sleep(IDLE + Duration::from_millis(50));
        assert!(spell.idle(), "again after more work");
    }

    /// The items come through in order, and the iterator ends when the
    /// channel is closed and drained; an idle spell in between collects
    /// and goes on waiting.
    #[test]
    fn recv_gives_every_item_across_an_idle_spell() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        let sender = std::thread::spawn(move || {
            tx.send(1).unwrap();
            std::thread::sleep(IDLE + Duration::from_millis(200));
            tx.send(2).unwrap();
            tx.send(3).unwrap();
        });
        let got: Vec<i32> = recv(&rx).collect();
        sender.join().unwrap();
        assert_eq!(got, [1, 2, 3]);
    }

    /// `recv_parked` answers as `recv_timeout` does: an item already
    /// queued at once, one sent while it is parked when it comes, a
    /// timeout when none comes within the wait, the items left after the
    /// senders are gone, and then that they are gone.
    #[test]
    fn recv_parked_answers_as_recv_timeout_does() {
        let (tx, rx) = crossbeam_channel::bounded(4);
        tx.send(1).unwrap();
        assert_eq!(recv_parked(&rx, Duration::ZERO), Ok(1));
        let t = std::time::Instant::now();
        assert_eq!(recv_parked(&rx, Duration::from_millis(30)), Err(RecvTimeoutError::Timeout));
        assert!(t.elapsed() >= Duration::from_millis(30), "it waited the whole wait");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            tx.send(2).unwrap();
            tx.send(3).unwrap();
        });
        assert_eq!(recv_parked(&rx, Duration::from_secs(10)), Ok(2), "woken by the send");
        sender.join().unwrap();
        assert_eq!(recv_parked(&rx, Duration::from_secs(10)), Ok(3), "queued before the sender left");
        assert_eq!(recv_parked(&rx, Duration::from_secs(10)), Err(RecvTimeoutError::Disconnected));
    }
}
