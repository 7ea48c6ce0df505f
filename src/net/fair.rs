//! Fair ingest: decoded items wait in one queue per *origin* (a remote IPv4
//! address, or an IPv6 /64), and one dispatcher hands them to the node's
//! [`ItemSink`] round-robin, [`TURN_ITEMS`] per origin per turn.
//!
//! Without it the node's ingest is first come, first served per stream: a
//! flooder with eight streams gets eight times the share of an honest peer
//! with one. With it, every origin that has work waiting gets an equal turn,
//! whatever its number of connections and streams; within an origin, items
//! keep their arrival order, so one stream's frames stay in order.
//!
//! Turns can be weighted: the node tells [`OriginTurns`] what each origin's
//! ops came to, commit by commit, and its items per turn follow (by default
//! [`TURN_ITEMS`]; fewer for an origin whose recent frames came to nothing,
//! see [`OriginTurns::record_outcomes`]), so under
//! contention a host sending useful work gets more of the node than one
//! flooding it with ops that are evicted or dropped. An origin alone is
//! never slowed: turns only matter when several have work waiting.
//!
//! Memory: every queued item holds its frame's reservation of the byte
//! budgets (its origin's and the global one), so the queues are bounded by bytes,
//! not by trust in the sender; the reservation is released once the node's
//! sink has taken the item.
//!
//! Admission, also per origin ([`Admission`]): at most
//! `connections_per_origin_max` connections open at once, and new
//! connections limited by a token bucket (`connection_rate_per_origin` a
//! second, bursts of `connection_burst_per_origin`), so that one host cannot
//! take every connection slot or spend the node's CPU on handshakes.
//! Refusal happens before the handshake, which is what makes it cheap.
//!
//! An attacker with many addresses is many origins: this bounds what one
//! host can do, not what a botnet can.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

/// Items one origin hands on per turn before the next origin's turn: large
/// enough to keep the dispatcher's per-item cost small, small enough that a
/// turn is far below a batch of the pipeline.
pub const TURN_ITEMS: usize = 32;

/// Origins remembered by the admission rate limiter before idle ones are
/// forgotten (an origin whose bucket is full again is indistinguishable from
/// a new one, so forgetting it loses nothing).
const ADMISSION_ORIGINS_MAX: usize = 65_536;

/// The unit of fairness for `addr`: the IPv4 address (also when mapped into
/// IPv6), or the IPv6 /64, the block one host is usually given.
pub fn origin_of(addr: SocketAddr) -> IpAddr {
    match addr.ip() {
        IpAddr::V4(a) => IpAddr::V4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut s = a.segments();
                s[4..].fill(0);
                IpAddr::V6(Ipv6Addr::from(s))
            }
        },
    }
}

/// A queued item and the byte reservations it holds until it is handed on.
pub(crate) struct Held<T> {
    pub item: T,
    pub permits: [OwnedSemaphorePermit; 2],
}

struct LaneQueue<T> {
    items: VecDeque<Held<T>>,
    /// True while the lane is in the ready list (or being served).
    scheduled: bool,
}

/// Items per turn, per origin, as the node last set them; origins not
/// listed get [`TURN_ITEMS`]. Bounded: beyond [`ADMISSION_ORIGINS_MAX`]
/// entries, the origins back at the default are forgotten, then any.
#[derive(Default)]
pub struct OriginTurns {
    turns: Mutex<HashMap<IpAddr, u8>>,
    /// Each origin's score (`record_outcomes`), for at most
    /// [`HOSTS_SCORED_MAX`] origins.
    scores: Mutex<HashMap<IpAddr, f32>>,
}

impl std::fmt::Debug for OriginTurns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OriginTurns({} set)", self.turns.lock().unwrap().len())
    }
}

/// The fewest items an origin gets per turn.
pub const TURN_ITEMS_MIN: usize = 2;

