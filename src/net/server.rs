//! The accept side of the QUIC transport: connections, streams, frames, and
//! the hand-off of decoded items to the node through its [`ItemSink`] (the
//! node's bounded ingest), fed fairly from one queue per origin (`fair`).
//!
//! Tasks: one accept loop; one task per connection; one task per stream that
//! reads, decodes and queues frames on its origin's lane; one dispatcher that
//! hands the lanes' items to the node's sink in turn; one writer task per
//! bidirectional stream that drains its [`Reply`] queue. Decoding runs in the
//! stream task, so its cost spreads over the tokio workers.
//!
//! Backpressure: a stream task reserves each frame's bytes (its origin's
//! share, then the global budget) before reading it, and the reservation is
//! held until the node's sink has taken the item. While the node is full the
//! sink waits, the budgets fill, stream tasks stop reading, quinn
//! stops extending flow-control credit, and the peers' writes block. What the
//! node holds is therefore bounded by (see [`ServerConfig`]):
//! - quinn's buffers: `connections_max × connection_receive_window_bytes`;
//! - frames between quinn and the sink, queued ones included:
//!   `frames_buffered_bytes_max`, of which one origin `origin_frames_buffered_bytes_max`;
//! - past the sink: the node's choice (its ingest queue's capacity).
//!
//! Connection slots (`connections_max`) are taken in the accept loop, before
//! the handshake. Once half are open, an address must first prove it
//! receives what is sent to it (a QUIC Retry, stateless and smaller than the
//! Initial it answers), so spoofed Initials cannot hold the rest; the last
//! few slots are kept for the configured peers' addresses (`peer_ips`).
//!
//! A peer's fault (a frame over the limit, a truncated frame, a frame that
//! does not decode) stops that stream with [`ERR_MALFORMED`] and is counted;
//! the connection and its other streams go on (SPEC §10).

use std::io;
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, describe_counter, describe_gauge, gauge, Unit};
use quinn::{Endpoint, IdleTimeout, RecvStream, TransportConfig, VarInt};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};

use super::codes::{ERR_MALFORMED, ERR_SHUTDOWN, ERR_TIMEOUT};
pub use super::reply::{Reply, ReplyClosed, TrySendError, REPLY_FRAMES_QUEUED_MAX, REPLY_FRAME_WRITE_TIMEOUT_MS};
use super::fair::{origin_of, Admission, Fair, Held, ItemSink, Lane, OriginSlot, OriginTurns, Refusal};
use super::frame::{FrameError, StreamBuf, FRAME_CONTENT_BYTES_MAX, FRAME_PREFIX_BYTES};
use super::tls::{self, Ed25519Key, NodeCert, TlsError};
use crate::limits::{CONNECTIONS_RETRY_FROM_PERCENT, PEER_SLOTS_PERCENT_MAX, PEER_SLOTS_PER_PEER};

/// How long shutdown waits for peers to acknowledge the connection close, so
/// they learn of it at once instead of after their idle timeout. Three PTOs on
/// a WAN path are well under this.
pub const SHUTDOWN_DRAIN_MS: u32 = 1_000;

