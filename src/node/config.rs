//! The node's configuration: command-line flags, each also settable in a
//! TOML file (`--config`); a flag given on the command line wins over the
//! file, and the file over the default.
//!
//! Each setting is one field of [`Settings`]: its flag (`--key-wait-ms`), its
//! file key (`key_wait_ms`) and its help; its default is in
//! [`Settings::defaults`], taken from the constants it comes from (`limits`,
//! `PipelineConfig::default()`, `ServerConfig::default()`), and `--help`
//! shows that same value.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

use clap::{ArgMatches, Args, Command, FromArgMatches};
use serde::{Deserialize, Serialize};

use crate::limits;
use crate::net::{PeerAddr, ServerConfig};
use crate::protocol::PublicKey;
use crate::pipeline::PipelineConfig;

/// Where a node keeps its data unless told otherwise (also the default of
/// `identity`, `import` and `inspect`).
pub const DATA_DIR_DEFAULT: &str = "./dagfold-data";

/// The HTTP status and metrics address unless told otherwise: beside the
/// QUIC default (`ServerConfig::default().listen`, port 7400).
pub const ADMIN_DEFAULT: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7401));

/// The API token's file in the data directory unless told otherwise (where
/// the client looks for it).
pub const API_TOKEN_FILE_DEFAULT: &str = crate::client::API_TOKEN_FILE;

/// Interval of the heads heartbeat to peers unless told otherwise.
pub const HEARTBEAT_MS_DEFAULT: u64 = 1_000;

/// Network (tokio) threads unless told otherwise: a quarter of the cores,
/// at least one (the network side is light next to verification, which
/// gets every core: `PipelineConfig::default`).
pub fn network_threads_default() -> usize {
    (crate::pipeline::machine_cores() / 4).max(1)
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The file of the API's bearer token (`api::load_or_create_token`).
    pub api_token_file: PathBuf,
    pub peers: Vec<PeerAddr>,
    /// Geneses accepted from these authors besides the node itself.
    pub accept_scopes_from: Vec<PublicKey>,
    /// Every genesis accepted (relays, tests).
    pub accept_any_scope: bool,
    pub key_wait_ms: u64,
    pub heartbeat_ms: u64,
    pub buffered_ops_per_scope_max: u64,
    pub buffered_bytes_per_scope_max: u64,
    pub buffered_ops_total_max: u64,
    pub buffered_bytes_total_max: u64,
    pub network_threads: usize,
    /// `store::rocks::RocksStore::open_tuned`'s cap on each memtable.
    pub memtable_bytes_max: Option<usize>,
    pub pipeline: PipelineConfig,
    pub net: crate::net::ServerConfig,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Settings::defaults().into_config().expect("the default settings are valid")
    }
}

