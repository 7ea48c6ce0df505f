//! The QUIC transport, over loopback (127.0.0.1, port 0).
//! Every wait is bounded by `WAIT` or a shorter, named timeout.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dagfold::net::fair::TURN_ITEMS;
use dagfold::net::frame::{read_frame, FrameError};
use dagfold::net::server::{ConfigError, FRAME_CHARGE_OVERHEAD_BYTES};
use dagfold::net::{
    client_endpoint, connect, connect_peer, identity_cert, make_endpoint, open_bi, run_server, send_frames_uni, tls, FrameDecoder, Inbound, PeerAddr,
    ServerConfig, ERR_MALFORMED,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use quinn::{Connection, Endpoint, VarInt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// The bound on any single wait in these tests: generous for a loaded CI
/// machine, short enough that a hang fails fast.
const WAIT: Duration = Duration::from_secs(10);

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// One recorder for the whole test binary (metrics recorders are global);
/// tests run in parallel, so they assert counters only grow.
fn metrics() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().expect("install the recorder"))
}

/// Value of one counter line in Prometheus text, 0 when absent.
fn counter_value(text: &str, series: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(series))
        .filter_map(|rest| rest.strip_prefix(' '))
        .filter_map(|value| value.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .next()
        .unwrap_or(0)
}

/// Accepts frames whose first byte is 0; counts every decode it accepts.
#[derive(Default)]
struct ZeroFirst {
    decoded: AtomicU64,
}

impl FrameDecoder for ZeroFirst {
    type Item = Vec<u8>;
    fn decode(&self, frame: &[u8]) -> Result<Vec<u8>, ()> {
        if frame.first() == Some(&0) {
            self.decoded.fetch_add(1, Ordering::SeqCst);
            Ok(frame.to_vec())
        } else {
            Err(())
        }
    }
}

struct TestServer {
    addr: SocketAddr,
    items: mpsc::Receiver<Inbound<Vec<u8>>>,
    decoder: Arc<ZeroFirst>,
    cfg: ServerConfig,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), ConfigError>>,
    _tls_dir: tempfile::TempDir,
}

impl TestServer {
    async fn start(cfg: ServerConfig, channel_capacity: usize) -> TestServer {
        let tls_dir = tempfile::tempdir().expect("tempdir");
        let cfg = ServerConfig { listen: loopback(), ..cfg };
        let endpoint = make_endpoint(&cfg, tls_dir.path(), &identity_cert(&[9u8; 32]).expect("cert")).expect("make_endpoint");
        let addr = endpoint.local_addr().expect("local addr");
        let decoder = Arc::new(ZeroFirst::default());
        let (tx, items) = mpsc::channel(channel_capacity);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(run_server(endpoint, cfg.clone(), decoder.clone(), tx, shutdown_rx));
        TestServer { addr, items, decoder, cfg, shutdown, task, _tls_dir: tls_dir }
    }

    async fn client(&self) -> (Endpoint, Connection) {
        self.client_from([127, 0, 0, 1]).await
    }

    /// A client bound to another loopback address: another origin.
    async fn client_from(&self, ip: [u8; 4]) -> (Endpoint, Connection) {
        let endpoint = client_endpoint(SocketAddr::from((ip, 0)), &self.cfg).expect("client endpoint");
        let conn = timeout(WAIT, connect(&endpoint, self.addr)).await.expect("connect in time").expect("connect");
        (endpoint, conn)
    }

    async fn next(&mut self) -> Inbound<Vec<u8>> {
        timeout(WAIT, self.items.recv()).await.expect("an item in time").expect("server running")
    }

    async fn stop(self) {
        self.shutdown.send(true).expect("server listening for shutdown");
        let done = timeout(WAIT, self.task).await.expect("server stops in time");
        done.expect("server task did not panic").expect("valid config");
    }
}

