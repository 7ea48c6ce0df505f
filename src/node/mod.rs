//! `dagfold node`: the QUIC transport, the pipeline, status and metrics,
//! events, gossip, heartbeat and sync, wired together.
//!
//! Threads: a small tokio runtime for the network side (transport, the
//! HTTP API, peers, subscriptions, sync) and the pipeline's worker threads for
//! everything that decides or writes state.

pub mod author;
pub mod config;
pub mod feed;
pub mod hub;
pub mod peers;
pub mod serve;
pub mod subscribe;

use crate::clock::now_ms;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

pub use config::NodeConfig;

use crate::core::{Config, Decoded, Engine, Identity};
use crate::node::hub::Hub;
use crate::pipeline::{Pipeline, Work};
use crate::protocol::node::NodeMessage;
use crate::store::rocks::{RocksStore, StoreReader};
use crate::store::Store;

/// Items queued between the transport and the pipeline's batcher. 1024
/// ≈ 16 verifier batches: the batcher always finds a full batch while the
/// transport runs ahead, and it bounds this queue at ~1024 frames.
pub const INGEST_QUEUE_ITEMS: usize = 1024;

/// A frame as the transport decodes it, in its stream task.
pub enum Incoming {
    Core(Decoded),
    Node(NodeMessage),
}

pub struct NodeDecoder;