/// Every setting of `dagfold node`. Each field is a flag (`--data-dir`) and a
/// key of the `--config` file (`data_dir`); `None` (no peers) is "not given
/// here". The help of each ends with its default from [`Settings::defaults`].
#[derive(Args, Serialize, Deserialize, Clone, Debug)]
// A key missing from the file keeps its default.
#[serde(deny_unknown_fields, default = "Settings::defaults")]
pub struct Settings {
    /// Where the node keeps its RocksDB store, identity and TLS certificate
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// QUIC address for peers and clients
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// HTTP address of the application API (API.md), status and metrics
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The file holding the API's bearer token: 32 random bytes in hex,
    /// made (mode 0600) on the first start if missing, kept otherwise
    /// [default: <data-dir>/api-token]
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// A peer (repeatable): gossip, heartbeat and sync. `KEY@HOST:PORT`
    /// dials only a node that proves KEY (its public key, 64 hex) and serves
    /// that key every scope; `HOST:PORT` dials any key, which is then served
    /// only the scopes it is a member of (SPEC §10).
    #[arg(long = "peer")]
    pub peers: Vec<PeerAddr>,
    /// Accept the geneses (new scopes) this key authors (repeatable; 64
    /// hex). The node always accepts its own, and those of scopes it follows
    /// (API.md, "Which scopes a node holds").
    #[arg(long = "accept-scopes-from")]
    pub accept_scopes_from: Vec<String>,
    /// Accept every genesis, whoever authored it: for relays and tests
    /// (`--accept-any-scope` alone means true).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub accept_any_scope: Option<bool>,
    /// How long a data op waits in memory for its key before it is dropped
    /// for redelivery (SPEC §6 step 4)
    #[arg(long)]
    pub key_wait_ms: Option<u64>,
    /// Interval of the heads heartbeat to peers
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Buffered ops (pending + key waits) per scope before the oldest is
    /// evicted
    #[arg(long)]
    pub buffered_ops_per_scope_max: Option<u64>,
    /// Buffered bytes per scope
    #[arg(long)]
    pub buffered_bytes_per_scope_max: Option<u64>,
    /// Buffered ops over all scopes
    #[arg(long)]
    pub buffered_ops_total_max: Option<u64>,
    /// Buffered bytes over all scopes
    #[arg(long)]
    pub buffered_bytes_total_max: Option<u64>,
    /// Signature verification threads (by default one per core of this
    /// machine)
    #[arg(long)]
    pub verifier_threads: Option<usize>,
    /// Network (tokio) threads (by default a quarter of the cores, at least
    /// one)
    #[arg(long)]
    pub network_threads: Option<usize>,
    /// Projector threads: the fold, roots and cell writes split by scope
    /// (by default one per four cores, at least one; a scope is always
    /// folded by one of them)
    #[arg(long)]
    pub projector_shards: Option<usize>,
    /// Each projector shard in two threads, one after the other over each
    /// commit: the cells' fold, then the roots and convergence checks, so
    /// that one scope's fold takes two cores (by default from two cores;
    /// `false`: one thread a shard)
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub projector_split: Option<bool>,
    /// Applied ops folded into one commit at most (group commit); a commit
    /// also closes at 4x as many received ops when most park
    #[arg(long)]
    pub commit_ops_max: Option<usize>,
    /// `durable`: the WAL is synced before anything is emitted; `fast`: not
    /// synced (a process crash loses nothing, a power loss may lose the last
    /// commits).
    #[arg(long)]
    pub durability: Option<String>,
    /// Caps every table's memtable, in bytes (otherwise 32 MiB for ops and
    /// pending ops, 8 MiB for cells, 4 MiB for the rest): a smaller one
    /// flushes more often, for less memory or for the crash campaign's
    /// kills aimed at flushes [default: no cap]
    #[arg(long)]
    pub memtable_bytes_max: Option<usize>,
    /// QUIC connections open at once
    #[arg(long)]
    pub connections_max: Option<u32>,
    /// Concurrent streams per connection, each direction
    #[arg(long)]
    pub streams_per_connection_max: Option<u32>,
    /// QUIC connections open at once from one origin (an IPv4 address or
    /// an IPv6 /64) [default: a quarter of --connections-max]
    #[arg(long)]
    pub connections_per_origin_max: Option<u32>,
    /// New connections a second from one origin, on average; 0 for no limit
    #[arg(long)]
    pub connection_rate_per_origin: Option<u32>,
    /// Burst of new connections one origin may open above its rate
    #[arg(long)]
    pub connection_burst_per_origin: Option<u32>,
}

