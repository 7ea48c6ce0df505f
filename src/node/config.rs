//! The node's configuration: command-line flags, each also settable in a
//! TOML file (`--config`); a flag given on the command line wins.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::limits;
use crate::pipeline::PipelineConfig;

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub peers: Vec<SocketAddr>,
    pub key_wait_ms: u64,
    pub heartbeat_ms: u64,
    pub buffered_ops_per_scope_max: u64,
    pub buffered_bytes_per_scope_max: u64,
    pub buffered_ops_total_max: u64,
    pub buffered_bytes_total_max: u64,
    pub network_threads: usize,
    pub pipeline: PipelineConfig,
    pub net: crate::net::ServerConfig,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            data_dir: PathBuf::from("./dagfold-data"),
            listen: "127.0.0.1:7400".parse().unwrap(),
            admin: "127.0.0.1:7401".parse().unwrap(),
            peers: Vec::new(),
            key_wait_ms: limits::DATA_KEY_WAIT_MS_DEFAULT,
            heartbeat_ms: 1_000,
            buffered_ops_per_scope_max: limits::BUFFERED_OPS_PER_SCOPE_MAX,
            buffered_bytes_per_scope_max: limits::BUFFERED_BYTES_PER_SCOPE_MAX,
            buffered_ops_total_max: limits::BUFFERED_OPS_TOTAL_MAX,
            buffered_bytes_total_max: limits::BUFFERED_BYTES_TOTAL_MAX,
            network_threads: 1,
            pipeline: PipelineConfig::default(),
            net: crate::net::ServerConfig::default(),
        }
    }
}

/// `dagfold node` flags (see `--help`).
#[derive(clap::Args, Debug, Default)]
pub struct NodeArgs {
    /// A TOML file with any of the settings below (keys as the flags, with
    /// underscores: `data_dir`, `listen`, `peers = [..]`, ...).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the node keeps its RocksDB store, identity and TLS certificate
    /// [default: ./dagfold-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// QUIC address for peers and clients [default: 127.0.0.1:7400]
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// HTTP address for /v1/identity, /v1/scopes/{id} and /metrics
    /// [default: 127.0.0.1:7401]
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// A peer's QUIC address (repeatable): gossip, heartbeat and sync.
    #[arg(long = "peer")]
    pub peers: Vec<SocketAddr>,
    /// How long a data op waits in memory for its key before it is dropped
    /// for redelivery (SPEC §6 step 4) [default: 3000]
    #[arg(long)]
    pub key_wait_ms: Option<u64>,
    /// Interval of the heads heartbeat to peers [default: 1000]
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Buffered ops (pending + key waits) per scope before the oldest is
    /// evicted [default: 200000]
    #[arg(long)]
    pub buffered_ops_per_scope_max: Option<u64>,
    /// Buffered bytes per scope [default: 67108864]
    #[arg(long)]
    pub buffered_bytes_per_scope_max: Option<u64>,
    /// Buffered ops over all scopes [default: 400000]
    #[arg(long)]
    pub buffered_ops_total_max: Option<u64>,
    /// Buffered bytes over all scopes [default: 268435456]
    #[arg(long)]
    pub buffered_bytes_total_max: Option<u64>,
    /// Signature verification threads [default: 2, the cores of this machine kind]
    #[arg(long)]
    pub verifier_threads: Option<usize>,
    /// Network (tokio) threads [default: 1]
    #[arg(long)]
    pub network_threads: Option<usize>,
    /// Applied ops folded into one commit at most (group commit); a commit
    /// also closes at 4x as many received ops when most park [default: 4096]
    #[arg(long)]
    pub commit_ops_max: Option<usize>,
    /// `durable` (default): the WAL is synced before anything is emitted;
    /// `fast`: not synced (a process crash loses nothing, a power loss may
    /// lose the last commits).
    #[arg(long)]
    pub durability: Option<String>,
    /// QUIC connections open at once [default: 256]
    #[arg(long)]
    pub connections_max: Option<u32>,
    /// Concurrent streams per connection, each direction [default: 32]
    #[arg(long)]
    pub streams_per_connection_max: Option<u32>,
    /// QUIC connections open at once from one origin (an IPv4 address or
    /// an IPv6 /64) [default: a quarter of --connections-max]
    #[arg(long)]
    pub connections_per_origin_max: Option<u32>,
    /// New connections a second from one origin, on average; 0 for no limit
    /// [default: 200]
    #[arg(long)]
    pub connection_rate_per_origin: Option<u32>,
    /// Burst of new connections one origin may open above its rate
    /// [default: 1000]
    #[arg(long)]
    pub connection_burst_per_origin: Option<u32>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    #[serde(default)]
    peers: Vec<SocketAddr>,
    key_wait_ms: Option<u64>,
    heartbeat_ms: Option<u64>,
    buffered_ops_per_scope_max: Option<u64>,
    buffered_bytes_per_scope_max: Option<u64>,
    buffered_ops_total_max: Option<u64>,
    buffered_bytes_total_max: Option<u64>,
    verifier_threads: Option<usize>,
    network_threads: Option<usize>,
    commit_ops_max: Option<usize>,
    durability: Option<String>,
    connections_max: Option<u32>,
    streams_per_connection_max: Option<u32>,
    connections_per_origin_max: Option<u32>,
    connection_rate_per_origin: Option<u32>,
    connection_burst_per_origin: Option<u32>,
}