/// A frame the decoder accepts: `[0, tag...]`.
fn good(tag: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8];
    frame.extend_from_slice(tag);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_from_many_connections_and_streams_arrive_in_order_per_stream() {
    const CONNECTIONS: u8 = 3;
    const FRAMES_PER_STREAM: u8 = 20;
    let mut server = TestServer::start(ServerConfig::default(), 16).await;

    let mut clients = Vec::new();
    let mut senders = Vec::new();
    for c in 0..CONNECTIONS {
        let (endpoint, conn) = server.client().await;
        // Two uni streams and one bi stream per connection; a frame is
        // [0, connection, stream, sequence].
        for s in 0..2u8 {
            let conn = conn.clone();
            senders.push(tokio::spawn(async move {
                let frames: Vec<Vec<u8>> = (0..FRAMES_PER_STREAM).map(|i| good(&[c, s, i])).collect();
                send_frames_uni(&conn, frames).await.expect("uni frames acknowledged");
            }));
        }
        let bi_conn = conn.clone();
        senders.push(tokio::spawn(async move {
            let (mut writer, _reader) = open_bi(&bi_conn).await.expect("open bi");
            for i in 0..FRAMES_PER_STREAM {
                writer.write(&good(&[c, 2, i])).await.expect("bi write");
            }
            writer.finish().expect("finish");
            writer.send_stream().stopped().await.expect("bi frames acknowledged");
        }));
        clients.push((endpoint, conn));
    }

    let total = usize::from(CONNECTIONS) * 3 * usize::from(FRAMES_PER_STREAM);
    let mut per_stream: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
    let mut conn_ids: BTreeMap<u8, u64> = BTreeMap::new();
    for _ in 0..total {
        let inbound = server.next().await;
        let [zero, c, s, i] = inbound.item[..] else { panic!("unexpected item {:?}", inbound.item) };
        assert_eq!(zero, 0);
        assert_eq!(inbound.reply.is_some(), s == 2, "replies exist exactly for the bi stream");
        assert!(inbound.remote.ip().is_loopback());
        // Every frame of one client connection carries the same conn_id, and
        // different connections different ones.
        let id = *conn_ids.entry(c).or_insert(inbound.conn_id);
        assert_eq!(id, inbound.conn_id);
        per_stream.entry((c, s)).or_default().push(i);
    }
    let distinct: std::collections::BTreeSet<u64> = conn_ids.values().copied().collect();
    assert_eq!(distinct.len(), usize::from(CONNECTIONS));
    assert_eq!(per_stream.len(), usize::from(CONNECTIONS) * 3);
    let expected: Vec<u8> = (0..FRAMES_PER_STREAM).collect();
    for (stream, seqs) in &per_stream {
        assert_eq!(seqs, &expected, "stream {stream:?} in order");
    }
    for sender in senders {
        timeout(WAIT, sender).await.expect("sender done in time").expect("sender ok");
    }
    drop(clients);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_stops_only_its_stream() {
    let metrics = metrics();
    let mut server = TestServer::start(ServerConfig::default(), 16).await;
    let (_endpoint, conn) = server.client().await;

    // A healthy bi stream that keeps delivering throughout.
    let (mut healthy, _healthy_replies) = open_bi(&conn).await.expect("open bi");
    healthy.write(&good(b"before")).await.expect("write");
    assert_eq!(server.next().await.item, good(b"before"));

    // A uni stream: one good frame, then one the decoder rejects.
    let mut bad = conn.open_uni().await.expect("open uni");
    dagfold::net::write_frame(&mut bad, &good(b"ok")).await.expect("write");
    dagfold::net::write_frame(&mut bad, &[1, 2, 3]).await.expect("write");
    assert_eq!(server.next().await.item, good(b"ok"));
    let stopped = timeout(WAIT, bad.stopped()).await.expect("stopped in time").expect("connection alive");
    assert_eq!(stopped, Some(VarInt::from_u32(ERR_MALFORMED)));

    // The same connection, and its other stream, go on.
    healthy.write(&good(b"after")).await.expect("write");
    assert_eq!(server.next().await.item, good(b"after"));
    send_frames_uni(&conn, [good(b"new stream")]).await.expect("a new stream works");
    assert_eq!(server.next().await.item, good(b"new stream"));

    // A truncated frame (the stream ends inside the content) delivers
    // nothing and is counted.
    let mut truncated = conn.open_uni().await.expect("open uni");
    truncated.write_all(&10u32.to_le_bytes()).await.expect("write");
    truncated.write_all(&[0, 1, 2]).await.expect("write");
    truncated.finish().expect("finish");
    let _ = timeout(WAIT, truncated.stopped()).await.expect("acknowledged in time");
    healthy.write(&good(b"last")).await.expect("write");
    assert_eq!(server.next().await.item, good(b"last"), "nothing from the truncated frame came first");

    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = metrics.render();
        let decode = counter_value(&text, "dagfold_net_frames_malformed_total{reason=\"decode\"}");
        let truncated = counter_value(&text, "dagfold_net_frames_malformed_total{reason=\"truncated\"}");
        if decode >= 1 && truncated >= 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "malformed frames counted by reason:\n{text}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_length_is_refused_from_the_prefix_alone() {
    let metrics = metrics();
    let mut server = TestServer::start(ServerConfig::default(), 16).await;
    let (_endpoint, conn) = server.client().await;

    // Only the prefix is sent and the stream stays open: had the server
    // tried to allocate and read 4 GiB it would still be waiting. The stop
    // proves it decided from the prefix, before allocating.
    let mut send = conn.open_uni().await.expect("open uni");
    send.write_all(&u32::MAX.to_le_bytes()).await.expect("write prefix");
    let stopped = timeout(WAIT, send.stopped()).await.expect("stopped in time").expect("connection alive");
    assert_eq!(stopped, Some(VarInt::from_u32(ERR_MALFORMED)));

    // One byte over the SPEC limit is refused the same way.
    let mut send = conn.open_uni().await.expect("open uni");
    send.write_all(&(1_048_576u32 + 1).to_le_bytes()).await.expect("write prefix");
    let stopped = timeout(WAIT, send.stopped()).await.expect("stopped in time").expect("connection alive");
    assert_eq!(stopped, Some(VarInt::from_u32(ERR_MALFORMED)));

    // A frame exactly at the limit is fine, on the same connection.
    let mut largest = good(b"");
    largest.resize(1_048_576, 7);
    send_frames_uni(&conn, [largest.clone()]).await.expect("largest frame");
    assert_eq!(server.next().await.item, largest);

    let text = metrics.render();
    assert!(counter_value(&text, "dagfold_net_frames_malformed_total{reason=\"oversize\"}") >= 2, "{text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_on_a_bi_stream_reach_the_client() {
    let mut server = TestServer::start(ServerConfig::default(), 16).await;
    let (_endpoint, conn) = server.client().await;

    let (mut writer, mut reader) = open_bi(&conn).await.expect("open bi");
    writer.write(&good(b"ping")).await.expect("write");
    writer.finish().expect("finish");

    let inbound = server.next().await;
    assert_eq!(inbound.item, good(b"ping"));
    let reply = inbound.reply.expect("a reply handle on a bi stream");
    reply.send(b"pong 1".to_vec()).await.expect("send");
    reply.try_send(Vec::new()).expect("an empty frame is valid framing");
    reply.clone().send(b"pong 2".to_vec()).await.expect("send from a clone");
    drop(reply);

    let mut replies = Vec::new();
    // The server finishes the stream once every handle is gone.
    while let Some(frame) = timeout(WAIT, reader.read()).await.expect("reply in time").expect("read reply") {
        replies.push(frame);
    }
    assert_eq!(replies, vec![b"pong 1".to_vec(), Vec::new(), b"pong 2".to_vec()]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_channel_pushes_back_on_the_sender() {
    const FRAME_BYTES: usize = 1024;
    const STREAM_WINDOW_BYTES: u32 = 64 * 1024;
    // Room for this many frames in the origin's byte share.
    const SHARE_FRAMES: u64 = 8;
    let share = SHARE_FRAMES * (FRAME_BYTES as u64 + u64::from(FRAME_CHARGE_OVERHEAD_BYTES));
    // Small windows and share so flow control bites quickly and the bound is
    // tight.
    let cfg = ServerConfig {
        stream_receive_window_bytes: STREAM_WINDOW_BYTES,
        connection_receive_window_bytes: 2 * STREAM_WINDOW_BYTES,
        frame_bytes_max: FRAME_BYTES as u32,
        origin_frames_buffered_bytes_max: share,
        frames_buffered_bytes_max: share,
        ..ServerConfig::default()
    };
    // Capacity 1, and nobody drains it (yet).
    let mut server = TestServer::start(cfg, 1).await;
    let (_endpoint, conn) = server.client().await;
    let (mut writer, _reader) = open_bi(&conn).await.expect("open bi");

    let mut frame = good(b"");
    frame.resize(FRAME_BYTES, 0xaa);
    // The frame as it goes on the wire. It is written with raw, partial
    // writes so that giving up on a blocked write never leaves a frame cut
    // at an unknown point: `offset` is how much of the current frame the
    // stream has taken.
    let mut wire = (FRAME_BYTES as u32).to_le_bytes().to_vec();
    wire.extend_from_slice(&frame);
    // Far more than the window holds: if the server buffered without bound,
    // every write would complete.
    const FRAMES_OFFERED: usize = 10_000;
    // The writer is blocked when a write has been pending this long while
    // the server held its whole share and decoded nothing more. On a busy
    // machine a write may wait this long on a server that is merely slow:
    // the server's progress is the condition, this only how often it is
    // looked at.
    const WRITE_PENDING: Duration = Duration::from_millis(500);
    let decoder = server.decoder.clone();
    let decoded = move || decoder.decoded.load(Ordering::SeqCst);
    let blocked_by = tokio::time::Instant::now() + WAIT;
    let mut written = 0usize;
    let mut offset = 0usize;
    while written < FRAMES_OFFERED {
        let decoded_before = decoded();
        // One `write` takes what flow control allows, or nothing if it is
        // cancelled while pending.
        match timeout(WRITE_PENDING, writer.send_stream().write(&wire[offset..])).await {
            Ok(result) => offset += result.expect("write"),
            Err(_pending) if decoded() == decoded_before && decoded_before >= SHARE_FRAMES => break,
            Err(_pending) => {
                assert!(tokio::time::Instant::now() < blocked_by, "the server went on decoding: {} frames", decoded());
                continue;
            }
        }
        if offset == wire.len() {
            written += 1;
            offset = 0;
        }
    }
    // What can be in flight: the stream window, and the frames the server
    // holds (the byte share, one in the channel, one in the dispatcher's
    // hand), plus slack for a window update racing the last frames.
    let held_max = SHARE_FRAMES as usize + 2;
    let in_flight_max = STREAM_WINDOW_BYTES as usize / FRAME_BYTES + held_max + 16;
    assert!(written < in_flight_max, "the writer blocked after {written} frames (bound {in_flight_max})");
    // And it blocked because the window filled, not at the first frame.
    assert!(written >= STREAM_WINDOW_BYTES as usize / FRAME_BYTES / 2, "blocked after only {written} frames");

    // The server took exactly what its byte share and channel hold.
    let decoded = decoded() as usize;
    assert!(decoded <= held_max, "the server decoded {decoded} frames with room for {held_max}");

    // Draining the channel lets the writer go on: it ends the frame it was
    // cut in, if any, and writes one more.
    let frames_expected = written + usize::from(offset > 0) + 1;
    let pending_write = tokio::spawn(async move {
        writer.send_stream().write_all(&wire[offset..]).await.expect("the rest of the frame after draining");
        writer.write(&frame).await.expect("write after draining");
        writer
    });
    for _ in 0..frames_expected {
        let item = server.next().await;
        assert_eq!(item.item.len(), FRAME_BYTES);
    }
    let _writer = timeout(WAIT, pending_write).await.expect("the write completes once drained").expect("task");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_frame_holds_only_its_origins_share_until_its_deadline() {
    // Generous: every check that the share is held must come before it
    // (a busy machine only makes the test wait longer).
    const FRAME_RECEIVE_TIMEOUT: Duration = Duration::from_secs(6);
    let one = 1024 + u64::from(FRAME_CHARGE_OVERHEAD_BYTES);
    // An origin's share is one maximum frame, so one stalled frame fills it;
    // the global budget is two.
    let cfg = ServerConfig {
        frame_bytes_max: 1024,
        origin_frames_buffered_bytes_max: one,
        frames_buffered_bytes_max: 2 * one,
        frame_receive_timeout_ms: FRAME_RECEIVE_TIMEOUT.as_millis() as u32,
        ..ServerConfig::default()
    };
    let mut server = TestServer::start(cfg, 16).await;
    let (_endpoint, conn) = server.client().await;

    // A small frame, then a maximum frame announced with only part of it
    // sent, in one write: the server's stream task reads both at once and
    // asks for the stalled frame's reservation as soon as it has queued
    // the first. So once the first arrives, the stalled frame should hold
    // the origin's share or wait first in line for it (tokio's semaphores
    // are fair), and every later frame of the origin wait behind it.
    let stalled_since = tokio::time::Instant::now();
    let mut stalled = conn.open_uni().await.expect("open uni");
    let first = good(b"first");
    let bytes = [&(first.len() as u32).to_le_bytes()[..], &first, &1024u32.to_le_bytes(), &[0; 10]].concat();
    stalled.write_all(&bytes).await.expect("write");
    assert_eq!(server.next().await.item, first);
    // The server's deadline for the stalled frame is no earlier than this.
    let deadline = stalled_since + FRAME_RECEIVE_TIMEOUT;
    // Yet a frame of the origin sent right after the first one's arrival
    // was delivered first, 16 ms in, once in six runs under load (with
    // three busy loops; not understood yet: see the commit). A generous
    // second for the reservation, well inside the deadline: it can only
    // make the test slower.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let sender_conn = conn.clone();
    let sender = tokio::spawn(async move { send_frames_uni(&sender_conn, [good(b"waits")]).await });
    // The origin's next frame cannot be reserved while the first holds its
    // share, even on another connection...
    let (_e2, same_origin) = server.client().await;
    let same = tokio::spawn(async move { send_frames_uni(&same_origin, [good(b"same origin")]).await });
    // ...but another origin goes on at once.
    let (_e3, other_origin) = server.client_from([127, 0, 0, 2]).await;
    send_frames_uni(&other_origin, [good(b"other origin")]).await.expect("acknowledged");
    let item = server.next().await.item;
    assert!(tokio::time::Instant::now() < deadline, "too slow to test: the stalled frame's deadline passed before the other origin was served");
    assert_eq!(
        String::from_utf8_lossy(&item),
        "\0other origin",
        "a frame of the stalled origin was delivered while its share was full, at {:?}",
        stalled_since.elapsed()
    );
    // Nothing of the stalled origin before its deadline (a frame that
    // comes as it passes may be taken here: it is one of the late ones).
    let mut late = Vec::new();
    if let Ok(item) = tokio::time::timeout_at(deadline, server.items.recv()).await {
        let item = item.expect("server running").item;
        assert!(
            tokio::time::Instant::now() >= deadline,
            "a frame was delivered while its origin's share was full: {:?} at {:?}",
            String::from_utf8_lossy(&item),
            stalled_since.elapsed()
        );
        late.push(item);
    }

    let stopped = timeout(WAIT, stalled.stopped()).await.expect("stopped in time").expect("connection alive");
    assert_eq!(stopped, Some(VarInt::from_u32(dagfold::net::ERR_TIMEOUT)));
    while late.len() < 2 {
        late.push(server.next().await.item);
    }
    late.sort();
    assert_eq!(late, vec![good(b"same origin"), good(b"waits")]);
    timeout(WAIT, sender).await.expect("in time").expect("task").expect("acknowledged");
    timeout(WAIT, same).await.expect("in time").expect("task").expect("acknowledged");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_are_served_in_turn_not_first_come_first_served() {
    const FLOOD: usize = 2_000;
    const VALID: usize = 64;
    let mut server = TestServer::start(ServerConfig::default(), 1).await;
    // One origin queues a flood on 4 streams while nobody drains...
    let (_e1, flooder) = server.client().await;
    let mut tasks = Vec::new();
    for s in 0..4 {
        let conn = flooder.clone();
        tasks.push(tokio::spawn(async move {
            let frames: Vec<Vec<u8>> = (0..FLOOD / 4).map(|i| good(format!("f{s}-{i}").as_bytes())).collect();
            send_frames_uni(&conn, frames).await
        }));
    }
    for t in tasks {
        timeout(WAIT, t).await.expect("in time").expect("task").expect("acknowledged");
    }
    let wait_decoded = |n: u64| {
        let decoder = server.decoder.clone();
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            while decoder.decoded.load(Ordering::SeqCst) < n {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "only {} decoded",
                    decoder.decoded.load(Ordering::SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_decoded(FLOOD as u64).await;
    // ...then another origin sends a few, behind the whole flood in time.
    let (_e2, valid) = server.client_from([127, 0, 0, 3]).await;
    let frames: Vec<Vec<u8>> = (0..VALID).map(|i| good(format!("v{i:03}").as_bytes())).collect();
    send_frames_uni(&valid, frames.clone()).await.expect("acknowledged");
    wait_decoded((FLOOD + VALID) as u64).await;

    let mut got = Vec::new();
    for _ in 0..FLOOD + VALID {
        got.push(server.next().await.item);
    }
    let positions: Vec<usize> = got.iter().enumerate().filter(|(_, x)| x[1] == b'v').map(|(i, _)| i).collect();
    // First come, first served would put them last (from 2000 on). In turn,
    // they are out within a few turns: each of theirs alternates with one
    // of the flooder's, after what the channel and dispatcher held.
    let last = *positions.last().expect("the valid frames arrived");
    let bound = 2 * VALID + 2 * TURN_ITEMS + 2;
    assert!(last < bound, "the other origin's last frame came out at {last} (bound {bound})");
    // And in their order.
    let valid_got: Vec<Vec<u8>> = positions.iter().map(|&i| got[i].clone()).collect();
    assert_eq!(valid_got, frames);
    server.stop().await;
}

/// Connects, retrying while the server still refuses: a closed
/// connection's slot comes back once the server has seen the close.
async fn connect_once_freed(endpoint: &Endpoint, addr: SocketAddr) -> Connection {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(Ok(conn)) = timeout(WAIT, connect(endpoint, addr)).await {
            return conn;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn refused_total(why: &str) -> u64 {
    counter_value(&metrics().render(), &format!("dagfold_net_connections_refused_total{{reason=\"{why}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_is_refused_beyond_its_open_connections() {
    let cfg = ServerConfig { connections_per_origin_max: 2, ..ServerConfig::default() };
    let before = refused_total("origin_connections");
    let mut server = TestServer::start(cfg, 16).await;
    let (_e1, a) = server.client().await;
    let (_e2, _b) = server.client().await;
    let third = client_endpoint(loopback(), &server.cfg).expect("endpoint");
    let refused = timeout(WAIT, connect(&third, server.addr)).await.expect("answer in time");
    assert!(refused.is_err(), "a third connection from one origin is refused");
    assert!(refused_total("origin_connections") > before, "the refusal is counted by reason");
    // Another origin is not refused.
    let (_e3, c) = server.client_from([127, 0, 0, 4]).await;
    send_frames_uni(&c, [good(b"other")]).await.expect("acknowledged");
    assert_eq!(server.next().await.item, good(b"other"));
    // Once one closes, its slot is back.
    a.close(VarInt::from_u32(0), b"done");
    connect_once_freed(&third, server.addr).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_is_refused_beyond_its_connection_rate() {
    // Bursts of 3, then one every 1000 s: the fourth within the test is over.
    let cfg = ServerConfig { connection_rate_per_origin: 1, connection_burst_per_origin: 3, ..ServerConfig::default() };
    let before = refused_total("origin_rate");
    let server = TestServer::start(cfg, 16).await;
    for _ in 0..3 {
        let (_e, conn) = server.client().await;
        conn.close(VarInt::from_u32(0), b"done");
    }
    let fourth = client_endpoint(loopback(), &server.cfg).expect("endpoint");
    let refused = timeout(WAIT, connect(&fourth, server.addr)).await.expect("answer in time");
    assert!(refused.is_err(), "the fourth connection in a burst of 3 is refused");
    assert!(refused_total("origin_rate") > before, "the refusal is counted by reason");
    // Another origin has its own bucket.
    let (_e, _conn) = server.client_from([127, 0, 0, 5]).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused() {
    let cfg = ServerConfig { connections_max: 1, ..ServerConfig::default() };
    let mut server = TestServer::start(cfg, 16).await;
    let (first_endpoint, first) = server.client().await;
    send_frames_uni(&first, [good(b"first")]).await.expect("first connection works");
    assert_eq!(server.next().await.item, good(b"first"));

    let second = client_endpoint(loopback(), &server.cfg).expect("endpoint");
    let refused = timeout(WAIT, connect(&second, server.addr)).await.expect("answer in time");
    assert!(refused.is_err(), "a second connection is refused at connections_max = 1");

    // Once the first closes, its slot is free again.
    first.close(VarInt::from_u32(0), b"done");
    drop(first_endpoint);
    let conn = connect_once_freed(&second, server.addr).await;
    send_frames_uni(&conn, [good(b"third")]).await.expect("works after the slot is freed");
    assert_eq!(server.next().await.item, good(b"third"));
    server.stop().await;
}

fn retried_total() -> u64 {
    counter_value(&metrics().render(), "dagfold_net_connections_retried_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_half_the_slots_an_unvalidated_address_is_retried_and_still_connects() {
    // Four slots: from two open on, an address must be validated first.
    let cfg = ServerConfig { connections_max: 4, ..ServerConfig::default() };
    let mut server = TestServer::start(cfg, 16).await;
    let (_e1, _c1) = server.client().await;
    let (_e2, _c2) = server.client().await;
    let before = retried_total();
    // A fresh endpoint holds no token from this server: it is retried, and
    // quinn's client follows the Retry within `connect`.
    let (_e3, third) = server.client_from([127, 0, 0, 8]).await;
    assert!(retried_total() > before, "the unvalidated third connection is answered with a Retry, counted");
    send_frames_uni(&third, [good(b"after retry")]).await.expect("the retried connection works");
    assert_eq!(server.next().await.item, good(b"after retry"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_kept_for_a_peer_admits_it_while_others_are_refused() {
    // Four slots, one kept for the peer at 127.0.0.6.
    let peer_ip = [127, 0, 0, 6];
    let cfg = ServerConfig { connections_max: 4, peer_ips: vec![IpAddr::from(peer_ip)], ..ServerConfig::default() };
    let mut server = TestServer::start(cfg, 16).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(server.client().await);
    }
    let before = refused_total("connections_max");
    let other = client_endpoint(SocketAddr::from(([127, 0, 0, 7], 0)), &server.cfg).expect("endpoint");
    let refused = timeout(WAIT, connect(&other, server.addr)).await.expect("answer in time");
    assert!(refused.is_err(), "another host is refused: the last slot is the peer's");
    assert!(refused_total("connections_max") > before, "the refusal is counted");
    let (_pe, peer) = server.client_from(peer_ip).await;
    send_frames_uni(&peer, [good(b"peer")]).await.expect("the peer's connection works");
    assert_eq!(server.next().await.item, good(b"peer"));
    server.stop().await;
}

/// Framing edge cases, read directly off streams of a raw connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_edge_cases() {
    let tls_dir = tempfile::tempdir().expect("tempdir");
    let cfg = ServerConfig { listen: loopback(), ..ServerConfig::default() };
    let server = make_endpoint(&cfg, tls_dir.path(), &identity_cert(&[9u8; 32]).expect("cert")).expect("server endpoint");
    let addr = server.local_addr().expect("addr");
    let client = client_endpoint(loopback(), &cfg).expect("client endpoint");
    let accept = tokio::spawn(async move {
        let incoming = server.accept().await.expect("incoming");
        (server, incoming.await.expect("handshake"))
    });
    let conn = timeout(WAIT, connect(&client, addr)).await.expect("in time").expect("connect");
    let (_server, server_conn) = timeout(WAIT, accept).await.expect("in time").expect("accept");

    // Each case: raw bytes, whether to finish or reset, max_len, then the
    // frames read and the final outcome.
    enum End {
        Finish,
        Reset(u32),
    }
    struct Case {
        bytes: Vec<u8>,
        end: End,
        max_len: u32,
        frames: Vec<Vec<u8>>,
        last: fn(&Result<Option<Vec<u8>>, FrameError>) -> bool,
    }
    let frame = |content: &[u8]| {
        let mut bytes = (content.len() as u32).to_le_bytes().to_vec();
        bytes.extend_from_slice(content);
        bytes
    };
    let cases = vec![
        Case { bytes: vec![], end: End::Finish, max_len: 16, frames: vec![], last: |r| matches!(r, Ok(None)) },
        Case {
            bytes: [frame(b""), frame(b"ab")].concat(),
            end: End::Finish,
            max_len: 16,
            frames: vec![vec![], b"ab".to_vec()],
            last: |r| matches!(r, Ok(None)),
        },
        Case {
            bytes: frame(&[9; 16]),
            end: End::Finish,
            max_len: 16,
            frames: vec![vec![9; 16]],
            last: |r| matches!(r, Ok(None)),
        },
        Case {
            bytes: frame(&[9; 17]),
            end: End::Finish,
            max_len: 16,
            frames: vec![],
            last: |r| matches!(r, Err(FrameError::Oversize { len: 17, max: 16 })),
        },
        Case {
            bytes: vec![1, 0],
            end: End::Finish,
            max_len: 16,
            frames: vec![],
            last: |r| matches!(r, Err(FrameError::Truncated { expected: 4, got: 2 })),
        },
        Case {
            bytes: [frame(b"ok"), vec![5, 0, 0, 0, 1, 2]].concat(),
            end: End::Finish,
            max_len: 16,
            frames: vec![b"ok".to_vec()],
            last: |r| matches!(r, Err(FrameError::Truncated { expected: 5, got: 2 })),
        },
        Case {
            bytes: frame(b"ok"),
            end: End::Reset(77),
            max_len: 16,
            frames: vec![],
            // A reset may overtake data still in flight, so whether "ok"
            // arrives first is not fixed; the reset code is.
            last: |r| matches!(r, Err(FrameError::Reset(code)) if code.into_inner() == 77),
        },
    ];
    for (n, case) in cases.into_iter().enumerate() {
        let mut send = conn.open_uni().await.expect("open uni");
        send.write_all(&case.bytes).await.expect("write");
        // A stream with no bytes is only seen by the peer once finished.
        match case.end {
            End::Finish => send.finish().expect("finish"),
            End::Reset(code) => {
                // Let the data go out first, so the peer sees the stream.
                tokio::time::sleep(Duration::from_millis(50)).await;
                send.reset(VarInt::from_u32(code)).expect("reset");
            }
        }
        let mut recv = timeout(WAIT, server_conn.accept_uni()).await.expect("in time").expect("accept uni");
        let mut frames = Vec::new();
        let last = loop {
            let result = timeout(WAIT, read_frame(&mut recv, case.max_len)).await.expect("read in time");
            match result {
                Ok(Some(frame)) => frames.push(frame),
                other => break other,
            }
        };
        assert!((case.last)(&last), "case {n}: ended with {last:?}");
        if !matches!(case.end, End::Reset(_)) {
            assert_eq!(frames, case.frames, "case {n}");
        }
    }
}

/// SPEC §10: the server proves its identity key; a client that dials that
/// key (`KEY@ADDR`) connects, one that dials another key is refused in the
/// handshake; a client's key is proved to the server, or it is anonymous.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_proved_in_the_handshake() {
    let tls_dir = tempfile::tempdir().expect("tempdir");
    let cfg = ServerConfig { listen: loopback(), ..ServerConfig::default() };
    let public = |seed: [u8; 32]| dagfold::protocol::sig::public_key_from_seed(&seed);
    let (server_seed, client_seed) = ([1u8; 32], [2u8; 32]);
    let server = make_endpoint(&cfg, tls_dir.path(), &identity_cert(&server_seed).expect("cert")).expect("server endpoint");
    let addr = server.local_addr().expect("addr");
    let accepts = tokio::spawn(async move {
        let mut keys = Vec::new();
        // Two handshakes complete; the one dialing another key never does.
        while keys.len() < 2 {
            let incoming = server.accept().await.expect("incoming");
            if let Ok(conn) = incoming.await {
                keys.push(tls::peer_key(&conn));
                std::mem::forget(conn);
            }
        }
        (server, keys)
    });

    let me = identity_cert(&client_seed).expect("client cert");
    let client = dagfold::net::client::client_endpoint_as(loopback(), &cfg, Some(&me)).expect("client");
    let right = PeerAddr { key: Some(public(server_seed)), addr };
    let conn = timeout(WAIT, connect_peer(&client, &cfg, Some(&me), &right)).await.expect("in time").expect("the right key connects");
    assert_eq!(tls::peer_key(&conn), Some(public(server_seed)), "the client learns the server's key");
    let alpn = conn.handshake_data().and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok());
    assert_eq!(alpn.and_then(|d| d.protocol), Some(tls::ALPN.to_vec()));

    let wrong = PeerAddr { key: Some(public([3u8; 32])), addr };
    let refused = timeout(WAIT, connect_peer(&client, &cfg, Some(&me), &wrong)).await.expect("in time");
    assert!(refused.is_err(), "a dial of another key fails: {refused:?}");

    let anonymous = client_endpoint(loopback(), &cfg).expect("anonymous client");
    let _anon = timeout(WAIT, connect(&anonymous, addr)).await.expect("in time").expect("an anonymous client connects");
    let (_server, keys) = timeout(WAIT, accepts).await.expect("in time").expect("accepted");
    assert_eq!(keys, vec![Some(public(client_seed)), None], "the server sees the client's key, then none");
}


/// Frames written in one stream write (a gossip burst) arrive as the frames
/// they are, in order; a burst with an oversize frame writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_written_together_arrive_one_by_one() {
    let mut server = TestServer::start(ServerConfig::default(), 16).await;
    let (_endpoint, conn) = server.client().await;
    let mut send = conn.open_uni().await.expect("open uni");
    let (a, b, c) = (good(b"a"), good(b""), good(b"ccc"));
    dagfold::net::write_frames(&mut send, &[&a, &b, &c]).await.expect("write");
    for want in [&a, &b, &c] {
        assert_eq!(&server.next().await.item, want);
    }
    let oversize = vec![0u8; dagfold::net::FRAME_CONTENT_BYTES_MAX as usize + 1];
    let err = dagfold::net::write_frames(&mut send, &[&good(b"never"), &oversize]).await;
    assert!(matches!(err, Err(dagfold::net::FrameWriteError::Oversize { .. })), "{err:?}");
    dagfold::net::write_frames(&mut send, &[&good(b"next")]).await.expect("write");
    assert_eq!(server.next().await.item, good(b"next"), "nothing of the refused burst was written");
    server.stop().await;
}