/// What a host's ops came to, recently: the share of them applied (or
/// waiting for their key), as a moving average over commits, starting
/// at 1. Its turn in the server's fair ingest shrinks with it, so that under
/// contention a host whose ops are pending for ever, evicted, dropped or
/// duplicates gets less of the node than one whose ops apply. It only
/// matters when several hosts have work waiting: a host alone keeps the
/// whole node, whatever its score.
fn host_turn(score: f32) -> usize {
    let span = (TURN_ITEMS - TURN_ITEMS_MIN) as f32;
    TURN_ITEMS_MIN + (span * score.clamp(0.0, 1.0)).round() as usize
}

/// Weight of one commit's share in a host's score.
const HOST_SCORE_ALPHA: f32 = 0.2;

/// Hosts scored at once; beyond, those back near 1 (the default) are
/// forgotten first.
const HOSTS_SCORED_MAX: usize = 4096;

impl OriginTurns {
    /// Sets `origin`'s turn, clamped to `TURN_ITEMS_MIN..=TURN_ITEMS`.
    pub fn set(&self, origin: IpAddr, items: usize) {
        let items = items.clamp(TURN_ITEMS_MIN, TURN_ITEMS) as u8;
        let mut t = self.turns.lock().unwrap();
        if items as usize == TURN_ITEMS {
            t.remove(&origin);
            return;
        }
        if t.len() >= ADMISSION_ORIGINS_MAX && !t.contains_key(&origin) {
            t.clear();
        }
        t.insert(origin, items);
    }

    pub fn get(&self, origin: &IpAddr) -> usize {
        self.turns.lock().unwrap().get(origin).map_or(TURN_ITEMS, |&n| n as usize)
    }

    /// What each origin's ops came to in one commit of the node, as
    /// `(origin, useful, total)`: updates its score and sets its turn from
    /// it (see [`host_turn`]).
    pub fn record_outcomes(&self, outcomes: impl IntoIterator<Item = (IpAddr, u32, u32)>) {
        let mut scores = self.scores.lock().unwrap();
        for (h, useful, total) in outcomes {
            let s = scores.entry(h).or_insert(1.0);
            *s += HOST_SCORE_ALPHA * (useful as f32 / total as f32 - *s);
            self.set(h, host_turn(*s));
        }
        if scores.len() > HOSTS_SCORED_MAX {
            scores.retain(|_, s| *s < 0.95);
            if scores.len() > HOSTS_SCORED_MAX {
                scores.clear();
            }
        }
    }
}

/// One origin's queue and its share of the byte budget.
pub(crate) struct Lane<T> {
    origin: IpAddr,
    /// The origin's share of the frame byte budget.
    pub bytes: Arc<Semaphore>,
    queue: Mutex<LaneQueue<T>>,
}

/// The lanes and the ready list, shared by stream tasks and the dispatcher.
pub(crate) struct Fair<T> {
    lanes: Mutex<HashMap<IpAddr, Weak<Lane<T>>>>,
    ready: Mutex<VecDeque<Arc<Lane<T>>>>,
    wake: Notify,
    closed: AtomicBool,
    origin_bytes_max: usize,
    turns: Arc<OriginTurns>,
}

/// The node's ingest is gone: it takes nothing more.
#[derive(Debug)]
pub struct IngestClosed;

/// Where the dispatcher hands items, one at a time, in the fair order: the
/// node's ingest. While `deliver` waits (the node is full), the dispatcher
/// holds the items' byte reservations, so the budgets fill, the stream tasks
/// stop reading and QUIC flow control pushes back on the peers.
pub trait ItemSink<T>: Send + Sync + 'static {
    /// Takes one item, waiting while the node is full; `Err` once the node
    /// takes nothing more.
    fn deliver(&self, item: T) -> impl Future<Output = Result<(), IngestClosed>> + Send;
}

/// A bounded channel as the sink (the transport's tests): whoever
/// holds the receiver is the node.
impl<T: Send + 'static> ItemSink<T> for mpsc::Sender<T> {
    async fn deliver(&self, item: T) -> Result<(), IngestClosed> {
        self.send(item).await.map_err(|_| IngestClosed)
    }
}

