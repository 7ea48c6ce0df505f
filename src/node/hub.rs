//! Event subscriptions (SPEC §6 step 6): the committer hands durable events
//! to the hub, which copies them to each subscriber's bounded queue without
//! ever waiting. A subscriber whose queue is full is dropped (its queue
//! closes), and its stream tells the client it lagged (iroh-gossip's rule):
//! the pipeline never blocks on a slow reader.
//!
//! Each subscriber over QUIC proved a key that may see its scope (SPEC §10:
//! a member at the governance heads, or a peer configured by key); when a
//! commit removes a member, [`Hub::revoke`] ends that key's live
//! subscriptions. The node's own application (the API's event streams,
//! authenticated by its token) subscribes with no key: it is never revoked.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::core::EventOut;
use crate::limits::{SUBSCRIBER_QUEUE_BYTES_MAX, SUBSCRIPTIONS_PER_CONNECTION_MAX, SUBSCRIPTIONS_PER_KEY_MAX};
use crate::protocol::node::EventFrame;
use crate::protocol::{Hash, PublicKey};

/// Events queued per subscriber before it is dropped as lagging. 4096:
/// about a second of a busy scope's events; a reader that cannot keep up
/// with that resumes from its last sequence number instead.
pub const SUBSCRIBER_QUEUE_EVENTS_MAX: usize = 4096;
/// Subscriptions open at once, over all scopes.
pub const SUBSCRIPTIONS_MAX: usize = 4096;

/// What one queued event is charged against `SUBSCRIBER_QUEUE_BYTES_MAX`:
/// its kind and data, plus its fixed fields (scope, op, seq, two lengths).
fn event_bytes(kind: &str, data: &[u8]) -> u64 {
    (kind.len() + data.len()) as u64 + 80
}

struct Sub {
    id: u64,
    /// The key the subscriber proved; none for the node's own application.
    key: Option<PublicKey>,
    /// The connection it came on (`net::Inbound::conn_id`).
    conn: u64,
    /// Events are shared by every subscriber of their scope (one copy per
    /// event, however many queues hold it).
    tx: tokio::sync::mpsc::Sender<Arc<EventFrame>>,
    /// Bytes of the events in its queue, shared with its [`Live`].
    queued_bytes: Arc<AtomicU64>,
}

impl Sub {
    /// Queues `frame` if the subscriber's queue has room for it, in events
    /// and in bytes; false means it lags (or went away) and is dropped.
    fn offer(&self, frame: &Arc<EventFrame>) -> bool {
        let bytes = event_bytes(&frame.kind, &frame.data);
        // Charged before it is queued, so that the reader's release never
        // comes first.
        let queued = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if queued + bytes > SUBSCRIBER_QUEUE_BYTES_MAX || self.tx.try_send(frame.clone()).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// A subscriber's end of its queue: [`Live::recv`] releases what each event
/// was charged.
pub struct Live {
    rx: tokio::sync::mpsc::Receiver<Arc<EventFrame>>,
    queued_bytes: Arc<AtomicU64>,
}

impl Live {
    /// The next event, or `None` once the hub dropped the subscriber.
    /// Cancel-safe, like the channel's `recv`.
    pub async fn recv(&mut self) -> Option<Arc<EventFrame>> {
        let ev = self.rx.recv().await?;
        self.queued_bytes.fetch_sub(event_bytes(&ev.kind, &ev.data), Ordering::Relaxed);
        Some(ev)
    }
}

/// A subscription the hub took: the subscriber's queue, the scope's last
/// durable sequence number at that moment, and its id for `unsubscribe`.
pub struct Subscription {
    pub live: Live,
    pub last_seq: u64,
    pub id: u64,
}

#[derive(Default)]
struct ScopeSubs {
    /// The last durable event sequence number of the scope.
    last_seq: u64,
    subs: Vec<Sub>,
}

/// How many subscriptions are held, in all, per connection and per key.
#[derive(Default)]
struct Holders {
    count: usize,
    per_connection: HashMap<u64, u32>,
    per_key: HashMap<PublicKey, u32>,
}

impl Holders {
    /// Why `sub` may not be taken, as counted (`reason`), if it may not.
    fn refusal(&self, key: Option<&PublicKey>, conn: u64) -> Option<&'static str> {
        if self.count >= SUBSCRIPTIONS_MAX {
            Some("node")
        } else if self.per_connection.get(&conn).copied().unwrap_or(0) >= SUBSCRIPTIONS_PER_CONNECTION_MAX {
            Some("connection")
        } else if key.is_some_and(|key| self.per_key.get(key).copied().unwrap_or(0) >= SUBSCRIPTIONS_PER_KEY_MAX) {
            Some("key")
        } else {
            None
        }
    }

    fn take(&mut self, key: Option<PublicKey>, conn: u64) {
        self.count += 1;
        *self.per_connection.entry(conn).or_default() += 1;
        if let Some(key) = key {
            *self.per_key.entry(key).or_default() += 1;
        }
    }

    fn release(&mut self, sub: &Sub) {
        self.count -= 1;
        *self.per_connection.get_mut(&sub.conn).expect("a held subscription is counted") -= 1;
        if self.per_connection[&sub.conn] == 0 {
            self.per_connection.remove(&sub.conn);
        }
        if let Some(key) = &sub.key {
            *self.per_key.get_mut(key).expect("a held subscription is counted") -= 1;
            if self.per_key[key] == 0 {
                self.per_key.remove(key);
            }
        }
    }
}

#[derive(Default)]
struct Inner {
    scopes: crate::core::IdMap<Hash, ScopeSubs>,
    next_id: u64,
    holders: Holders,
}

#[derive(Default)]
pub struct Hub {
    inner: Mutex<Inner>,
    /// Peers configured by key: they see every scope, member or not.
    peer_keys: HashSet<PublicKey>,
}

impl Hub {
    pub fn new(event_seqs: impl IntoIterator<Item = (Hash, u64)>, peer_keys: HashSet<PublicKey>) -> Hub {
        let scopes = event_seqs.into_iter().map(|(s, n)| (s, ScopeSubs { last_seq: n, subs: Vec::new() })).collect();
        Hub { inner: Mutex::new(Inner { scopes, ..Inner::default() }), peer_keys }
    }