/// Every bound of the QUIC server. All counts and sizes are fixed-width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// UDP address to bind. Default `127.0.0.1:7400`, the node's default
    /// (`node::config`): loopback, so a node is exposed only when asked.
    pub listen: SocketAddr,
    /// Connections open at once, handshaking ones included; beyond, an
    /// incoming connection is refused and counted. Default 256: a node has a
    /// handful of peers and some hundreds of clients, and this bounds quinn's
    /// buffers at `256 × connection_receive_window_bytes` (640 MiB at the
    /// default window) in the worst case of a node that stops reading.
    /// Once [`ServerConfig::connections_retry_from`] are open, an address
    /// must be validated (QUIC Retry) before it takes a slot; the last
    /// [`ServerConfig::peer_slots_reserved`] are kept for `peer_ips`.
    pub connections_max: u32,
    /// Concurrent streams a peer may open on one connection, for each of uni
    /// and bi (and the same for streams opened towards us as a client).
    /// Default 32: a peer uses a few (gossip, sync); a client one per
    /// subscription. It bounds stream tasks at `connections_max × 2 × 32`.
    pub streams_per_connection_max: u32,
    /// Bytes a peer may have in flight on one stream. Default 1.25 MiB
    /// (close to quinn's own default): above one maximum frame and its
    /// prefix, so a maximum-size frame never waits for a window update.
    pub stream_receive_window_bytes: u32,
    /// Bytes a peer may have in flight on one connection, all streams
    /// together; also our send window per connection. Default 2.5 MiB: two
    /// streams at full window, and at a 100 ms RTT 25 MiB/s ≈ 87k ops/s of
    /// 300 bytes, above the ≈ 83k ops/s verify ceiling of a node
    /// (NUMBERS.md), so the window does not limit one peer even on a WAN.
    pub connection_receive_window_bytes: u32,
    /// Frame content limit after the 4-byte prefix. Default and maximum
    /// 1,048,576 (SPEC §7); lower only in tests, since a lower value rejects
    /// frames the SPEC calls valid.
    pub frame_bytes_max: u32,
    /// A connection with no traffic for this long is closed, freeing its
    /// slot. Default 30 s: clients keep links alive with pings every third of
    /// this, so it takes two lost in a row to drop a live peer, while a dead
    /// one is reclaimed within half a minute.
    pub idle_timeout_ms: u32,
    /// Bytes of frames held between quinn and the node's sink, all
    /// streams together: a frame's length is reserved before it is allocated
    /// and released once the sink has taken its item. Without it, every
    /// stream could hold a frame of up to 1 MiB (16k streams: 16 GiB).
    /// Default 64 MiB: ≈ 220k ops of 300 bytes, over 2 s of work at the
    /// verify ceiling, enough to keep the pipeline fed. At least
    /// `frame_bytes_max`, so a maximum frame can always be reserved.
    pub frames_buffered_bytes_max: u64,
    /// The share of `frames_buffered_bytes_max` one origin (an IPv4
    /// address or an IPv6 /64, see `fair`) may hold, its queued items
    /// included. Default 16 MiB: ≈ 50k ops of 300 bytes, more than a second
    /// of work for the whole node, so one busy peer is never starved by its
    /// share, while a stalling or flooding host leaves three quarters of the
    /// budget to the others.
    pub origin_frames_buffered_bytes_max: u64,
    /// Connections one origin may have open at once; beyond, refused before
    /// the handshake and counted. Default 64, a quarter of `connections_max`.
    pub connections_per_origin_max: u32,
    /// New connections a second one origin may open, on average; 0 turns
    /// the limit off. Default 200, with bursts of
    /// `connection_burst_per_origin` (default 1000): far above what a peer
    /// or a client needs, and far below what a handshake flood needs to
    /// take the node's CPU (each handshake costs both sides ~1 ms of crypto).
    pub connection_rate_per_origin: u32,
    pub connection_burst_per_origin: u32,
    /// Once a frame's bytes are reserved, its content must arrive within
    /// this, else the stream is stopped with `ERR_TIMEOUT` and counted: it
    /// bounds how long a slow sender can hold part of the byte budget.
    /// Default 10 s: 1 MiB in 10 s is 100 KB/s, below any useful link.
    pub frame_receive_timeout_ms: u32,
    /// The addresses of the node's configured peers (`--peer`): a
    /// connection from one of them may take the slots kept for peers. Only
    /// the address is known before the handshake, so a peer is matched by
    /// its IP (the one it sends from). Default none.
    pub peer_ips: Vec<IpAddr>,
}

/// What each frame is charged in the byte budgets beyond its content: the
/// queued item's own size, so that empty frames are bounded too.
pub const FRAME_CHARGE_OVERHEAD_BYTES: u32 = 64;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            connections_max: 256,
            streams_per_connection_max: 32,
            stream_receive_window_bytes: 1_310_720,
            connection_receive_window_bytes: 2_621_440,
            frame_bytes_max: FRAME_CONTENT_BYTES_MAX,
            idle_timeout_ms: 30_000,
            frames_buffered_bytes_max: 64 * 1024 * 1024,
            origin_frames_buffered_bytes_max: 16 * 1024 * 1024,
            connections_per_origin_max: 64,
            connection_rate_per_origin: 200,
            connection_burst_per_origin: 1000,
            frame_receive_timeout_ms: 10_000,
            peer_ips: Vec::new(),
        }
    }
}

/// A [`ServerConfig`] value out of range.
#[derive(Debug, thiserror::Error)]
#[error("net config: {field} {why}")]
pub struct ConfigError {
    pub field: &'static str,
    pub why: &'static str,
}

