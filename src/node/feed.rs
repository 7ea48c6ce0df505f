//! One subscriber's events of a scope, each once and in order, with no
//! gap: the history from the store's event log up to what was durable when
//! it subscribed, then the live events the hub queues for it. Both the QUIC
//! subscription (`serve`) and the API's Server-Sent Events (`api::events`)
//! read their events through a [`Feed`].

use std::collections::VecDeque;
use std::sync::Arc;

use super::hub::{Hub, Live};
use crate::protocol::node::EventFrame;
use crate::protocol::{Hash, PublicKey};
use crate::store::rocks::StoreReader;

/// Events read from the log per store read while catching a subscriber up.
const HISTORY_CHUNK_EVENTS: usize = 1024;

pub struct Feed {
    hub: Arc<Hub>,
    reader: StoreReader,
    scope: Hash,
    id: u64,
    live: Live,
    /// The scope's last durable sequence number when the feed subscribed:
    /// the history ends there, the live events begin after it.
    history_last: u64,
    /// The next sequence number to read from the log.
    history_next: u64,
    /// Events read from the log and not yet handed out.
    history: VecDeque<EventFrame>,
    /// The next sequence number to hand out.
    next: u64,
}

impl Feed {
    /// Subscribes to `scope`'s live events and starts the history at
    /// `from` (at least 1). `key` as for [`Hub::subscribe`], whose refusal
    /// (the reason, as counted) this returns.
    pub fn open(hub: &Arc<Hub>, reader: &StoreReader, scope: Hash, key: Option<PublicKey>, conn: u64, from: u64) -> Result<Feed, &'static str> {
        let sub = hub.subscribe(scope, key, conn)?;
        let from = from.max(1);
        Ok(Feed {
            hub: hub.clone(),
            reader: reader.clone(),
            scope,
            id: sub.id,
            live: sub.live,
            history_last: sub.last_seq,
            history_next: from,
            history: VecDeque::new(),
            next: from,
        })
    }

    /// The sequence number of the next event handed out: where a client
    /// resumes once the feed ends.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The next event; `None` once the hub dropped the subscriber (it
    /// lagged, or its key lost the scope) or the log could not be read: the
    /// client resumes from [`Feed::next_seq`]. Cancel-safe: nothing is
    /// consumed by a call that does not return.
    pub async fn next(&mut self) -> Option<Arc<EventFrame>> {
        loop {
            if let Some(ev) = self.history.pop_front() {
                self.next = ev.seq + 1;
                return Some(Arc::new(ev));
            }
            if self.history_next <= self.history_last {
                let (reader, scope, from, to) = (self.reader.clone(), self.scope, self.history_next, self.history_last);
                let read = tokio::task::spawn_blocking(move || reader.events(&scope, from, to, HISTORY_CHUNK_EVENTS)).await;
                let Ok(Ok(chunk)) = read else { return None };
                let Some(&(last, _)) = chunk.last() else {
                    // Nothing logged up to `history_last` (a scope whose log
                    // starts later): the live events follow.
                    self.history_next = self.history_last + 1;
                    continue;
                };
                self.history_next = last + 1;
                self.history.extend(chunk.iter().filter_map(|(seq, v)| event_frame(&scope, *seq, v)));
                continue;
            }
            let ev = self.live.recv().await?;
            // Live events up to `history_last` were read from the log.
            if ev.seq < self.next.max(self.history_last + 1) {
                continue;
            }
            self.next = ev.seq + 1;
            return Some(ev);
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        // Releases the subscription now, not at the scope's next event (a
        // quiet scope may never have one); a no-op if the hub dropped it.
        self.hub.unsubscribe(&self.scope, self.id);
    }
}

/// Decodes an event log record (op ‖ borsh(Event)).
fn event_frame(scope: &Hash, seq: u64, v: &[u8]) -> Option<EventFrame> {
    if v.len() < 32 {
        return None;
    }
    let op: Hash = v[..32].try_into().ok()?;
    let mut r = crate::protocol::codec::Reader::new(&v[32..]);
    let kind = r.string(u32::MAX).ok()?;
    let data = r.bytes(u32::MAX).ok()?;
    Some(EventFrame { scope: *scope, seq, op, kind, data })
}