impl<T: Send + 'static> Fair<T> {
    pub fn new(origin_bytes_max: usize, turns: Arc<OriginTurns>) -> Fair<T> {
        Fair {
            lanes: Mutex::new(HashMap::new()),
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            origin_bytes_max,
            turns,
        }
    }

    /// The lane of `origin`, made on first use. Connections hold their lane;
    /// once none does (and it is not queued), it is freed, and the map entry
    /// is swept at a later call.
    pub fn lane(&self, origin: IpAddr) -> Arc<Lane<T>> {
        let mut lanes = self.lanes.lock().unwrap();
        if let Some(lane) = lanes.get(&origin).and_then(Weak::upgrade) {
            return lane;
        }
        if lanes.len() >= 64 && lanes.len().is_power_of_two() {
            lanes.retain(|_, w| w.strong_count() > 0);
        }
        let lane = Arc::new(Lane {
            origin,
            bytes: Arc::new(Semaphore::new(self.origin_bytes_max)),
            queue: Mutex::new(LaneQueue { items: VecDeque::new(), scheduled: false }),
        });
        lanes.insert(origin, Arc::downgrade(&lane));
        lane
    }

    /// Lanes alive (held by a connection or queued).
    pub fn origins(&self) -> usize {
        self.lanes.lock().unwrap().values().filter(|w| w.strong_count() > 0).count()
    }

    /// Queues `held` on `lane`, scheduling the lane if it was idle.
    pub fn push(&self, lane: &Arc<Lane<T>>, held: Held<T>) -> Result<(), IngestClosed> {
        if self.closed.load(Ordering::Acquire) {
            return Err(IngestClosed);
        }
        let mut q = lane.queue.lock().unwrap();
        q.items.push_back(held);
        if !q.scheduled {
            q.scheduled = true;
            drop(q);
            self.ready.lock().unwrap().push_back(lane.clone());
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Hands queued items to `out`, one turn per ready origin in rotation,
    /// until `out` closes. Run by exactly one task.
    pub async fn dispatch(&self, out: impl ItemSink<T>) {
        let mut turn = Vec::with_capacity(TURN_ITEMS);
        loop {
            let lane = loop {
                // A `notify_one` with nobody waiting is stored, so a push
                // between this check and the wait is not missed.
                if let Some(lane) = self.ready.lock().unwrap().pop_front() {
                    break lane;
                }
                self.wake.notified().await;
            };
            let turn_items = self.turns.get(&lane.origin);
            let again = {
                let mut q = lane.queue.lock().unwrap();
                let n = q.items.len().min(turn_items);
                turn.extend(q.items.drain(..n));
                q.scheduled = !q.items.is_empty();
                q.scheduled
            };
            if again {
                self.ready.lock().unwrap().push_back(lane);
            }
            for Held { item, permits } in turn.drain(..) {
                if out.deliver(item).await.is_err() {
                    self.close();
                    return;
                }
                drop(permits);
            }
        }
    }

    /// Refuses later pushes and drops what is queued (its reservations with
    /// it).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let lanes: Vec<_> = self.ready.lock().unwrap().drain(..).collect();
        for lane in lanes {
            lane.queue.lock().unwrap().items.clear();
        }
    }
}

/// Why an incoming connection was refused before its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `connections_max` connections are open.
    Full,
    /// Its origin has `connections_per_origin_max` open.
    OriginFull,
    /// Its origin opened connections faster than its rate allows.
    OriginRate,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "connections_max",
            Refusal::OriginFull => "origin_connections",
            Refusal::OriginRate => "origin_rate",
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Connection admission per origin: open connections counted, new ones
/// rate limited. Owned by the accept loop; the open counts are shared with
/// the connections so that they can give their unit back.
pub(crate) struct Admission {
    open_max: u32,
    rate: f64,
    burst: f64,
    open: HashMap<IpAddr, Arc<AtomicU32>>,
    buckets: HashMap<IpAddr, Bucket>,
}

impl Admission {
    /// `rate` connections a second per origin with bursts of `burst`; a
    /// `rate` of 0 turns the limiter off.
    pub fn new(open_max: u32, rate: u32, burst: u32) -> Admission {
        Admission {
            open_max,
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            open: HashMap::new(),
            buckets: HashMap::new(),
        }
    }