impl Settings {
    /// Every setting's default, from the constant it comes from; `--help`
    /// shows these values. `connections_per_origin_max` has none of its own:
    /// it is a quarter of `connections_max` (see `into_config`).
    pub fn defaults() -> Settings {
        let pipeline = PipelineConfig::default();
        let net = ServerConfig::default();
        Settings {
            data_dir: Some(PathBuf::from(DATA_DIR_DEFAULT)),
            listen: Some(net.listen),
            admin: Some(ADMIN_DEFAULT),
            // Beside the data directory, wherever that is (`into_config`).
            api_token_file: None,
            peers: Vec::new(),
            accept_scopes_from: Vec::new(),
            accept_any_scope: Some(false),
            key_wait_ms: Some(limits::DATA_KEY_WAIT_MS_DEFAULT),
            heartbeat_ms: Some(HEARTBEAT_MS_DEFAULT),
            buffered_ops_per_scope_max: Some(limits::BUFFERED_OPS_PER_SCOPE_MAX),
            buffered_bytes_per_scope_max: Some(limits::BUFFERED_BYTES_PER_SCOPE_MAX),
            buffered_ops_total_max: Some(limits::BUFFERED_OPS_TOTAL_MAX),
            buffered_bytes_total_max: Some(limits::BUFFERED_BYTES_TOTAL_MAX),
            verifier_threads: Some(pipeline.verifier_threads),
            network_threads: Some(network_threads_default()),
            projector_shards: Some(pipeline.projector_shards),
            projector_split: Some(pipeline.projector_split),
            commit_ops_max: Some(pipeline.commit_ops_max),
            durability: Some("durable".to_owned()),
            memtable_bytes_max: None,
            connections_max: Some(net.connections_max),
            streams_per_connection_max: Some(net.streams_per_connection_max),
            connections_per_origin_max: None,
            connection_rate_per_origin: Some(net.connection_rate_per_origin),
            connection_burst_per_origin: Some(net.connection_burst_per_origin),
        }
    }

    /// The settings of a TOML file, over the defaults.
    fn from_file(path: &Path) -> Result<Settings, ResolveError> {
        let text = std::fs::read_to_string(path).map_err(|source| ResolveError::Read { path: path.to_path_buf(), source })?;
        toml::from_str(&text).map_err(|source| ResolveError::Parse { path: path.to_path_buf(), source })
    }