impl ServerConfig {
    /// Checks the bounds against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, field, why| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError { field, why })
            }
        };
        check(self.connections_max >= 1, "connections_max", "must be at least 1")?;
        check(self.streams_per_connection_max >= 1, "streams_per_connection_max", "must be at least 1")?;
        check(self.stream_receive_window_bytes >= 1, "stream_receive_window_bytes", "must be at least 1")?;
        check(
            self.connection_receive_window_bytes >= self.stream_receive_window_bytes,
            "connection_receive_window_bytes",
            "must be at least stream_receive_window_bytes",
        )?;
        check(
            (1..=FRAME_CONTENT_BYTES_MAX).contains(&self.frame_bytes_max),
            "frame_bytes_max",
            "must be in 1..=1048576 (SPEC §7)",
        )?;
        // Zero would mean "no idle timeout" to QUIC: an unbounded wait.
        check(self.idle_timeout_ms >= 1, "idle_timeout_ms", "must be at least 1")?;
        let charge_max = u64::from(self.frame_bytes_max) + u64::from(FRAME_CHARGE_OVERHEAD_BYTES);
        check(
            self.origin_frames_buffered_bytes_max >= charge_max,
            "origin_frames_buffered_bytes_max",
            "must be at least frame_bytes_max + 64",
        )?;
        check(
            self.frames_buffered_bytes_max >= self.origin_frames_buffered_bytes_max,
            "frames_buffered_bytes_max",
            "must be at least origin_frames_buffered_bytes_max",
        )?;
        check(self.connections_per_origin_max >= 1, "connections_per_origin_max", "must be at least 1")?;
        check(
            self.frames_buffered_bytes_max <= Semaphore::MAX_PERMITS as u64,
            "frames_buffered_bytes_max",
            "is too large",
        )?;
        check(self.frame_receive_timeout_ms >= 1, "frame_receive_timeout_ms", "must be at least 1")?;
        Ok(())
    }

    /// Open connections from which a new connection whose address is not
    /// validated is answered with a QUIC Retry instead of taking a slot:
    /// [`CONNECTIONS_RETRY_FROM_PERCENT`] of `connections_max`, at least 1.
    pub fn connections_retry_from(&self) -> u32 {
        let share = u64::from(self.connections_max) * u64::from(CONNECTIONS_RETRY_FROM_PERCENT) / 100;
        (share as u32).max(1)
    }

    /// Slots of `connections_max` that only a connection from one of
    /// `peer_ips` may take: [`PEER_SLOTS_PER_PEER`] per distinct address,
    /// at most [`PEER_SLOTS_PERCENT_MAX`] of `connections_max`.
    pub fn peer_slots_reserved(&self) -> u32 {
        let peers = self.peer_ips.iter().map(|ip| ip.to_canonical()).collect::<HashSet<_>>().len();
        let wanted = u64::try_from(peers).unwrap_or(u64::MAX).saturating_mul(u64::from(PEER_SLOTS_PER_PEER));
        let share_max = u64::from(self.connections_max) * u64::from(PEER_SLOTS_PERCENT_MAX) / 100;
        wanted.min(share_max) as u32
    }

    /// The QUIC transport parameters for both directions. `keep_alive` is
    /// set for our client side only: a node keeps its links to peers up,
    /// while the server lets idle clients go.
    pub(crate) fn transport_config(&self, keep_alive: bool) -> TransportConfig {
        let mut transport = TransportConfig::default();
        transport
            .max_concurrent_uni_streams(VarInt::from_u32(self.streams_per_connection_max))
            .max_concurrent_bidi_streams(VarInt::from_u32(self.streams_per_connection_max))
            .stream_receive_window(VarInt::from_u32(self.stream_receive_window_bytes))
            .receive_window(VarInt::from_u32(self.connection_receive_window_bytes))
            .send_window(u64::from(self.connection_receive_window_bytes))
            .max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(self.idle_timeout_ms))))
            // Unused by dagfold: refuse datagrams rather than buffer them.
            .datagram_receive_buffer_size(None);
        if keep_alive {
            transport.keep_alive_interval(Some(Duration::from_millis(u64::from(self.idle_timeout_ms / 3).max(1))));
        }
        transport
    }
}

/// Why an endpoint could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    #[error("bind {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