    /// Admits a connection from `origin` now, returning the counter that its
    /// [`OriginSlot`] gives back, or why not.
    pub fn admit(&mut self, origin: IpAddr, now: Instant) -> Result<OriginSlot, Refusal> {
        let open = self.open.entry(origin).or_default().clone();
        if open.load(Ordering::Acquire) >= self.open_max {
            return Err(Refusal::OriginFull);
        }
        if self.rate > 0.0 {
            if self.buckets.len() >= ADMISSION_ORIGINS_MAX {
                let (rate, burst) = (self.rate, self.burst);
                self.buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
            }
            let b = self.buckets.entry(origin).or_insert(Bucket { tokens: self.burst, at: now });
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.rate).min(self.burst);
            b.at = now;
            if b.tokens < 1.0 {
                return Err(Refusal::OriginRate);
            }
            b.tokens -= 1.0;
        }
        if self.open.len() >= ADMISSION_ORIGINS_MAX {
            self.open.retain(|_, n| n.load(Ordering::Acquire) > 0 || Arc::strong_count(n) > 1);
        }
        open.fetch_add(1, Ordering::AcqRel);
        Ok(OriginSlot { open })
    }
}

/// One connection's unit of its origin's open count.
pub(crate) struct OriginSlot {
    open: Arc<AtomicU32>,
}

impl Drop for OriginSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn origins_group_ipv6_by_64_and_unmap_ipv4() {
        let a: SocketAddr = "[2001:db8:1:2:3:4:5:6]:1".parse().unwrap();
        let b: SocketAddr = "[2001:db8:1:2:ffff::1]:2".parse().unwrap();
        let c: SocketAddr = "[2001:db8:1:3::1]:2".parse().unwrap();
        assert_eq!(origin_of(a), origin_of(b));
        assert_ne!(origin_of(a), origin_of(c));
        let m: SocketAddr = "[::ffff:127.0.0.2]:9".parse().unwrap();
        assert_eq!(origin_of(m), "127.0.0.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn admission_caps_open_connections_and_rate_per_origin() {
        let t0 = Instant::now();
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut adm = Admission::new(2, 10, 3);
        let s1 = adm.admit(x, t0).unwrap();
        let _s2 = adm.admit(x, t0).unwrap();
        assert_eq!(adm.admit(x, t0).err(), Some(Refusal::OriginFull));
        // Another origin is not affected.
        let _y1 = adm.admit(y, t0).unwrap();
        drop(s1);
        // A slot is back, but the burst of 3 is spent (2 admitted + ... ).
        let _s3 = adm.admit(x, t0).unwrap();
        drop(_s3);
        assert_eq!(adm.admit(x, t0).err(), Some(Refusal::OriginRate));
        // 10 a second: one token after 100 ms.
        let _s4 = adm.admit(x, t0 + Duration::from_millis(110)).unwrap();
    }

    #[tokio::test]
    async fn a_smaller_turn_gives_an_origin_a_smaller_share_under_contention() {
        let turns: Arc<OriginTurns> = Default::default();
        let (x, y): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        turns.set(x, 4);
        assert_eq!((turns.get(&x), turns.get(&y)), (4, TURN_ITEMS));
        let fair: Arc<Fair<u8>> = Arc::new(Fair::new(1 << 20, turns));
        let budget = Arc::new(Semaphore::new(1 << 20));
        let (a, b) = (fair.lane(x), fair.lane(y));
        for _ in 0..10 * TURN_ITEMS {
            for (lane, tag) in [(&a, 0u8), (&b, 1u8)] {
                let permits = [budget.clone().try_acquire_many_owned(1).unwrap(), budget.clone().try_acquire_many_owned(1).unwrap()];
                fair.push(lane, Held { item: tag, permits }).unwrap();
            }
        }
        let (tx, mut rx) = mpsc::channel(1);
        let f = fair.clone();
        tokio::spawn(async move { f.dispatch(tx).await });
        let mut from_x = 0;
        for _ in 0..4 * (TURN_ITEMS + 4) {
            from_x += usize::from(rx.recv().await.unwrap() == 0);
        }
        // Four rotations: 4 items of x's and TURN_ITEMS of y's each.
        assert_eq!(from_x, 16);
    }

