//! `dagfold-campaign`: the reliability campaigns of docs/RELIABILITY.md.
//!
//! - `crash`: a node under load, a subscriber, API writes and a peer;
//!   SIGKILLs and power cuts (its data directory on a FUSE filesystem that
//!   drops unsynced writes, `powercut.rs`) at seeded random moments,
//!   restart, resend, sync; after each, what the node acknowledged is
//!   checked in its store, and at the end the store and the events against
//!   the load generator.
//! - `flood`: orphans, garbage frames, connection churn, subscribers that
//!   never read, a sync request loop, forged heartbeats (while a real peer
//!   converges); each while valid traffic is measured
//!   against a clean run, with memory and the node's drop counters.
//! - `disk`: a full disk (a size-limited tmpfs) or a write error
//!   (RLIMIT_FSIZE); the node must refuse, say so, keep answering, and
//!   after space returns and a restart catch up from its peer.
//! - `partition`: five nodes whose links go through UDP relays of the
//!   campaign, cut and healed (asymmetric cuts too) under a seeded schedule
//!   while 1,000 scopes of ops arrive spread over the nodes; after the last
//!   heal every node must hold every scope at the same root and heads.
//! - `sim`: the seeded multi-node simulation (`dagfold::sim`) over many
//!   seeds, in this process (no binaries, no network).
//!
//! Each prints one JSON report on stdout (progress on stderr) and exits 0
//! only if every check passed. The node and the load generator are the
//! release binaries beside this one (`target/release/`), or `--dagfold-bin`
//! / `--loadgen-bin`. Everything runs on loopback.

mod acked;
mod check;
mod crash;
mod disk;
mod flood;
mod partition;
mod powercut;
mod proc;
mod sim;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "dagfold-campaign", about = "Crash, flood, disk-fault and partition campaigns against dagfold nodes (docs/RELIABILITY.md)")]
struct Cli {
    /// The `dagfold` binary [default: beside this one].
    #[arg(long, global = true)]
    dagfold_bin: Option<PathBuf>,
    /// The `dagfold-loadgen` binary [default: beside this one].
    #[arg(long, global = true)]
    loadgen_bin: Option<PathBuf>,
    /// The `dagfold-powercut` binary (tools/powercut; the crash campaign's
    /// power cuts) [default: beside this one].
    #[arg(long, global = true)]
    powercut_bin: Option<PathBuf>,
    /// Where the nodes keep their data and logs [default: a fresh temporary
    /// directory, removed on success unless --keep].
    #[arg(long, global = true)]
    work_dir: Option<PathBuf>,
    /// Keep the work directory even on success.
    #[arg(long, global = true)]
    keep: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// SIGKILL a node under load at seeded random moments (see crash.rs).
    Crash(crash::CrashArgs),
    /// Floods over QUIC while valid traffic is measured (see flood.rs).
    Flood(flood::FloodArgs),
    /// A full disk or a write error (see disk.rs).
    Disk(disk::DiskArgs),
    /// Links between five nodes cut and healed through UDP relays (see
    /// partition.rs).
    Partition(partition::PartitionArgs),
    /// The seeded multi-node simulation over many seeds (see sim.rs).
    Sim(sim::SimArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Sim(a) = &cli.command {
        let report = sim::run(a);
        println!("{}", serde_json::to_string(&report).unwrap());
        if report["ok"] == true {
            return ExitCode::SUCCESS;
        }
        eprintln!("dagfold-campaign: FAILED: {} seeds", report["failures"]);
        return ExitCode::FAILURE;
    }
    let here = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default();
    let bins = proc::Bins {
        dagfold: cli.dagfold_bin.unwrap_or_else(|| here.join("dagfold")),
        loadgen: cli.loadgen_bin.unwrap_or_else(|| here.join("dagfold-loadgen")),
        powercut: cli.powercut_bin.unwrap_or_else(|| here.join("dagfold-powercut")),
    };
    for b in [&bins.dagfold, &bins.loadgen] {
        if !b.exists() {
            eprintln!("dagfold-campaign: {} not found (cargo build --release --bins --features testkit)", b.display());
            return ExitCode::from(2);
        }
    }
    let (work, temp) = match cli.work_dir {
        Some(d) => {
            if let Err(e) = std::fs::create_dir_all(&d) {
                eprintln!("dagfold-campaign: {}: {e}", d.display());
                return ExitCode::from(2);
            }
            (d, None)
        }
        None => {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
            let d = std::env::temp_dir().join(format!("dagfold-campaign-{}-{nanos}", std::process::id()));
            if let Err(e) = std::fs::create_dir_all(&d) {
                eprintln!("dagfold-campaign: {}: {e}", d.display());
                return ExitCode::from(2);
            }
            (d.clone(), Some(d))
        }
    };
    let result = match &cli.command {
        Cmd::Crash(a) => crash::run(a, &bins, &work),
        Cmd::Flood(a) => flood::run(a, &bins, &work),
        Cmd::Disk(a) => disk::run(a, &bins, &work),
        Cmd::Partition(a) => partition::run(a, &bins, &work),
        Cmd::Sim(_) => unreachable!("run above"),
    };
    let code = match result {
        Ok(report) => {
            println!("{}", serde_json::to_string(&report).unwrap());
            if report["ok"] == true {
                ExitCode::SUCCESS
            } else {
                eprintln!("dagfold-campaign: FAILED: {}", serde_json::to_string_pretty(&report["problems"]).unwrap());
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("dagfold-campaign: {e}");
            ExitCode::FAILURE
        }
    };
    if let Some(t) = temp {
        if cli.keep || code != ExitCode::SUCCESS {
            eprintln!("dagfold-campaign: work directory kept at {}", t.display());
        } else {
            let _ = std::fs::remove_dir_all(&t);
        }
    }
    code
}