    /// The node's configuration from settings that have the defaults under
    /// them, checked.
    fn into_config(self) -> Result<NodeConfig, ResolveError> {
        fn set<T>(value: Option<T>) -> T {
            value.expect("every setting but connections_per_origin_max and api_token_file has a default")
        }
        let sync = match self.durability.as_deref() {
            None | Some("durable") => true,
            Some("fast") => false,
            Some(other) => return Err(ResolveError::Durability(other.to_owned())),
        };
        let connections_max = set(self.connections_max);
        let data_dir = set(self.data_dir);
        let c = NodeConfig {
            api_token_file: self.api_token_file.unwrap_or_else(|| data_dir.join(API_TOKEN_FILE_DEFAULT)),
            data_dir,
            listen: set(self.listen),
            admin: set(self.admin),
            peers: self.peers,
            accept_scopes_from: self
                .accept_scopes_from
                .iter()
                .map(|k| crate::protocol::parse_hash_hex(k).ok_or_else(|| ResolveError::Key(k.clone())))
                .collect::<Result<_, _>>()?,
            accept_any_scope: set(self.accept_any_scope),
            key_wait_ms: set(self.key_wait_ms),
            heartbeat_ms: set(self.heartbeat_ms),
            buffered_ops_per_scope_max: set(self.buffered_ops_per_scope_max),
            buffered_bytes_per_scope_max: set(self.buffered_bytes_per_scope_max),
            buffered_ops_total_max: set(self.buffered_ops_total_max),
            buffered_bytes_total_max: set(self.buffered_bytes_total_max),
            network_threads: set(self.network_threads),
            memtable_bytes_max: self.memtable_bytes_max,
            pipeline: PipelineConfig {
                verifier_threads: set(self.verifier_threads),
                projector_shards: set(self.projector_shards),
                projector_split: set(self.projector_split),
                commit_ops_max: set(self.commit_ops_max),
                sync,
                ..PipelineConfig::default()
            },
            net: ServerConfig {
                connections_max,
                streams_per_connection_max: set(self.streams_per_connection_max),
                // One origin may take a quarter of the slots unless told otherwise.
                connections_per_origin_max: self.connections_per_origin_max.unwrap_or((connections_max / 4).max(1)),
                connection_rate_per_origin: set(self.connection_rate_per_origin),
                connection_burst_per_origin: set(self.connection_burst_per_origin),
                ..ServerConfig::default()
            },
        };
        if c.pipeline.verifier_threads == 0 || c.pipeline.projector_shards == 0 || c.pipeline.commit_ops_max == 0 || c.heartbeat_ms == 0 {
            return Err(ResolveError::AtLeastOne);
        }
        if c.pipeline.projector_shards > limits::PROJECTOR_SHARDS_MAX {
            return Err(ResolveError::ProjectorShards);
        }
        if c.buffered_ops_per_scope_max < 1 || c.buffered_ops_total_max < c.buffered_ops_per_scope_max {
            return Err(ResolveError::BufferedOps);
        }
        c.net.validate()?;
        Ok(c)
    }
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
    #[error("--accept-scopes-from takes a public key of 64 hex characters, got {0:?}")]
    Key(String),
    #[error("verifier_threads, projector_shards, commit_ops_max and heartbeat_ms must be at least 1")]
    AtLeastOne,
    #[error("projector_shards must be at most {}", limits::PROJECTOR_SHARDS_MAX)]
    ProjectorShards,
    #[error("buffered_ops_total_max must be at least buffered_ops_per_scope_max (and both ≥ 1)")]
    BufferedOps,
    #[error(transparent)]
    Net(#[from] crate::net::server::ConfigError),
}

/// `dagfold node`'s command line: `--config` and the [`Settings`]. It keeps
/// clap's matches, so that exactly the flags given there override the file.
#[derive(Clone, Debug)]
pub struct NodeArgs {
    config: Option<PathBuf>,
    matches: ArgMatches,
}

/// The flags as clap parses them.
#[derive(Args)]
struct Flags {
    /// A TOML file with any of the settings below (keys as the flags, with
    /// underscores: `data_dir`, `listen`, `peers = [..]`, ...).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

impl FromArgMatches for NodeArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let flags = Flags::from_arg_matches(matches)?;
        Ok(NodeArgs { config: flags.config, matches: matches.clone() })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = NodeArgs::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for NodeArgs {
    fn augment_args(cmd: Command) -> Command {
        show_defaults(Flags::augment_args(cmd))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        show_defaults(Flags::augment_args_for_update(cmd))
    }
}

/// Ends the help of each setting that has a default with `[default: X]`,
/// X from [`Settings::defaults`] (the values `resolve` uses).
fn show_defaults(mut cmd: Command) -> Command {
    let serde_json::Value::Object(defaults) = serde_json::to_value(Settings::defaults()).expect("settings serialize") else {
        unreachable!("a struct serializes to an object")
    };
    for (key, value) in defaults {
        let shown = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::Array(items) if items.is_empty() => continue,
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        };
        // The arg's id is the field's name, as is the file key.
        cmd = cmd.mut_arg(key, |arg| {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            arg.help(format!("{help} [default: {shown}]"))
        });
    }
    cmd
}

impl NodeArgs {
    /// The configuration: the flags given, over the `--config` file, over
    /// the defaults; then checked.
    pub fn resolve(self) -> Result<NodeConfig, ResolveError> {
        let mut settings = match &self.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::defaults(),
        };
        // clap's update sets exactly the fields whose flags were given.
        settings.update_from_arg_matches(&self.matches).expect("the matches come from these flags");
        settings.into_config()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    fn args(argv: &[&str]) -> NodeArgs {
        Cli::try_parse_from(std::iter::once("node").chain(argv.iter().copied())).unwrap().node
    }