    #[test]
    fn a_host_whose_ops_come_to_nothing_gets_ever_smaller_turns() {
        let turns = OriginTurns::default();
        let (bad, good): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        turns.record_outcomes([(bad, 0, 10), (good, 10, 10)]);
        let s = turns.scores.lock().unwrap()[&bad];
        assert!((s - (1.0 - HOST_SCORE_ALPHA)).abs() < 1e-6, "score {s}");
        assert_eq!(turns.get(&bad), host_turn(s));
        assert!(turns.get(&bad) < TURN_ITEMS);
        assert_eq!(turns.get(&good), TURN_ITEMS);
        // Commit after commit its turn shrinks, down to TURN_ITEMS_MIN.
        let mut last = turns.get(&bad);
        for _ in 0..50 {
            turns.record_outcomes([(bad, 1, 100)]);
            assert!(turns.get(&bad) <= last);
            last = turns.get(&bad);
        }
        assert_eq!(last, TURN_ITEMS_MIN);
        // Ops that apply again bring it back.
        for _ in 0..50 {
            turns.record_outcomes([(bad, 10, 10)]);
        }
        assert_eq!(turns.get(&bad), TURN_ITEMS);
    }

    #[test]
    fn past_hosts_scored_max_the_hosts_back_near_1_are_forgotten_first() {
        let turns = OriginTurns::default();
        let bad: IpAddr = "10.0.0.1".parse().unwrap();
        turns.record_outcomes([(bad, 0, 10)]);
        let honest = (0..HOSTS_SCORED_MAX as u32).map(|i| (IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i)), 9, 10));
        turns.record_outcomes(honest);
        let scores = turns.scores.lock().unwrap();
        assert_eq!(scores.keys().collect::<Vec<_>>(), [&bad]);
        drop(scores);
        assert!(turns.get(&bad) < TURN_ITEMS);
    }

    #[tokio::test]
    async fn dispatch_alternates_between_origins_and_keeps_each_in_order() {
        let fair: Arc<Fair<(u8, u32)>> = Arc::new(Fair::new(1 << 20, Default::default()));
        let budget = Arc::new(Semaphore::new(1 << 20));
        let (a, b) = (fair.lane("10.0.0.1".parse().unwrap()), fair.lane("10.0.0.2".parse().unwrap()));
        let permit = |n| budget.clone().try_acquire_many_owned(n).unwrap();
        // Origin a queues 4 turns' worth before b queues one.
        for i in 0..(4 * TURN_ITEMS) as u32 {
            fair.push(&a, Held { item: (0, i), permits: [permit(1), permit(1)] }).unwrap();
        }
        for i in 0..TURN_ITEMS as u32 {
            fair.push(&b, Held { item: (1, i), permits: [permit(1), permit(1)] }).unwrap();
        }
        let (tx, mut rx) = mpsc::channel(1);
        let f = fair.clone();
        let task = tokio::spawn(async move { f.dispatch(tx).await });
        let mut got = Vec::new();
        for _ in 0..5 * TURN_ITEMS {
            got.push(rx.recv().await.unwrap());
        }
        // b's whole queue is out by the end of the second turn.
        let b_last = got.iter().rposition(|x| x.0 == 1).unwrap();
        assert!(b_last < 2 * TURN_ITEMS, "b was served at {b_last}");
        for origin in [0, 1] {
            let seq: Vec<u32> = got.iter().filter(|x| x.0 == origin).map(|x| x.1).collect();
            assert!(seq.windows(2).all(|w| w[0] + 1 == w[1]), "origin {origin} out of order");
        }
        // Once the channel is gone, the next item ends the dispatcher, and
        // every reservation is handed back.
        drop(rx);
        fair.push(&a, Held { item: (0, 0), permits: [permit(1), permit(1)] }).unwrap();
        task.await.unwrap();
        assert_eq!(budget.available_permits(), 1 << 20);
        assert!(fair.push(&a, Held { item: (0, 0), permits: [permit(1), permit(1)] }).is_err());
    }
}
