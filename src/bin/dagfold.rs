//! The `dagfold` command.

// mimalloc: the pipeline allocates a frame on the network thread and frees it
// on the orderer; glibc's malloc spent ~20% of the orderer in `_int_malloc`,
// `unlink_chunk` and `_int_free` (shuffled workload, perf). A/B in
// docs/ARCHITECTURE.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dagfold::core::Config;
use dagfold::node::config::DATA_DIR_DEFAULT;

#[derive(Parser)]
#[command(
    name = "dagfold",
    version,
    about = "A server node for replicated, end-to-end encrypted group state (see SPEC.md).",
    after_help = "The commands marked (API client) call a running node's API (API.md): its address and token from \
                  --data-dir (<DATA_DIR>/api-address, <DATA_DIR>/api-token), or --api and --token-file. Each prints the \
                  answer as one JSON line, or the API's error on standard error with a non-zero exit."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the node identity as JSON, creating it on first use.
    Identity {
        /// The node's data directory (RocksDB).
        #[arg(long, default_value = DATA_DIR_DEFAULT)]
        data_dir: PathBuf,
    },
    /// Apply frames (u32 LE length, then borsh(Message)) from FILE, or "-"
    /// for stdin, through the engine; print a JSON summary of the verdicts.
    Import {
        /// The node's data directory (RocksDB), not in use by a node.
        #[arg(long, default_value = DATA_DIR_DEFAULT)]
        data_dir: PathBuf,
        /// The frames file, or "-" for standard input.
        file: String,
        /// Frames per atomic commit (and per signature batch).
        #[arg(long, default_value_t = dagfold::cli::IMPORT_BATCH_FRAMES)]
        batch_frames: usize,
        /// Accept only the geneses of the node itself and of these authors
        /// (repeatable; 64 hex), as `dagfold node` does. Without it, and
        /// without --accept-any-scope, every genesis in the file is accepted
        /// (the operator chose the file).
        #[arg(long = "accept-scopes-from")]
        accept_scopes_from: Vec<String>,
        /// Accept every genesis (the default when no --accept-scopes-from).
        #[arg(long)]
        accept_any_scope: bool,
    },
    /// Run a node: QUIC on --listen, HTTP status and metrics on --admin,
    /// state in --data-dir. Stops cleanly on SIGINT/SIGTERM.
    Node(dagfold::node::config::NodeArgs),
    /// Print the events of a scope as JSON lines, from sequence number
    /// --from (1 is the first); resumes by itself after a disconnect, a
    /// node restart or a lag notice, without loss or repetition.
    Subscribe {
        /// The node's QUIC address, `HOST:PORT`, or `KEY@HOST:PORT` to abort
        /// unless the node proves KEY (its public key, 64 hex).
        #[arg(long, default_value_t = dagfold::net::PeerAddr { key: None, addr: dagfold::net::ServerConfig::default().listen })]
        node: dagfold::net::PeerAddr,
        /// A key file (64 hex: an Ed25519 seed; made, owner-only, if it does
        /// not exist) whose identity is presented: the node serves a scope's
        /// events only to a member's key (SPEC §10).
        #[arg(long)]
        identity: Option<PathBuf>,
        /// The scope id, 64 hex characters.
        #[arg(long)]
        scope: String,
        /// The first event's sequence number (1: the whole history).
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Exit after this many events.
        #[arg(long)]
        max_events: Option<u64>,
        /// Exit when no event arrived for this long (ms).
        #[arg(long)]
        idle_exit_ms: Option<u64>,
    },
    /// Print the status object of one scope (SPEC §11), or of every scope
    /// with an applied genesis as a JSON array.
    Inspect {
        /// The node's data directory (RocksDB), not in use by a node.
        #[arg(long, default_value = DATA_DIR_DEFAULT)]
        data_dir: PathBuf,
        /// The scope id, 64 hex characters.
        #[arg(long)]
        scope: Option<String>,
    },
    /// Write one scope's applied ops, in an order that applies in one pass,
    /// and the key deliveries this node made for it, as frames (u32 LE
    /// length, then borsh(Message)): what `dagfold import` reads. Offline,
    /// like `inspect`: not while a node runs on the data directory. The
    /// summary (JSON) goes to standard output with --out, else to standard
    /// error.
    Export {
        /// The node's data directory (RocksDB), not in use by a node.
        #[arg(long, default_value = DATA_DIR_DEFAULT)]
        data_dir: PathBuf,
        /// The scope id, 64 hex characters.
        #[arg(long)]
        scope: String,
        /// The file to write (made owner-only); standard output without it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    #[command(flatten)]
    Client(dagfold::client_commands::ClientCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<serde_json::Value> = match cli.command {
        Command::Identity { data_dir } => dagfold::cli::open(&data_dir, Config::default())
            .map(|n| dagfold::cli::identity_json(&n.engine))
            .map_err(Into::into),
        Command::Import { data_dir, file, batch_frames, accept_scopes_from, accept_any_scope } => {
            let mut authors = Vec::new();
            for k in &accept_scopes_from {
                match dagfold::protocol::parse_hash_hex(k) {
                    Some(key) => authors.push(key),
                    None => {
                        eprintln!("dagfold: --accept-scopes-from takes a public key of 64 hex characters, got {k:?}");
                        return ExitCode::from(2);
                    }
                }
            }
            let genesis_policy = if accept_any_scope || authors.is_empty() {
                dagfold::core::GenesisPolicy::AcceptAll
            } else {
                dagfold::core::GenesisPolicy::Authors(authors)
            };
            let cfg = Config { genesis_policy, ..Config::default() };
            dagfold::cli::import(&data_dir, &file, batch_frames.max(1), cfg).map_err(Into::into)
        }
        Command::Node(args) => {
            let cfg = match args.resolve() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("dagfold: {e}");
                    return ExitCode::from(2);
                }
            };
            return match dagfold::node::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dagfold: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Subscribe { node, identity, scope, from, max_events, idle_exit_ms } => {
            return match dagfold::node::subscribe::run(node, identity.as_deref(), &scope, from, max_events, idle_exit_ms) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dagfold: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Inspect { data_dir, scope } => {
            dagfold::cli::inspect(&data_dir, scope.as_deref(), Config::default()).map_err(Into::into)
        }
        Command::Client(cmd) => {
            return match dagfold::client_commands::run(cmd) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dagfold: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Export { data_dir, scope, out } => {
            match dagfold::export::export(&data_dir, &scope, out.as_deref(), Config::default()) {
                // The frames took standard output.
                Ok(summary) if out.is_none() => {
                    eprintln!("{summary}");
                    return ExitCode::SUCCESS;
                }
                r => r.map_err(Into::into),
            }
        }
    };
    match result {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dagfold: {e}");
            ExitCode::FAILURE
        }
    }
}