    /// The help of `--{long}`, as `dagfold node --help` prints it.
    fn help_of(long: &str) -> String {
        let cmd = Cli::command();
        let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long)).unwrap_or_else(|| panic!("no --{long}"));
        arg.get_help().map(ToString::to_string).unwrap_or_default()
    }

    /// The thread counts follow the machine, not a constant (a 64-core
    /// server verifies on 64 threads), and its help says what they come to
    /// here.
    #[test]
    fn the_thread_defaults_follow_the_cores() {
        let cores = std::thread::available_parallelism().unwrap().get();
        let c = args(&[]).resolve().unwrap();
        assert_eq!(c.pipeline.verifier_threads, cores);
        assert_eq!(c.network_threads, (cores / 4).max(1));
        assert_eq!(c.pipeline.projector_shards, (cores / 4).max(1));
        assert_eq!(c.pipeline.projector_split, cores >= 2);
        assert!(help_of("projector-split").ends_with(&format!("[default: {}]", cores >= 2)));
        assert!(help_of("verifier-threads").ends_with(&format!("[default: {cores}]")));
        assert!(help_of("projector-shards").ends_with(&format!("[default: {}]", (cores / 4).max(1))));
    }

    #[test]
    fn the_defaults_used_and_shown_are_the_constants() {
        let c = args(&[]).resolve().unwrap();
        let (pipeline, net) = (PipelineConfig::default(), ServerConfig::default());
        let used_and_constant: [(&str, u64, u64); 13] = [
            ("key-wait-ms", c.key_wait_ms, limits::DATA_KEY_WAIT_MS_DEFAULT),
            ("heartbeat-ms", c.heartbeat_ms, HEARTBEAT_MS_DEFAULT),
            ("buffered-ops-per-scope-max", c.buffered_ops_per_scope_max, limits::BUFFERED_OPS_PER_SCOPE_MAX),
            ("buffered-bytes-per-scope-max", c.buffered_bytes_per_scope_max, limits::BUFFERED_BYTES_PER_SCOPE_MAX),
            ("buffered-ops-total-max", c.buffered_ops_total_max, limits::BUFFERED_OPS_TOTAL_MAX),
            ("buffered-bytes-total-max", c.buffered_bytes_total_max, limits::BUFFERED_BYTES_TOTAL_MAX),
            ("verifier-threads", c.pipeline.verifier_threads as u64, pipeline.verifier_threads as u64),
            ("network-threads", c.network_threads as u64, network_threads_default() as u64),
            ("projector-shards", c.pipeline.projector_shards as u64, pipeline.projector_shards as u64),
            ("commit-ops-max", c.pipeline.commit_ops_max as u64, pipeline.commit_ops_max as u64),
            ("connections-max", c.net.connections_max.into(), net.connections_max.into()),
            ("streams-per-connection-max", c.net.streams_per_connection_max.into(), net.streams_per_connection_max.into()),
            ("connection-rate-per-origin", c.net.connection_rate_per_origin.into(), net.connection_rate_per_origin.into()),
        ];
        for (flag, used, constant) in used_and_constant {
            assert_eq!(used, constant, "--{flag}: the default used");
            let help = help_of(flag);
            assert!(help.ends_with(&format!("[default: {constant}]")), "--{flag}: the default shown: {help:?}");
        }
        assert_eq!(c.net.connection_burst_per_origin, net.connection_burst_per_origin);
        assert!(help_of("connection-burst-per-origin").ends_with(&format!("[default: {}]", net.connection_burst_per_origin)));
        assert_eq!(c.net.connections_per_origin_max, net.connections_max / 4);
        assert!(help_of("connections-per-origin-max").ends_with("[default: a quarter of --connections-max]"));
        assert_eq!((c.data_dir.to_str(), c.listen, c.admin), (Some(DATA_DIR_DEFAULT), net.listen, ADMIN_DEFAULT));
        assert!(help_of("data-dir").ends_with(&format!("[default: {DATA_DIR_DEFAULT}]")));
        assert!(help_of("listen").ends_with(&format!("[default: {}]", net.listen)));
        assert!(help_of("admin").ends_with(&format!("[default: {ADMIN_DEFAULT}]")));
        assert!(c.pipeline.sync);
        assert!(help_of("durability").ends_with("[default: durable]"));
        assert!(c.peers.is_empty());
        assert!(!help_of("peer").contains("[default"));
        assert!(!help_of("config").contains("[default"));
        // Nothing else of the pipeline or the transport moves.
        let (p, n) = (&c.pipeline, &c.net);
        assert_eq!((p.verify_batch_max, p.stage_queue_batches, p.tick_ms), (pipeline.verify_batch_max, pipeline.stage_queue_batches, pipeline.tick_ms));
        assert_eq!((n.frames_buffered_bytes_max, n.idle_timeout_ms, n.listen), (net.frames_buffered_bytes_max, net.idle_timeout_ms, net.listen));
    }

    #[test]
    fn the_api_token_file_is_in_the_data_directory_unless_named() {
        let c = args(&["--data-dir", "/x/d"]).resolve().unwrap();
        assert_eq!(c.api_token_file, PathBuf::from("/x/d").join(API_TOKEN_FILE_DEFAULT));
        let c = args(&["--data-dir", "/x/d", "--api-token-file", "/y/t"]).resolve().unwrap();
        assert_eq!(c.api_token_file, PathBuf::from("/y/t"));
        assert!(help_of("api-token-file").ends_with("[default: <data-dir>/api-token]"));
    }

    #[test]
    fn a_flag_overrides_the_file_and_the_file_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "key_wait_ms = 5\nheartbeat_ms = 7\npeers = [\"127.0.0.1:9001\"]\nconnections_max = 40\ndurability = \"fast\"\n")
            .unwrap();
        let path = path.to_str().unwrap();
        let c = args(&["--config", path, "--key-wait-ms", "9", "--peer", "127.0.0.1:9002"]).resolve().unwrap();
        assert_eq!(c.key_wait_ms, 9, "the flag over the file");
        assert_eq!(c.peers, [PeerAddr { key: None, addr: SocketAddr::from(([127, 0, 0, 1], 9002)) }], "the flag's peers instead of the file's");
        assert_eq!(c.heartbeat_ms, 7, "the file over the default");
        assert!(!c.pipeline.sync, "the file over the default");
        assert_eq!(c.net.connections_per_origin_max, 10, "a quarter of the file's connections_max");
        assert_eq!(c.buffered_ops_total_max, limits::BUFFERED_OPS_TOTAL_MAX, "the default");
        let c = args(&["--config", path]).resolve().unwrap();
        assert_eq!((c.key_wait_ms, c.peers), (5, vec![PeerAddr { key: None, addr: SocketAddr::from(([127, 0, 0, 1], 9001)) }]), "the file alone");
        let c = args(&["--config", path, "--durability", "durable", "--connections-per-origin-max", "3"]).resolve().unwrap();
        assert!(c.pipeline.sync);
        assert_eq!(c.net.connections_per_origin_max, 3);
    }

    #[test]
    fn errors_name_the_setting() {
        let err = |argv: &[&str]| args(argv).resolve().unwrap_err().to_string();
        assert_eq!(err(&["--durability", "slow"]), "--durability takes `durable` or `fast`, not \"slow\"");
        assert_eq!(err(&["--heartbeat-ms", "0"]), "verifier_threads, projector_shards, commit_ops_max and heartbeat_ms must be at least 1");
        assert_eq!(err(&["--projector-shards", "0"]), "verifier_threads, projector_shards, commit_ops_max and heartbeat_ms must be at least 1");
        assert_eq!(err(&["--projector-shards", "257"]), "projector_shards must be at most 256");
        assert_eq!(
            err(&["--buffered-ops-per-scope-max", "2", "--buffered-ops-total-max", "1"]),
            "buffered_ops_total_max must be at least buffered_ops_per_scope_max (and both ≥ 1)"
        );
        assert_eq!(err(&["--connections-max", "0"]), "net config: connections_max must be at least 1");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        assert!(err(&["--config", missing.to_str().unwrap()]).starts_with(&format!("cannot read {}: ", missing.display())));
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "config = \"x\"\n").unwrap();
        let e = err(&["--config", path.to_str().unwrap()]);
        assert!(e.starts_with(&format!("{}: ", path.display())) && e.contains("unknown field `config`"), "{e}");
    }
}