/// Makes the node's endpoint: bound to `cfg.listen`, serving with `cert`
/// (its identity, `tls::identity_cert`) and the stateless-reset key kept in
/// `tls_dir` (made on first use), and able to dial peers presenting the
/// same identity, accepting any server key (`client::connect`; a known
/// key: `client::Dialer`). Needs a tokio runtime (quinn spawns its driver).
pub fn make_endpoint(cfg: &ServerConfig, tls_dir: &Path, cert: &NodeCert) -> Result<Endpoint, NetError> {
    cfg.validate()?;
    let mut server = tls::server_config(cert)?;
    server.transport_config(Arc::new(cfg.transport_config(false)));
    // Connection attempts not yet handled by the accept loop: it handles
    // each at once, so a backlog of one limit's worth is ample.
    server.max_incoming(cfg.connections_max as usize);
    // The persisted reset key: peers of a previous run of this node get a
    // stateless reset they accept (see `tls`), not 30 s of silence.
    let reset_key = tls::load_or_create_reset_key(tls_dir)?;
    let bind = |source| NetError::Bind { addr: cfg.listen, source };
    let socket = std::net::UdpSocket::bind(cfg.listen).map_err(bind)?;
    let runtime = quinn::default_runtime().ok_or_else(|| bind(io::Error::other("no async runtime found")))?;
    let mut endpoint_cfg = quinn::EndpointConfig::new(Arc::new(reset_key));
    endpoint_cfg.cid_generator(|| Box::new(RandomCids));
    let mut endpoint = Endpoint::new(endpoint_cfg, Some(server), socket, runtime).map_err(bind)?;
    endpoint.set_default_client_config(client_config(cfg, Some(cert), None)?);
    Ok(endpoint)
}

/// Random 8-byte connection ids. quinn's default generator tags its ids
/// with a key made per process and silently drops packets whose id lacks
/// the tag, so a restarted node would never answer the connections of its
/// previous run with the stateless reset its persisted key allows. Without
/// the tag, such packets get the reset (quinn sends at most one per 20 ms,
/// each smaller than the packet that caused it).
struct RandomCids;

impl quinn::ConnectionIdGenerator for RandomCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        use rand::RngCore;
        let mut id = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut id);
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The client config of our endpoints: presenting `identity` (else
/// anonymous), accepting the server only if it proves `expect` (any key
/// when `None`), our transport bounds, keep-alive on.
pub(crate) fn client_config(
    cfg: &ServerConfig,
    identity: Option<&NodeCert>,
    expect: Option<Ed25519Key>,
) -> Result<quinn::ClientConfig, NetError> {
    let mut client = tls::client_config(identity, expect)?;
    client.transport_config(Arc::new(cfg.transport_config(true)));
    Ok(client)
}

/// Turns a frame's content into the node's item.
pub trait FrameDecoder: Send + Sync + 'static {
    type Item: Send + 'static;
    /// Decode one frame's content; Err means malformed (SPEC §10): the
    /// stream is closed with an application error, counted; the connection
    /// goes on.
    ///
    /// The error carries nothing because the transport's only reaction is
    /// to stop the stream and count it; why it failed is the decoder's to
    /// count, if it wants.
    #[allow(clippy::result_unit_err)]
    fn decode(&self, frame: &[u8]) -> Result<Self::Item, ()>;
}

/// One decoded frame, as handed to the node.
#[derive(Debug)]
pub struct Inbound<T> {
    /// Unique per connection for the life of the server (never reused).
    pub conn_id: u64,
    /// The peer's address when its connection was accepted.
    pub remote: SocketAddr,
    /// The Ed25519 key the peer proved in the handshake (SPEC §10); `None`
    /// for an anonymous client.
    pub peer_key: Option<Ed25519Key>,
    pub item: T,
    /// Present for frames that came on a bidirectional stream: writes frames
    /// back on that stream.
    pub reply: Option<Reply>,
}

/// Metric names, all prefixed `dagfold_net_`.
pub mod metric {
    pub const CONNECTIONS_ACCEPTED: &str = "dagfold_net_connections_accepted_total";
    pub const CONNECTIONS_REFUSED: &str = "dagfold_net_connections_refused_total";
    /// Incoming connections answered with a QUIC Retry (address validation)
    /// instead of a slot, slots running short.
    pub const CONNECTIONS_RETRIED: &str = "dagfold_net_connections_retried_total";
    pub const HANDSHAKES_FAILED: &str = "dagfold_net_handshakes_failed_total";
    pub const CONNECTIONS_OPEN: &str = "dagfold_net_connections_open";
    /// Origins (IPv4 addresses, IPv6 /64s) with a connection or queued items.
    pub const ORIGINS: &str = "dagfold_net_origins";
    /// Label `direction`: `uni` or `bi`.
    pub const STREAMS_OPENED: &str = "dagfold_net_streams_opened_total";
    pub const FRAMES_RECEIVED: &str = "dagfold_net_frames_received_total";
    /// Prefix and content of every complete frame.
    pub const BYTES_RECEIVED: &str = "dagfold_net_bytes_received_total";
    /// Label `reason`: `oversize`, `truncated` or `decode`.
    pub const FRAMES_MALFORMED: &str = "dagfold_net_frames_malformed_total";
    pub const FRAMES_TIMED_OUT: &str = "dagfold_net_frames_timed_out_total";
    pub const REPLIES_TIMED_OUT: &str = "dagfold_net_replies_timed_out_total";
}