impl crate::net::FrameDecoder for NodeDecoder {
    type Item = Incoming;
    fn decode(&self, frame: &[u8]) -> Result<Incoming, ()> {
        match frame.first() {
            Some(&t) if NodeMessage::is_node_variant(t) => NodeMessage::decode(frame).map(Incoming::Node).ok_or(()),
            _ => crate::core::decode_frame(frame).map(Incoming::Core).map_err(|_| ()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("network: {0}")]
    Net(#[from] crate::net::server::NetError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("the API token file {path}: {source}")]
    Token { path: String, source: std::io::Error },
}


/// What the network side shares.
pub struct NodeShared {
    pub identity_json: String,
    /// The node's own identity key (the author of what the API writes).
    pub public_key: crate::protocol::PublicKey,
    /// Its X25519 public key (keys are delivered to it under this one).
    pub kem_public: [u8; 32],
    pub pipeline: Arc<crate::pipeline::PipelineState>,
    pub hub: Arc<Hub>,
    pub reader: StoreReader,
    pub peers: Vec<crate::net::PeerAddr>,
    /// The keys of the peers configured by key (`KEY@ADDR`): served every
    /// scope (SPEC §10).
    pub peer_keys: std::collections::HashSet<crate::protocol::PublicKey>,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub ingest: mpsc::Sender<Work>,
    /// The node's own writes (the API), through `ingest`.
    pub author: Arc<author::Author>,
    pub cfg: NodeConfig,
}

/// Hands what each host's ops came to, as the orderer reports it, to the
/// server's fair ingest, which weighs the host's turn by it.
struct HostTurns(Arc<crate::net::fair::OriginTurns>);

impl crate::pipeline::HostOutcomes for HostTurns {
    fn record(&self, outcomes: &mut dyn Iterator<Item = (std::net::IpAddr, u32, u32)>) {
        self.0.record_outcomes(outcomes);
    }
}

/// Runs a node until SIGINT or SIGTERM, then drains and closes.
pub fn run(cfg: NodeConfig) -> Result<(), NodeError> {
    let metrics = install_metrics();
    let mut store = RocksStore::open_tuned(&cfg.data_dir, cfg.memtable_bytes_max)?;
    let identity = crate::store::load_or_create_identity(&mut store)?;
    // After the store: its opening made the data directory private.
    let api_token = crate::api::load_or_create_token(&cfg.api_token_file)
        .map_err(|source| NodeError::Token { path: cfg.api_token_file.display().to_string(), source })?;
    let engine_cfg = Config {
        data_key_wait_ms: cfg.key_wait_ms,
        buffered_ops_per_scope_max: cfg.buffered_ops_per_scope_max,
        buffered_bytes_per_scope_max: cfg.buffered_bytes_per_scope_max,
        buffered_ops_total_max: cfg.buffered_ops_total_max,
        buffered_bytes_total_max: cfg.buffered_bytes_total_max,
        genesis_policy: if cfg.accept_any_scope {
            crate::core::GenesisPolicy::AcceptAll
        } else {
            crate::core::GenesisPolicy::Authors(cfg.accept_scopes_from.clone())
        },
        ..Config::default()
    };
    let started = std::time::Instant::now();
    let mut engine = Engine::restore(engine_cfg, identity.clone(), &store, store.cold_reader(), now_ms()).map_err(crate::store::StoreError::from)?;
    let restore_commit = engine.take_commit().map_err(crate::store::StoreError::from)?;
    if !restore_commit.writes.is_empty() {
        store.write(&restore_commit.writes, true)?;
    }
    engine.note_durable(restore_commit.number);
    let restored_ms = started.elapsed().as_millis();
    let peer_keys: std::collections::HashSet<_> = cfg.peers.iter().filter_map(|p| p.key).collect();
    let hub = Arc::new(Hub::new(engine.event_seqs(), peer_keys.clone()));
    let reader = store.reader();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.network_threads.max(1))
        .thread_name("dagfold-net")
        .on_thread_park(crate::idle::on_park)
        .on_thread_unpark(crate::idle::on_unpark)
        .enable_all()
        .build()?;
    let (ingest_tx, ingest_rx) = mpsc::channel::<Work>(INGEST_QUEUE_ITEMS);
    let (gossip_tx, gossip_rx) = mpsc::channel::<peers::Gossip>(peers::GOSSIP_QUEUE_OPS);
    let hub2 = hub.clone();
    let on_durable = Box::new(move |d: crate::pipeline::Committed| {
        hub2.dispatch(&d.events);
        // A member removed loses its live subscriptions at once (SPEC §10).
        for (scope, members) in &d.members {
            hub2.revoke(scope, members);
        }
        for (_, scope, bytes, origin) in d.applied {
            if bytes.is_empty() {
                continue; // no peers: nothing to gossip
            }
            if gossip_tx.try_send(peers::Gossip { tag: crate::protocol::MESSAGE_OP, bytes, origin, scope }).is_err() {
                // Peers catch up through heartbeat and sync.
                metrics::counter!("dagfold_gossip_dropped_total").increment(1);
            }
        }
        // Key deliveries this node made reach its peers by gossip, and a
        // recipient that missed them asks again (`KeysRequest`).
        for kd in d.delivered {
            let g = peers::Gossip { tag: crate::protocol::MESSAGE_KEY, bytes: crate::protocol::encode(&kd), origin: 0, scope: kd.scope };
            if gossip_tx.try_send(g).is_err() {
                metrics::counter!("dagfold_gossip_dropped_total").increment(1);
            }
        }
    });
    let mut pipe_cfg = cfg.pipeline.clone();
    pipe_cfg.applied_bytes = !cfg.peers.is_empty();
    // The orderer weighs each host's turn in the server's fair ingest.
    let origin_turns = Arc::new(crate::net::fair::OriginTurns::default());
    pipe_cfg.host_outcomes = Some(Arc::new(HostTurns(origin_turns.clone())));
    // The filter of the ops applied before, read while the node serves; a
    // damaged table found by it stops the node as at open (`fatal`).
    let cold_filter = engine.cold_filter_partial().then(|| (store.reader(), engine.cold_filter_bytes()));
    let pipe = Pipeline::start(pipe_cfg, engine, store, ingest_rx, on_durable);
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel::<crate::store::StoreError>();
    if let Some((reader, bytes)) = cold_filter {
        crate::pipeline::read_cold_filter(pipe.shared.clone(), move || {
            crate::core::cold::filter_of_stored_ops(&reader, bytes).inspect_err(|e| {
                let _ = fatal_tx.send(e.clone().into());
            })
        });
    }
    let shared = Arc::new(NodeShared {
        identity_json: identity_json(&identity).to_string(),
        public_key: identity.public_key,
        kem_public: identity.kem_public,
        pipeline: pipe.shared.clone(),
        hub,
        reader,
        peers: cfg.peers.clone(),
        peer_keys,
        metrics,
        author: Arc::new(author::Author::new(identity.clone(), pipe.shared.clone())),
        ingest: ingest_tx,
        cfg: cfg.clone(),
    });

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let result: Result<(), NodeError> = rt.block_on(async {
        let mut net_cfg = cfg.net.clone();
        net_cfg.listen = cfg.listen;
        // Connections from these may take the slots kept for peers.
        net_cfg.peer_ips = cfg.peers.iter().map(|p| p.addr.ip()).collect();
        let cert = crate::net::identity_cert(&identity.seed).map_err(crate::net::server::NetError::from)?;
        let endpoint = crate::net::make_endpoint(&net_cfg, &cfg.data_dir.join("tls"), &cert)?;
        let dialer = crate::net::Dialer::new(&endpoint, &net_cfg, cert);
        let listen = endpoint.local_addr()?;
        let admin_listener = tokio::net::TcpListener::bind(cfg.admin).await?;
        let admin_addr = admin_listener.local_addr()?;
        record_api_address(&cfg.data_dir, admin_addr)?;
        let mut first_line = identity_json(&identity);
        first_line["listen"] = listen.to_string().into();
        first_line["admin"] = admin_addr.to_string().into();
        first_line["api_token_file"] = cfg.api_token_file.display().to_string().into();
        first_line["data_dir"] = cfg.data_dir.display().to_string().into();
        first_line["restored_ms"] = (restored_ms as u64).into();
        first_line["peers"] = cfg.peers.iter().map(|p| p.to_string()).collect::<Vec<_>>().into();
        println!("{first_line}");
        let server = tokio::spawn(crate::net::server::run_server_with_turns(
            endpoint.clone(),
            net_cfg,
            Arc::new(NodeDecoder),
            serve::InboundSink(shared.clone()),
            shutdown_rx.clone(),
            origin_turns,
        ));
        let api_state = Arc::new(crate::api::ApiState::new(shared.clone(), api_token, shutdown_rx.clone()));
        // The store is open and restored, the QUIC endpoint listens.
        api_state.set_ready();
        // The API stops last: `/v1/ready` answers 503 while the rest drains.
        let (api_stop_tx, api_stop_rx) = watch::channel(false);
        let api = tokio::spawn(crate::api::serve(admin_listener, api_state.clone(), api_stop_rx));
        let peer_task = tokio::spawn(peers::run_peers(shared.clone(), dialer, gossip_rx, shutdown_rx.clone()));
        let fatal = tokio::select! {
            _ = wait_for_signal() => None,
            Some(e) = fatal_rx.recv() => Some(e),
        };
        // Not ready from the signal on, before anything drains.
        api_state.set_draining();
        eprintln!("dagfold: shutting down: draining the pipeline");
        let _ = shutdown_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        peer_task.abort();
        let _ = api_stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_millis(crate::api::API_DRAIN_MS + 500), api).await;
        crate::net::close_endpoint(&endpoint);
        fatal.map_or(Ok(()), |e| Err(e.into()))
    });
    // Dropping the last ingest senders lets the pipeline drain and stop.
    drop(shared);
    rt.shutdown_timeout(Duration::from_secs(2));
    pipe.join();
    eprintln!("dagfold: stopped");
    result
}

/// Writes the API's bound address to `<data-dir>/api-address` (one line,
/// owner-only, replaced whole at each start), where the client commands
/// find it (`client::Client::from_data_dir`).
fn record_api_address(data_dir: &std::path::Path, addr: std::net::SocketAddr) -> std::io::Result<()> {
    let path = data_dir.join(crate::client::API_ADDRESS_FILE);
    let temp = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    std::io::Write::write_all(&mut options.open(&temp)?, format!("{addr}\n").as_bytes())?;
    std::fs::rename(&temp, &path)
}

/// The node's identity as `dagfold identity`, `GET /v1/identity` and the
/// node's first line of output show it.
pub fn identity_json(id: &Identity) -> serde_json::Value {
    serde_json::json!({ "public_key": hex::encode(id.public_key), "kem_public_key": hex::encode(id.kem_public) })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

fn install_metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            5.0, 10.0, 64.0, 256.0, 1024.0, 4096.0,
        ])
        .expect("static buckets")
        .build_recorder();
    let handle = recorder.handle();
    // A second node in one process (tests) keeps the first recorder.
    let _ = metrics::set_global_recorder(recorder);
    handle
}