/// Why the settings make no node configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("--durability takes `durable` or `fast`, not {0:?}")]
    Durability(String),
    #[error("verifier_threads, commit_ops_max and heartbeat_ms must be at least 1")]
    AtLeastOne,
    #[error("buffered_ops_total_max must be at least buffered_ops_per_scope_max (and both ≥ 1)")]
    BufferedOps,
    #[error(transparent)]
    Net(#[from] crate::net::server::ConfigError),
}

impl NodeArgs {
    pub fn resolve(self) -> Result<NodeConfig, ResolveError> {
        let file: FileConfig = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ResolveError::Read { path: p.clone(), source })?;
                toml::from_str(&text).map_err(|source| ResolveError::Parse { path: p.clone(), source })?
            }
            None => FileConfig::default(),
        };
        let mut c = NodeConfig::default();
        macro_rules! pick {
            ($field:ident, $target:expr) => {
                if let Some(v) = self.$field.or(file.$field) {
                    $target = v;
                }
            };
        }
        pick!(data_dir, c.data_dir);
        pick!(listen, c.listen);
        pick!(admin, c.admin);
        pick!(key_wait_ms, c.key_wait_ms);
        pick!(heartbeat_ms, c.heartbeat_ms);
        pick!(buffered_ops_per_scope_max, c.buffered_ops_per_scope_max);
        pick!(buffered_bytes_per_scope_max, c.buffered_bytes_per_scope_max);
        pick!(buffered_ops_total_max, c.buffered_ops_total_max);
        pick!(buffered_bytes_total_max, c.buffered_bytes_total_max);
        pick!(verifier_threads, c.pipeline.verifier_threads);
        pick!(network_threads, c.network_threads);
        pick!(commit_ops_max, c.pipeline.commit_ops_max);
        pick!(connections_max, c.net.connections_max);
        pick!(streams_per_connection_max, c.net.streams_per_connection_max);
        // One origin may take a quarter of the slots unless told otherwise.
        c.net.connections_per_origin_max = (c.net.connections_max / 4).max(1);
        pick!(connections_per_origin_max, c.net.connections_per_origin_max);
        pick!(connection_rate_per_origin, c.net.connection_rate_per_origin);
        pick!(connection_burst_per_origin, c.net.connection_burst_per_origin);
        c.peers = if self.peers.is_empty() { file.peers } else { self.peers };
        match self.durability.or(file.durability).as_deref() {
            None | Some("durable") => c.pipeline.sync = true,
            Some("fast") => c.pipeline.sync = false,
            Some(other) => return Err(ResolveError::Durability(other.to_owned())),
        }
        if c.pipeline.verifier_threads == 0 || c.pipeline.commit_ops_max == 0 || c.heartbeat_ms == 0 {
            return Err(ResolveError::AtLeastOne);
        }
        if c.buffered_ops_per_scope_max < 1 || c.buffered_ops_total_max < c.buffered_ops_per_scope_max {
            return Err(ResolveError::BufferedOps);
        }
        c.net.validate()?;
        Ok(c)
    }
}