fn describe_metrics() {
    describe_counter!(metric::CONNECTIONS_ACCEPTED, "QUIC connections whose handshake completed");
    describe_counter!(
        metric::CONNECTIONS_REFUSED,
        "QUIC connections refused before the handshake, by reason (connections_max, origin_connections, origin_rate)"
    );
    describe_counter!(
        metric::CONNECTIONS_RETRIED,
        "QUIC connections answered with a Retry (address validation) before taking a slot, slots running short"
    );
    describe_gauge!(metric::ORIGINS, "origins (IPv4 addresses, IPv6 /64s) with a connection or queued frames");
    describe_counter!(metric::HANDSHAKES_FAILED, "QUIC handshakes that failed or timed out");
    describe_gauge!(metric::CONNECTIONS_OPEN, "QUIC connections open, handshaking ones included");
    describe_counter!(metric::STREAMS_OPENED, "streams opened by peers, by direction");
    describe_counter!(metric::FRAMES_RECEIVED, "complete frames received");
    describe_counter!(metric::BYTES_RECEIVED, Unit::Bytes, "bytes of complete frames received, prefixes included");
    describe_counter!(metric::FRAMES_MALFORMED, "malformed frames (stream stopped), by reason");
    describe_counter!(metric::FRAMES_TIMED_OUT, "frames whose content did not arrive in time (stream stopped)");
    describe_counter!(metric::REPLIES_TIMED_OUT, "reply frames the peer did not take in time (stream reset)");
}

/// What every stream task needs.
struct ServerShared<D: FrameDecoder> {
    decoder: Arc<D>,
    /// Decoded items wait here, one queue per origin, for the dispatcher.
    fair: Fair<Inbound<D::Item>>,
    /// Permits are bytes of frames held between quinn and the node's
    /// sink, all origins together (each frame charged its length plus
    /// [`FRAME_CHARGE_OVERHEAD_BYTES`]).
    frame_bytes_budget: Arc<Semaphore>,
    frame_bytes_max: u32,
    frame_receive_timeout: Duration,
}

/// Accepts connections and streams on `endpoint` and hands each decoded
/// frame to `items`, each origin in turn (see [`super::fair`]), until
/// `shutdown` turns true (or its sender drops, or the endpoint closes). Then
/// closes the endpoint with [`ERR_SHUTDOWN`], waits up to
/// [`SHUTDOWN_DRAIN_MS`] for peers to learn of it, and stops every task.
///
/// `cfg` is the one `endpoint` was made with; its transport bounds already
/// live in the endpoint, the rest are applied here.
pub async fn run_server<D: FrameDecoder>(
    endpoint: Endpoint,
    cfg: ServerConfig,
    decoder: Arc<D>,
    items: impl ItemSink<Inbound<D::Item>>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConfigError> {
    run_server_with_turns(endpoint, cfg, decoder, items, shutdown, Default::default()).await
}

/// [`run_server`], with each origin's items per turn taken from `turns`,
/// which the node updates as it learns what an origin's frames are worth.
pub async fn run_server_with_turns<D: FrameDecoder>(
    endpoint: Endpoint,
    cfg: ServerConfig,
    decoder: Arc<D>,
    items: impl ItemSink<Inbound<D::Item>>,
    mut shutdown: watch::Receiver<bool>,
    turns: Arc<OriginTurns>,
) -> Result<(), ConfigError> {
    cfg.validate()?;
    describe_metrics();
    // All validated to fit a semaphore.
    let shared = Arc::new(ServerShared {
        decoder,
        fair: Fair::new(cfg.origin_frames_buffered_bytes_max as usize, turns),
        frame_bytes_budget: Arc::new(Semaphore::new(cfg.frames_buffered_bytes_max as usize)),
        frame_bytes_max: cfg.frame_bytes_max,
        frame_receive_timeout: Duration::from_millis(u64::from(cfg.frame_receive_timeout_ms)),
    });
    let dispatcher = {
        let shared = shared.clone();
        tokio::spawn(async move { shared.fair.dispatch(items).await })
    };
    let open = Arc::new(AtomicU32::new(0));
    let slots = Slots::of(&cfg);
    let peer_ips: HashSet<IpAddr> = cfg.peer_ips.iter().map(|ip| ip.to_canonical()).collect();
    let mut admission =
        Admission::new(cfg.connections_per_origin_max, cfg.connection_rate_per_origin, cfg.connection_burst_per_origin);
    // One entry per connection; finished ones are reaped at each accept, so
    // it holds at most connections_max + 1.
    let mut connections = JoinSet::new();
    let mut conn_id_next: u64 = 0;

    let stop = async move {
        // An error means the sender dropped: nobody is left to keep us up.
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);
    loop {
        let incoming = tokio::select! {
            biased;
            () = &mut stop => break,
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break, // the endpoint was closed
            },
        };
        while let Some(done) = connections.try_join_next() {
            propagate_panic(done);
        }
        let remote = incoming.remote_address();
        let origin = origin_of(remote);
        let from_peer = peer_ips.contains(&remote.ip().to_canonical());
        // Only this loop adds to `open`, so the check cannot be raced past.
        let admitted = match slots.gate(open.load(Ordering::Acquire), incoming.remote_address_validated(), from_peer) {
            Gate::Retry => {
                // Stateless: the Retry holds nothing here, and quinn's
                // client comes back with its token at once.
                counter!(metric::CONNECTIONS_RETRIED).increment(1);
                if let Err(not_retried) = incoming.retry() {
                    // Only if quinn may not retry, which it guarantees for
                    // an unvalidated address: refuse rather than trust it.
                    not_retried.into_incoming().refuse();
                }
                continue;
            }
            Gate::Full => Err(Refusal::Full),
            Gate::Admit => admission.admit(origin, Instant::now()),
        };
        let origin_slot = match admitted {
            Ok(slot) => slot,
            Err(why) => {
                counter!(metric::CONNECTIONS_REFUSED, "reason" => why.label()).increment(1);
                incoming.refuse();
                continue;
            }
        };
        let slot = ConnectionSlot::take(open.clone(), origin_slot);
        let conn_id = conn_id_next;
        conn_id_next += 1;
        let lane = shared.fair.lane(origin);
        gauge!(metric::ORIGINS).set(shared.fair.origins() as f64);
        connections.spawn(serve_connection(incoming, conn_id, slot, lane, shared.clone()));
    }

    close_endpoint(&endpoint);
    let drain = Duration::from_millis(u64::from(SHUTDOWN_DRAIN_MS));
    let _ = tokio::time::timeout(drain, endpoint.wait_idle()).await;
    connections.shutdown().await;
    dispatcher.abort();
    shared.fair.close();
    Ok(())
}