    /// Ends the live subscriptions to `scope` of every key that is neither
    /// in `members` (sorted) nor a configured peer: their queues close, and
    /// their streams are refused (SPEC §10: a member removed loses its live
    /// subscriptions at once). Returns how many ended.
    pub fn revoke(&self, scope: &Hash, members: &[PublicKey]) -> usize {
        let mut g = self.inner.lock().expect("hub lock");
        let Inner { scopes, holders, .. } = &mut *g;
        let Some(s) = scopes.get_mut(scope) else { return 0 };
        let before = s.subs.len();
        s.subs.retain(|sub| {
            let keep = sub.key.is_none_or(|key| members.binary_search(&key).is_ok() || self.peer_keys.contains(&key));
            if !keep {
                holders.release(sub);
            }
            keep
        });
        let removed = before - s.subs.len();
        if removed > 0 {
            metrics::counter!("dagfold_subscriptions_revoked_total").increment(removed as u64);
            metrics::gauge!("dagfold_subscribers").set(holders.count as f64);
        }
        removed
    }

    /// Hands durable events (in apply order) to subscribers. A subscriber
    /// whose queue is full, in events or in bytes, is dropped as lagging.
    pub fn dispatch(&self, events: &[EventOut]) {
        if events.is_empty() {
            return;
        }
        let mut g = self.inner.lock().expect("hub lock");
        let Inner { scopes, holders, .. } = &mut *g;
        let mut removed = 0;
        for e in events {
            let s = scopes.entry(e.scope).or_default();
            debug_assert!(e.seq > s.last_seq, "events are dispatched in order");
            s.last_seq = e.seq;
            let before = s.subs.len();
            let frame = Arc::new(EventFrame { scope: e.scope, seq: e.seq, op: e.op, kind: e.kind.clone(), data: e.data.clone() });
            s.subs.retain(|sub| {
                let keep = sub.offer(&frame);
                if !keep {
                    holders.release(sub);
                }
                keep
            });
            removed += before - s.subs.len();
        }
        if removed > 0 {
            metrics::counter!("dagfold_subscribers_lagged_total").increment(removed as u64);
        }
        metrics::gauge!("dagfold_subscribers").set(holders.count as f64);
    }

