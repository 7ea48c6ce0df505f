//! Event subscriptions (SPEC §6 step 6): the committer hands durable events
//! to the hub, which copies them to each subscriber's bounded queue without
//! ever waiting. A subscriber whose queue is full is dropped (its queue
//! closes), and its stream tells the client it lagged (iroh-gossip's rule):
//! the pipeline never blocks on a slow reader.
//!
//! Each subscriber proved a key that may see its scope (SPEC §10: a member
//! at the governance heads, or a peer configured by key); when a commit
//! removes a member, [`Hub::revoke`] ends that key's live subscriptions.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::core::EventOut;
use crate::protocol::node::EventFrame;
use crate::protocol::{Hash, PublicKey};

/// Events queued per subscriber before it is dropped as lagging. 4096:
/// about a second of a busy scope's events; a reader that cannot keep up
/// with that resumes from its last sequence number instead.
pub const SUBSCRIBER_QUEUE_EVENTS_MAX: usize = 4096;
/// Subscriptions open at once, over all scopes.
pub const SUBSCRIPTIONS_MAX: usize = 4096;

struct Sub {
    id: u64,
    /// The key the subscriber proved.
    key: PublicKey,
    tx: tokio::sync::mpsc::Sender<EventFrame>,
}

#[derive(Default)]
struct ScopeSubs {
    /// The last durable event sequence number of the scope.
    last_seq: u64,
    subs: Vec<Sub>,
}

#[derive(Default)]
pub struct Hub {
    inner: Mutex<(HashMap<Hash, ScopeSubs>, u64, usize)>,
    /// Peers configured by key: they see every scope, member or not.
    peer_keys: HashSet<PublicKey>,
}

impl Hub {
    pub fn new(event_seqs: impl IntoIterator<Item = (Hash, u64)>, peer_keys: HashSet<PublicKey>) -> Hub {
        let scopes = event_seqs.into_iter().map(|(s, n)| (s, ScopeSubs { last_seq: n, subs: Vec::new() })).collect();
        Hub { inner: Mutex::new((scopes, 0, 0)), peer_keys }
    }

    /// Ends the live subscriptions to `scope` of every key that is neither
    /// in `members` (sorted) nor a configured peer: their queues close, and
    /// their streams are refused (SPEC §10: a member removed loses its live
    /// subscriptions at once). Returns how many ended.
    pub fn revoke(&self, scope: &Hash, members: &[PublicKey]) -> usize {
        let mut g = self.inner.lock().expect("hub lock");
        let (scopes, _, count) = &mut *g;
        let Some(s) = scopes.get_mut(scope) else { return 0 };
        let before = s.subs.len();
        s.subs.retain(|sub| members.binary_search(&sub.key).is_ok() || self.peer_keys.contains(&sub.key));
        let removed = before - s.subs.len();
        *count -= removed;
        if removed > 0 {
            metrics::counter!("dagfold_subscriptions_revoked_total").increment(removed as u64);
            metrics::gauge!("dagfold_subscribers").set(*count as f64);
        }
        removed
    }

    /// Hands durable events (in apply order) to subscribers.
    pub fn dispatch(&self, events: &[EventOut]) {
        if events.is_empty() {
            return;
        }
        let mut g = self.inner.lock().expect("hub lock");
        let (scopes, _, count) = &mut *g;
        let mut removed = 0;
        for e in events {
            let s = scopes.entry(e.scope).or_default();
            debug_assert!(e.seq > s.last_seq, "events are dispatched in order");
            s.last_seq = e.seq;
            let before = s.subs.len();
            s.subs.retain(|sub| {
                let frame = EventFrame { scope: e.scope, seq: e.seq, op: e.op, kind: e.kind.clone(), data: e.data.clone() };
                sub.tx.try_send(frame).is_ok()
            });
            removed += before - s.subs.len();
        }
        *count -= removed;
        if removed > 0 {
            metrics::counter!("dagfold_subscribers_lagged_total").increment(removed as u64);
        }
        metrics::gauge!("dagfold_subscribers").set(*count as f64);
    }

    /// Registers a subscriber for live events after the scope's current
    /// last sequence number, which it returns: events up to it are read from
    /// the store's event log. `None` when the subscription limit is reached.
    pub fn subscribe(&self, scope: Hash, key: PublicKey) -> Option<(tokio::sync::mpsc::Receiver<EventFrame>, u64, u64)> {
        let mut g = self.inner.lock().expect("hub lock");
        let (scopes, next_id, count) = &mut *g;
        if *count >= SUBSCRIPTIONS_MAX {
            return None;
        }
        let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIBER_QUEUE_EVENTS_MAX);
        *next_id += 1;
        *count += 1;
        let s = scopes.entry(scope).or_default();
        s.subs.push(Sub { id: *next_id, key, tx });
        metrics::gauge!("dagfold_subscribers").set(*count as f64);
        Some((rx, s.last_seq, *next_id))
    }

    /// Removes a subscriber that went away by itself.
    pub fn unsubscribe(&self, scope: &Hash, id: u64) {
        let mut g = self.inner.lock().expect("hub lock");
        let (scopes, _, count) = &mut *g;
        if let Some(s) = scopes.get_mut(scope) {
            let before = s.subs.len();
            s.subs.retain(|sub| sub.id != id);
            *count -= before - s.subs.len();
        }
        metrics::gauge!("dagfold_subscribers").set(*count as f64);
    }
}