/// The connection slots as the accept loop sees them, before the origin's
/// admission: which incoming connections must validate their address
/// first, and which slots a connection may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slots {
    /// `connections_max`.
    max: u32,
    /// Of `max`, those only a configured peer's address may take.
    kept_for_peers: u32,
    /// Open connections from which an unvalidated address gets a Retry.
    retry_from: u32,
}

/// What [`Slots::gate`] says of an incoming connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// Answer with a Retry: the address must answer before taking a slot.
    Retry,
    /// Every slot this connection may take is taken: refuse it.
    Full,
    /// A slot is free for it: on to its origin's admission.
    Admit,
}

impl Slots {
    fn of(cfg: &ServerConfig) -> Slots {
        let slots = Slots {
            max: cfg.connections_max,
            kept_for_peers: cfg.peer_slots_reserved(),
            retry_from: cfg.connections_retry_from(),
        };
        // The limits' shares keep every slot kept for peers behind a Retry,
        // so a spoofed peer address cannot hold them.
        assert!(slots.kept_for_peers < slots.max && slots.retry_from <= slots.max - slots.kept_for_peers);
        slots
    }

    /// `open` connections are open; `validated`: the incoming address has
    /// proved it receives (a Retry or a NEW_TOKEN token); `from_peer`: it is
    /// a configured peer's.
    fn gate(&self, open: u32, validated: bool, from_peer: bool) -> Gate {
        if open >= self.retry_from && !validated {
            return Gate::Retry;
        }
        let max = if from_peer { self.max } else { self.max - self.kept_for_peers };
        if open >= max {
            Gate::Full
        } else {
            Gate::Admit
        }
    }
}

/// Closes every connection of `endpoint` with [`ERR_SHUTDOWN`] and refuses
/// new ones.
pub fn close_endpoint(endpoint: &Endpoint) {
    endpoint.close(VarInt::from_u32(ERR_SHUTDOWN), b"shutdown");
}

/// One unit of `connections_max` and of the origin's open connections, held
/// for the life of a connection task (handshake and stream tasks included,
/// since those hold memory).
struct ConnectionSlot {
    open: Arc<AtomicU32>,
    _origin: OriginSlot,
}