    /// Registers a subscriber for live events after the scope's current
    /// last sequence number: events up to it are read from the store's
    /// event log. Refused, with the reason as counted, when the node's
    /// subscriptions (`node`), the connection's (`connection`) or the key's
    /// (`key`) are at their bound. `key` is none for the node's own
    /// application (never revoked, not bounded per key).
    pub fn subscribe(&self, scope: Hash, key: Option<PublicKey>, conn: u64) -> Result<Subscription, &'static str> {
        let mut g = self.inner.lock().expect("hub lock");
        let Inner { scopes, next_id, holders } = &mut *g;
        if let Some(reason) = holders.refusal(key.as_ref(), conn) {
            return Err(reason);
        }
        let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIBER_QUEUE_EVENTS_MAX);
        let queued_bytes = Arc::new(AtomicU64::new(0));
        *next_id += 1;
        holders.take(key, conn);
        let s = scopes.entry(scope).or_default();
        s.subs.push(Sub { id: *next_id, key, conn, tx, queued_bytes: queued_bytes.clone() });
        metrics::gauge!("dagfold_subscribers").set(holders.count as f64);
        Ok(Subscription { live: Live { rx, queued_bytes }, last_seq: s.last_seq, id: *next_id })
    }

    /// Removes a subscriber that went away by itself.
    pub fn unsubscribe(&self, scope: &Hash, id: u64) {
        let mut g = self.inner.lock().expect("hub lock");
        let Inner { scopes, holders, .. } = &mut *g;
        if let Some(s) = scopes.get_mut(scope) {
            s.subs.retain(|sub| {
                let keep = sub.id != id;
                if !keep {
                    holders.release(sub);
                }
                keep
            });
        }
        metrics::gauge!("dagfold_subscribers").set(holders.count as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, data_bytes: usize) -> EventOut {
        EventOut { scope: [1; 32], seq, op: [2; 32], kind: "put".into(), data: vec![7; data_bytes] }
    }

    /// An event is held once, however many subscribers queue it: what the
    /// queues hold over the node is bounded by the events, not by events ×
    /// subscribers.
    #[test]
    fn subscribers_share_each_event() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let hub = Hub::new([], HashSet::new());
        let mut a = hub.subscribe([1; 32], Some([3; 32]), 1).unwrap();
        let mut b = hub.subscribe([1; 32], Some([4; 32]), 2).unwrap();
        hub.dispatch(&[event(1, 1 << 10)]);
        let (x, y) = (rt.block_on(a.live.recv()).unwrap(), rt.block_on(b.live.recv()).unwrap());
        assert!(Arc::ptr_eq(&x, &y), "one copy of the event for both");
    }

    /// A subscriber that does not read is dropped once its queued events
    /// come to more than `SUBSCRIBER_QUEUE_BYTES_MAX`, long before its 4,096
    /// events; one that reads as they come is never dropped.
    #[test]
    fn a_subscriber_queue_is_bounded_in_bytes() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let hub = Hub::new([], HashSet::new());
        let mut idle = hub.subscribe([1; 32], Some([3; 32]), 1).unwrap();
        let mut reader = hub.subscribe([1; 32], Some([4; 32]), 2).unwrap();
        let big = 256 << 10;
        let fits = (SUBSCRIBER_QUEUE_BYTES_MAX / event_bytes("put", &vec![0; big])) as usize;
        let mut read = 0;
        for seq in 1..=(4 * fits as u64) {
            hub.dispatch(&[event(seq, big)]);
            if rt.block_on(reader.live.recv()).is_some() {
                read += 1;
            }
        }
        assert_eq!(read, 4 * fits, "a reader that keeps up stays subscribed");
        let mut queued = 0;
        while rt.block_on(idle.live.recv()).is_some() {
            queued += 1;
        }
        assert_eq!(queued, fits, "the idle subscriber held what fits in its bytes, then was dropped");
        assert!(queued < SUBSCRIBER_QUEUE_EVENTS_MAX);
    }

    /// A removal ends the subscriptions of keys no longer members, not
    /// those of the members nor the node's own application's (no key).
    #[test]
    fn a_revocation_spares_members_and_the_application() {
        let hub = Hub::new([], HashSet::new());
        let mut removed = hub.subscribe([1; 32], Some([3; 32]), 1).unwrap();
        let mut member = hub.subscribe([1; 32], Some([4; 32]), 2).unwrap();
        let mut application = hub.subscribe([1; 32], None, 3).unwrap();
        assert_eq!(hub.revoke(&[1; 32], &[[4; 32]]), 1);
        hub.dispatch(&[event(1, 8)]);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(rt.block_on(removed.live.recv()).is_none(), "the removed key's subscription ended");
        assert!(rt.block_on(member.live.recv()).is_some());
        assert!(rt.block_on(application.live.recv()).is_some());
    }

    /// Past a connection's bound, and past a key's over several
    /// connections, a subscription is refused with that reason; a released
    /// one frees its place.
    #[test]
    fn subscriptions_are_bounded_per_connection_and_per_key() {
        let hub = Hub::new([], HashSet::new());
        let per_conn = SUBSCRIPTIONS_PER_CONNECTION_MAX as usize;
        let mut held: Vec<Subscription> = (0..per_conn).map(|_| hub.subscribe([1; 32], Some([3; 32]), 1).unwrap()).collect();
        assert_eq!(hub.subscribe([1; 32], Some([3; 32]), 1).err(), Some("connection"));
        hub.unsubscribe(&[1; 32], held.pop().unwrap().id);
        held.push(hub.subscribe([1; 32], Some([3; 32]), 1).expect("a released place is free again"));
        let conns = SUBSCRIPTIONS_PER_KEY_MAX as usize / per_conn;
        for conn in 2..=conns as u64 {
            for _ in 0..per_conn {
                held.push(hub.subscribe([1; 32], Some([3; 32]), conn).unwrap());
            }
        }
        assert_eq!(hub.subscribe([1; 32], Some([3; 32]), 999).err(), Some("key"));
        assert!(hub.subscribe([1; 32], Some([4; 32]), 999).is_ok(), "another key is served");
    }
}
