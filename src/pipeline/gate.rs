//! A byte budget between two stages, beside the channel's count bound.
//!
//! The orderer's input queue is long (`ORDER_QUEUE_BATCHES`), so that the
//! stages before it keep verifying and decrypting while it works through a
//! cascade; the gate bounds what that queue holds in bytes. A batch larger
//! than the whole budget still passes when the queue is empty, so nothing
//! waits forever.

use std::sync::{Condvar, Mutex};

pub struct ByteGate {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
    max: u64,
}

impl ByteGate {
    pub fn new(max: u64) -> Self {
        ByteGate { state: Mutex::new((0, false)), cv: Condvar::new(), max }
    }

    /// Waits until `n` more bytes fit (or nothing is held), then holds
    /// them. False once the gate is closed (the receiving stage is gone).
    pub fn acquire(&self, n: u64) -> bool {
        let mut s = self.state.lock().expect("gate lock");
        while !s.1 && s.0 > 0 && s.0 + n > self.max {
            s = self.cv.wait(s).expect("gate lock");
        }
        if s.1 {
            return false;
        }
        s.0 += n;
        true
    }

    pub fn release(&self, n: u64) {
        let mut s = self.state.lock().expect("gate lock");
        s.0 = s.0.saturating_sub(n);
        self.cv.notify_all();
    }

    /// Wakes every waiter for good (the receiving stage stopped).
    pub fn close(&self) {
        self.state.lock().expect("gate lock").1 = true;
        self.cv.notify_all();
    }

    pub fn held(&self) -> u64 {
        self.state.lock().expect("gate lock").0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn holds_at_most_the_budget_unless_empty_and_closing_frees_waiters() {
        let g = Arc::new(ByteGate::new(100));
        assert!(g.acquire(60));
        assert!(g.acquire(40));
        // A third acquire waits until bytes are released.
        let g2 = g.clone();
        let t = std::thread::spawn(move || g2.acquire(50));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "over the budget: waits");
        g.release(60);
        assert!(t.join().unwrap());
        assert_eq!(g.held(), 90);
        g.release(90);
        // Larger than the budget: passes once the gate is empty.
        assert!(g.acquire(500));
        let g3 = g.clone();
        let t = std::thread::spawn(move || g3.acquire(1));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished());
        g.close();
        assert!(!t.join().unwrap(), "closing frees the waiter");
    }
}