impl ConnectionSlot {
    fn take(open: Arc<AtomicU32>, origin: OriginSlot) -> ConnectionSlot {
        open.fetch_add(1, Ordering::AcqRel);
        gauge!(metric::CONNECTIONS_OPEN).increment(1.0);
        ConnectionSlot { open, _origin: origin }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let before = self.open.fetch_sub(1, Ordering::AcqRel);
        assert!(before >= 1, "connection slots out of balance");
        gauge!(metric::CONNECTIONS_OPEN).decrement(1.0);
    }
}

/// A task that panicked is a programmer's error: carry the panic up.
fn propagate_panic(done: Result<(), JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// What the stream tasks of one connection share.
struct ConnectionCtx<D: FrameDecoder> {
    conn_id: u64,
    remote: SocketAddr,
    peer_key: Option<Ed25519Key>,
    lane: Arc<Lane<Inbound<D::Item>>>,
    shared: Arc<ServerShared<D>>,
}

async fn serve_connection<D: FrameDecoder>(
    incoming: quinn::Incoming,
    conn_id: u64,
    slot: ConnectionSlot,
    lane: Arc<Lane<Inbound<D::Item>>>,
    shared: Arc<ServerShared<D>>,
) {
    let _slot = slot;
    // The handshake is bounded by the idle timeout, which quinn applies from
    // the first packet.
    let conn = match incoming.accept() {
        Ok(connecting) => connecting.await,
        Err(e) => Err(e),
    };
    let conn = match conn {
        Ok(conn) => conn,
        Err(_) => {
            counter!(metric::HANDSHAKES_FAILED).increment(1);
            return;
        }
    };
    counter!(metric::CONNECTIONS_ACCEPTED).increment(1);
    let peer_key = tls::peer_key(&conn);
    let ctx = Arc::new(ConnectionCtx { conn_id, remote: conn.remote_address(), peer_key, lane, shared });
    // Bounded by the transport: at most streams_per_connection_max of each
    // direction are open (quinn grants new ones as old ones are released),
    // plus one writer per bidirectional stream.
    let mut streams = JoinSet::new();
    // After the connection closes, quinn still hands out streams that had
    // arrived (their data is complete), one direction at a time: accept each
    // direction until it reports the error.
    let (mut uni_open, mut bi_open) = (true, true);
    while uni_open || bi_open {
        tokio::select! {
            Some(done) = streams.join_next(), if !streams.is_empty() => propagate_panic(done),
            uni = conn.accept_uni(), if uni_open => match uni {
                Ok(recv) => {
                    counter!(metric::STREAMS_OPENED, "direction" => "uni").increment(1);
                    streams.spawn(read_stream(recv, None, ctx.clone()));
                }
                Err(_) => uni_open = false,
            },
            bi = conn.accept_bi(), if bi_open => match bi {
                Ok((send, recv)) => {
                    counter!(metric::STREAMS_OPENED, "direction" => "bi").increment(1);
                    let reply = Reply::spawn(send, &mut streams);
                    streams.spawn(read_stream(recv, Some(reply), ctx.clone()));
                }
                Err(_) => bi_open = false,
            },
        }
    }
    // The connection is gone. Stream tasks still waiting for their budget
    // hold complete frames the peer was told (by QUIC acks) we received: let
    // them queue those rather than drop them. The rest end at once on the
    // lost connection. Server shutdown aborts this task, and them with it.
    while let Some(done) = streams.join_next().await {
        propagate_panic(done);
    }
}

/// Reserves `n` bytes of the origin's and then of the global budget, so
/// that an origin waits on its own share before it touches the global one.
/// Each reservation is whole, never partial, so frames waiting for budget
/// never hold part of it.
///
/// Why no smaller, per-connection share: a stream waiting here leaves its
/// bytes in quinn, inside the connection's receive window, and a frame
/// already reserved on the same connection needs that window to arrive. A
/// share below the frames one connection has in flight would let a
/// connection's waiting streams starve its own reserved ones until the frame
/// timeout. The origin share (default 16 maximum frames) is far above what a
/// peer has in flight; a host that exceeds it waits on itself.
async fn reserve<D: FrameDecoder>(ctx: &ConnectionCtx<D>, n: u32) -> [OwnedSemaphorePermit; 2] {
    let never_closed = "the frame budgets are never closed";
    let origin = ctx.lane.bytes.clone().acquire_many_owned(n).await.expect(never_closed);
    let global = ctx.shared.frame_bytes_budget.clone().acquire_many_owned(n).await.expect(never_closed);
    [origin, global]
}

async fn read_stream<D: FrameDecoder>(mut recv: RecvStream, reply: Option<Reply>, ctx: Arc<ConnectionCtx<D>>) {
    let shared = &ctx.shared;
    // Handles looked up once per stream, not once per frame.
    let frames_received = counter!(metric::FRAMES_RECEIVED);
    let bytes_received = counter!(metric::BYTES_RECEIVED);
    let mut buf = StreamBuf::new();
    loop {
        let len = match buf.length(&mut recv, shared.frame_bytes_max).await {
            Ok(Some(len)) => len,
            Ok(None) => return, // the peer finished the stream between frames
            Err(e) => return end_on_error(&mut recv, e),
        };
        // Reserve the frame's bytes before reading them. Waiting here stops
        // reading, which pushes back on the peer like a full channel. The
        // content is buffered as it arrives, so a frame announced but not
        // sent holds a reservation, not memory.
        let permits = reserve(&ctx, len + FRAME_CHARGE_OVERHEAD_BYTES).await;
        match tokio::time::timeout(shared.frame_receive_timeout, buf.content(&mut recv, len)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return end_on_error(&mut recv, e),
            Err(_elapsed) => {
                counter!(metric::FRAMES_TIMED_OUT).increment(1);
                let _ = recv.stop(VarInt::from_u32(ERR_TIMEOUT));
                return;
            }
        }
        frames_received.increment(1);
        bytes_received.increment(u64::from(FRAME_PREFIX_BYTES) + u64::from(len));
        let mut decoded = Err(());
        buf.take(len, |content| decoded = shared.decoder.decode(content));
        let Ok(item) = decoded else {
            counter!(metric::FRAMES_MALFORMED, "reason" => "decode").increment(1);
            let _ = recv.stop(VarInt::from_u32(ERR_MALFORMED));
            return;
        };
        let inbound = Inbound { conn_id: ctx.conn_id, remote: ctx.remote, peer_key: ctx.peer_key, item, reply: reply.clone() };
        // The reservation stays held while queued: the item is (about) the
        // frame's size, and the queue is exactly where memory would pile up.
        if shared.fair.push(&ctx.lane, Held { item: inbound, permits }).is_err() {
            // The node's ingest is gone: it takes nothing more.
            let _ = recv.stop(VarInt::from_u32(ERR_SHUTDOWN));
            return;
        }
    }
}

/// Ends a stream after a read error: malformed framing is counted and the
/// stream stopped with `ERR_MALFORMED`; a reset or a lost connection needs
/// nothing more.
fn end_on_error(recv: &mut RecvStream, e: FrameError) {
    let reason = match e {
        FrameError::Oversize { .. } => "oversize",
        FrameError::Truncated { .. } => "truncated",
        _ => return,
    };
    counter!(metric::FRAMES_MALFORMED, "reason" => reason).increment(1);
    // Fails only if the stream is already closed: then it is closed anyway.
    let _ = recv.stop(VarInt::from_u32(ERR_MALFORMED));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_ask_for_a_retry_past_the_threshold_and_keep_some_for_peers() {
        let cfg = |max, peers: &[[u8; 4]]| ServerConfig {
            connections_max: max,
            peer_ips: peers.iter().map(|ip| IpAddr::from(*ip)).collect(),
            ..ServerConfig::default()
        };
        let (p, q) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        // (connections_max, peers) -> (kept for peers, retry from)
        let shares: [(ServerConfig, u32, u32); 6] = [
            (cfg(256, &[]), 0, 128),
            (cfg(256, &[p, q, p]), 4, 128),
            (cfg(4, &[p]), 1, 2),
            (cfg(3, &[p]), 0, 1),
            (cfg(1, &[p, q]), 0, 1),
            (cfg(8, &[p, q, [10, 0, 0, 3]]), 2, 4),
        ];
        for (c, kept, retry_from) in shares {
            let slots = Slots::of(&c);
            assert_eq!((slots.kept_for_peers, slots.retry_from), (kept, retry_from), "{c:?}");
        }
        let slots = Slots::of(&cfg(4, &[p]));
        // (open, validated, from a peer) -> gate
        let cases = [
            (0, false, false, Gate::Admit), // no pressure, no Retry
            (1, false, false, Gate::Admit),
            (2, false, false, Gate::Retry),
            (2, true, false, Gate::Admit),
            (3, true, false, Gate::Full), // the last slot is the peer's
            (3, false, true, Gate::Retry),
            (3, true, true, Gate::Admit),
            (4, true, true, Gate::Full),
            (4, false, false, Gate::Retry),
        ];
        for (open, validated, from_peer, gate) in cases {
            assert_eq!(slots.gate(open, validated, from_peer), gate, "open {open} validated {validated} peer {from_peer}");
        }
    }
}
