//! `dagfold-compare`: one signed-op workload through p2panda's ingest path
//! and through dagfold (`dagfold import`, and a `dagfold node` fed over
//! QUIC), interleaved in one sitting; prints one table. What each side does
//! per op is in README.md beside this file.
//!
//!     cargo run --release -- [--sizes 5000,20000,100000] [--reps 3]
//!         [--bin-dir ../../target/release] [--published-max 5000]
//!         [--published-once-max 5000] [--no-node]

mod p2p;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{anyhow, Context};
use dagfold::core::{decode_frame, Decoded};
use dagfold::protocol::{sig, PLANE_DATA};
use dagfold::workload::{generate, WorkloadConfig};

/// Frames per signature batch on dagfold's side: what `dagfold import`
/// verifies at once (`dagfold::cli::IMPORT_BATCH_FRAMES`).
const DAGFOLD_BATCH: usize = 256;

struct Args {
    sizes: Vec<usize>,
    reps: usize,
    bin_dir: PathBuf,
    work: PathBuf,
    /// Largest size run with p2panda's store as published (SQLite as
    /// opened) in every rep; up to `published_once_max` it runs once, above
    /// not at all: an fsync per commit, and a scan of every stored op per
    /// op (`p2p::INDEXES`), ~7 ms per op at 5k ops and growing.
    published_max: usize,
    published_once_max: usize,
    node: bool,
    writers: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut a = Args {
        sizes: vec![5_000, 20_000, 100_000],
        reps: 3,
        bin_dir: here.join("../../target/release"),
        work: std::env::temp_dir().join(format!("dagfold-compare-{}", std::process::id())),
        published_max: 5_000,
        published_once_max: 5_000,
        node: true,
        writers: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow!("{flag} takes a value"));
        match flag.as_str() {
            "--sizes" => a.sizes = value()?.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?,
            "--reps" => a.reps = value()?.parse()?,
            "--bin-dir" => a.bin_dir = value()?.into(),
            "--work" => a.work = value()?.into(),
            "--published-max" => a.published_max = value()?.parse()?,
            "--published-once-max" => a.published_once_max = value()?.parse()?,
            "--writers" => a.writers = value()?.parse()?,
            "--no-node" => a.node = false,
            other => return Err(anyhow!("unknown argument {other:?} (see the top of src/main.rs)")),
        }
    }
    Ok(a)
}

/// One size's workload in both formats.
struct Workload {
    ops: usize,
    /// dagfold: the data ops' frames in causal order (the files hold the
    /// genesis, membership and key delivery before them).
    data: Vec<Vec<u8>>,
    scope: [u8; 32],
    root: [u8; 32],
    /// p2panda: the same ops, in the same causal order.
    p2p: Vec<p2p::WireOp>,
    /// Out of order: every author's log whole, the last author's first
    /// (indices into the causal order).
    out_of_order: Vec<usize>,
    /// Files for `dagfold import` and `dagfold-loadgen send`.
    causal_file: PathBuf,
    out_of_order_file: PathBuf,
}

fn write_frames(path: &Path, frames: impl Iterator<Item = impl AsRef<[u8]>>) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for fr in frames {
        let fr = fr.as_ref();
        f.write_all(&(fr.len() as u32).to_le_bytes())?;
        f.write_all(fr)?;
    }
    f.flush()?;
    Ok(())
}

fn build_workload(ops: usize, writers: usize, node_public: [u8; 32], node_kem: [u8; 32], dir: &Path) -> anyhow::Result<Workload> {
    // The tools/bench workload: 4 writers merging another's view before
    // 20% of their ops, 2 actions per op (16-byte values), one event.
    let cfg = WorkloadConfig { seed: 1, writers, data_ops: ops, keys_per_entity: 10_000, ..Default::default() };
    let w = generate(&cfg, node_public, node_kem);
    let prefix: Vec<Vec<u8>> = w.messages.iter().filter(|m| !m.is_data).map(|m| m.frame.clone()).collect();
    let data: Vec<Vec<u8>> = w.messages.iter().filter(|m| m.is_data).map(|m| m.frame.clone()).collect();
    // The same ops for p2panda: the same authors (their Ed25519 seeds),
    // each author's ops one log (seq_num, backlink), the parents as
    // dependencies, the encrypted payload as the body.
    let keys: Vec<p2panda_core::SigningKey> = w.writers.iter().map(|m| p2panda_core::SigningKey::from_bytes(&m.seed)).collect();
    let author_of: HashMap<[u8; 32], usize> = w.writers.iter().enumerate().map(|(i, m)| (m.public_key, i)).collect();
    let mut index: HashMap<[u8; 32], usize> = HashMap::new();
    let mut ids: Vec<p2panda_core::Hash> = Vec::with_capacity(ops);
    let mut last: Vec<Option<(u32, p2panda_core::Hash)>> = vec![None; writers];
    let mut p2p = Vec::with_capacity(ops);
    for (i, frame) in data.iter().enumerate() {
        let Ok(Decoded::Op { id, op, .. }) = decode_frame(frame) else { return Err(anyhow!("data frame {i} does not decode")) };
        assert_eq!(op.plane, PLANE_DATA);
        let author = author_of[&op.author];
        let deps: Vec<usize> = op.parents.iter().map(|p| index[p]).collect();
        let (seq_num, backlink) = match last[author] {
            Some((s, h)) => (s + 1, Some(h)),
            None => (0, None),
        };
        let (hash, header) = p2p::sign(&keys[author], seq_num, backlink, &op.payload, deps.iter().map(|&d| ids[d]).collect());
        last[author] = Some((seq_num, hash));
        index.insert(id, i);
        ids.push(hash);
        p2p.push(p2p::WireOp { header, body: op.payload.clone(), deps, author });
    }
    let mut out_of_order: Vec<usize> = Vec::with_capacity(ops);
    for a in (0..writers).rev() {
        out_of_order.extend((0..ops).filter(|&i| p2p[i].author == a));
    }
    let causal_file = dir.join(format!("causal-{ops}.frames"));
    let out_of_order_file = dir.join(format!("out-of-order-{ops}.frames"));
    write_frames(&causal_file, prefix.iter().chain(&data))?;
    write_frames(&out_of_order_file, prefix.iter().chain(out_of_order.iter().map(|&i| &data[i])))?;
    Ok(Workload { ops, data, scope: w.scope, root: w.final_root, p2p, out_of_order, causal_file, out_of_order_file })
}

/// dagfold's validation: what `dagfold import` does to a batch of frames
/// before the engine sees it (`InlineDriver::handle_frames`): decode each
/// frame (its SHA-256 id on the way) and verify the batch's signatures in
/// one batch verification.
fn dagfold_validate(data: &[Vec<u8>]) -> anyhow::Result<f64> {
    let t = Instant::now();
    for chunk in data.chunks(DAGFOLD_BATCH) {
        let decoded: Vec<Decoded> = chunk.iter().map(|f| decode_frame(f)).collect::<Result<_, _>>().map_err(|e| anyhow!("{e:?}"))?;
        let items: Vec<([u8; 32], [u8; 32], [u8; 64])> = decoded
            .iter()
            .map(|d| match d {
                Decoded::Op { id, op, .. } => (op.author, *id, op.signature),
                Decoded::Key(_) => unreachable!("data frames only"),
            })
            .collect();
        if !sig::verify_batch(&items).into_iter().all(|v| v) {
            return Err(anyhow!("a signature did not verify"));
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

fn p2panda_validate(ops: &[p2p::WireOp]) -> anyhow::Result<f64> {
    let t = Instant::now();
    for w in ops {
        std::hint::black_box(p2p::decode_and_validate(w)?);
    }
    Ok(t.elapsed().as_secs_f64())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    if !st.success() {
        return Err(anyhow!("cp -a {} {} failed", from.display(), to.display()));
    }
    Ok(())
}

/// `dagfold import` of `file` into a fresh copy of the template data
/// directory: the command's wall time and its summary.
fn dagfold_import(bin: &Path, template: &Path, dir: &Path, file: &Path) -> anyhow::Result<(f64, serde_json::Value)> {
    copy_dir(template, dir)?;
    let t = Instant::now();
    let out = Command::new(bin.join("dagfold"))
        .args(["import", "--data-dir"])
        .arg(dir)
        .arg(file)
        .stderr(Stdio::inherit())
        .output()?;
    let seconds = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(anyhow!("dagfold import failed: {}", String::from_utf8_lossy(&out.stdout)));
    }
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).context("dagfold import's summary")?;
    std::fs::remove_dir_all(dir)?;
    Ok((seconds, summary))
}

fn free_port() -> anyhow::Result<u16> {
    loop {
        let u = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let port = u.local_addr()?.port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
}

/// A `dagfold node` on a fresh copy of the template (started, not timed),
/// fed `file` by `dagfold-loadgen send` over QUIC on one stream; the
/// seconds `send` reports, from its first frame until the node's status
/// shows every op applied and the expected root (read every 20 ms).
fn dagfold_node(bin: &Path, template: &Path, dir: &Path, file: &Path, w: &Workload) -> anyhow::Result<f64> {
    copy_dir(template, dir)?;
    let (listen, admin) = (format!("127.0.0.1:{}", free_port()?), format!("127.0.0.1:{}", free_port()?));
    let mut node = Command::new(bin.join("dagfold"))
        .args(["node", "--data-dir"])
        .arg(dir)
        .args(["--listen", &listen, "--admin", &admin, "--accept-any-scope"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    // The node's stdout stays open until it stops (it may write more).
    let mut stdout = std::io::BufReader::new(node.stdout.take().expect("piped"));
    let sent = (|| -> anyhow::Result<std::process::Output> {
        let mut hello = String::new();
        stdout.read_line(&mut hello)?;
        let hello: serde_json::Value = serde_json::from_str(&hello).context("the node's first line")?;
        Ok(Command::new(bin.join("dagfold-loadgen"))
            .args(["send", "--node", &listen, "--admin", &admin, "--file"])
            .arg(file)
            .args(["--scope", &hex::encode(w.scope), "--root", &hex::encode(w.root)])
            .args(["--node-key", hello["public_key"].as_str().unwrap_or_default(), "--timeout-s", "600"])
            .stderr(Stdio::inherit())
            .output()?)
    })();
    // Stopped whatever happened: SIGTERM, as an operator would.
    let _ = Command::new("kill").args(["-TERM", &node.id().to_string()]).status();
    node.wait()?;
    drop(stdout);
    std::fs::remove_dir_all(dir)?;
    let sent = sent?;
    if !sent.status.success() {
        return Err(anyhow!("dagfold-loadgen send failed: {}", String::from_utf8_lossy(&sent.stdout)));
    }
    let report: serde_json::Value = serde_json::from_slice(&sent.stdout)?;
    if report["root_ok"] != serde_json::json!(true) {
        return Err(anyhow!("the node did not reach the root: {report}"));
    }
    report["seconds"].as_f64().ok_or_else(|| anyhow!("no seconds in {report}"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Medians by (size, path, side).
#[derive(Default)]
struct Results {
    reps: usize,
    samples: HashMap<(usize, &'static str, &'static str), Vec<f64>>,
}

impl Results {
    fn add(&mut self, size: usize, path: &'static str, side: &'static str, seconds: f64) {
        eprintln!("compare: {size} ops, {path}, {side}: {:.0} ops/s", size as f64 / seconds);
        self.samples.entry((size, path, side)).or_default().push(seconds);
    }

    fn cell(&self, size: usize, path: &'static str, side: &'static str) -> String {
        match self.samples.get(&(size, path, side)) {
            Some(v) => {
                let s = median(&mut v.clone());
                let once = if v.len() == 1 && self.reps > 1 { ", 1 run" } else { "" };
                format!("{} ({:.1} µs{once})", thousands(size as f64 / s), s * 1e6 / size as f64)
            }
            None => "—".into(),
        }
    }
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const VALIDATION: &str = "validation";
const CAUSAL: &str = "durable ingest, causal order";
const OUT_OF_ORDER: &str = "out of order, logs last author first";
const P2P_FULL: &str = "p2panda as published (SQLite as opened)";
const P2P_WAL: &str = "p2panda, SQLite WAL+NORMAL, + 2 indexes";
const P2P: &str = "p2panda";
const DF_IMPORT: &str = "dagfold import";
const DF_NODE: &str = "dagfold node (QUIC)";
const DF: &str = "dagfold";

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let bin = a.bin_dir.canonicalize().with_context(|| format!("--bin-dir {}", a.bin_dir.display()))?;
    for b in ["dagfold", "dagfold-loadgen"] {
        if !bin.join(b).exists() {
            return Err(anyhow!("no {b} in {} (build: cargo build --release --bins --features testkit)", bin.display()));
        }
    }
    std::fs::create_dir_all(&a.work)?;
    let work = a.work.canonicalize()?;
    // One node identity for every run: a data directory holding only it,
    // copied afresh for each import and each node.
    let template = work.join("template");
    let out = Command::new(bin.join("dagfold")).args(["identity", "--data-dir"]).arg(&template).output()?;
    let id: serde_json::Value = serde_json::from_slice(&out.stdout).context("dagfold identity")?;
    let h = |k: &str| -> anyhow::Result<[u8; 32]> {
        let v = hex::decode(id[k].as_str().ok_or_else(|| anyhow!("no {k}"))?)?;
        v.try_into().map_err(|_| anyhow!("{k} is not 32 bytes"))
    };
    let (node_public, node_kem) = (h("public_key")?, h("kem_public_key")?);

    // The fixed cost of a `dagfold import` (process start, RocksDB open and
    // close): an empty file's import, subtracted from every import.
    let empty = work.join("empty.frames");
    std::fs::write(&empty, b"")?;
    let mut startup: Vec<f64> = (0..5).map(|i| dagfold_import(&bin, &template, &work.join(format!("empty-{i}")), &empty).map(|r| r.0)).collect::<Result<_, _>>()?;
    let startup = median(&mut startup);
    eprintln!("compare: dagfold import of an empty file: {:.1} ms (subtracted from each import)", startup * 1e3);

    let mut results = Results { reps: a.reps, ..Default::default() };
    let mut pragmas: HashMap<p2p::Sqlite, String> = HashMap::new();
    let mut sizes_bytes: Vec<(usize, f64, f64)> = Vec::new();
    let mut run = 0usize;
    for &size in &a.sizes {
        eprintln!("compare: generating {size} ops (signing and encrypting, not timed)");
        let w = build_workload(size, a.writers, node_public, node_kem, &work)?;
        let causal: Vec<usize> = (0..size).collect();
        let causal_released = p2p::releases(&w.p2p, &causal);
        let ooo_released = p2p::releases(&w.p2p, &w.out_of_order);
        let p2p_bytes = w.p2p.iter().map(|o| o.header.len() + o.body.len()).sum::<usize>() as f64 / size as f64;
        let df_bytes = w.data.iter().map(|f| f.len()).sum::<usize>() as f64 / size as f64;
        sizes_bytes.push((size, p2p_bytes, df_bytes));
        for rep in 0..a.reps {
            // Alternate which side goes first, rep by rep.
            let p2p_first = rep % 2 == 0;
            let validate = |results: &mut Results, p2p_side: bool| -> anyhow::Result<()> {
                if p2p_side {
                    results.add(size, VALIDATION, P2P, p2panda_validate(&w.p2p)?);
                } else {
                    results.add(size, VALIDATION, DF, dagfold_validate(&w.data)?);
                }
                Ok(())
            };
            validate(&mut results, p2p_first)?;
            validate(&mut results, !p2p_first)?;
            for (path, order, released, file) in [
                (CAUSAL, &causal, &causal_released, &w.causal_file),
                (OUT_OF_ORDER, &w.out_of_order, &ooo_released, &w.out_of_order_file),
            ] {
                let mut p2panda = |results: &mut Results, run: &mut usize| -> anyhow::Result<()> {
                    let published = size <= a.published_max || (size <= a.published_once_max && rep == 0);
                    let modes: &[p2p::Sqlite] = if published {
                        &[p2p::Sqlite::WalNormalIndexed, p2p::Sqlite::AsOpened]
                    } else {
                        &[p2p::Sqlite::WalNormalIndexed]
                    };
                    for &mode in modes {
                        *run += 1;
                        let dir = work.join(format!("p2panda-{run}"));
                        std::fs::create_dir_all(&dir)?;
                        let (s, pr) = p2p::durable_run(&w.p2p, order, released, &dir.join("p2panda.sqlite"), mode, w.scope)?;
                        std::fs::remove_dir_all(&dir)?;
                        pragmas.insert(mode, pr);
                        results.add(size, path, if mode == p2p::Sqlite::AsOpened { P2P_FULL } else { P2P_WAL }, s);
                    }
                    Ok(())
                };
                let dagfold = |results: &mut Results, run: &mut usize| -> anyhow::Result<()> {
                    *run += 1;
                    let (s, summary) = dagfold_import(&bin, &template, &work.join(format!("import-{run}")), file)?;
                    let applied = summary["applied"].as_u64().unwrap_or(0) as usize;
                    if applied != w.ops + 2 {
                        return Err(anyhow!("dagfold import applied {applied} of {} ops: {summary}", w.ops + 2));
                    }
                    results.add(size, path, DF_IMPORT, (s - startup).max(1e-9));
                    if a.node {
                        *run += 1;
                        let s = dagfold_node(&bin, &template, &work.join(format!("node-{run}")), file, &w)?;
                        results.add(size, path, DF_NODE, s);
                    }
                    Ok(())
                };
                if p2p_first {
                    p2panda(&mut results, &mut run)?;
                    dagfold(&mut results, &mut run)?;
                } else {
                    dagfold(&mut results, &mut run)?;
                    p2panda(&mut results, &mut run)?;
                }
            }
        }
        std::fs::remove_file(&w.causal_file)?;
        std::fs::remove_file(&w.out_of_order_file)?;
    }
    std::fs::remove_dir_all(&work)?;

    println!();
    println!(
        "{} data ops per size from {} writers (tools/bench's workload), median of {} interleaved reps; ops/s (µs per op), one process per side on this machine.",
        a.sizes.iter().map(|s| thousands(*s as f64)).collect::<Vec<_>>().join(" / "),
        a.writers,
        a.reps
    );
    for (size, p, d) in &sizes_bytes {
        println!("{} ops: bytes per op on the wire: p2panda {:.0} (header + body), dagfold {:.0} (frame)", thousands(*size as f64), p, d);
    }
    for (mode, pr) in &pragmas {
        println!("p2panda SQLite {}: {pr}", if *mode == p2p::Sqlite::AsOpened { "as opened" } else { "WAL+NORMAL, + 2 indexes" });
    }
    println!("dagfold import's fixed cost (an empty file), subtracted: {:.1} ms", startup * 1e3);
    println!();
    println!("| ops | path | {P2P_FULL} | {P2P_WAL} | {DF_IMPORT} | {DF_NODE} |");
    println!("|---|---|---|---|---|---|");
    for &size in &a.sizes {
        let n = thousands(size as f64);
        println!("| {n} | validation, 1 thread (no store) | {} | | {} | |", results.cell(size, VALIDATION, P2P), results.cell(size, VALIDATION, DF));
        for path in [CAUSAL, OUT_OF_ORDER] {
            println!(
                "| {n} | {path} | {} | {} | {} | {} |",
                results.cell(size, path, P2P_FULL),
                results.cell(size, path, P2P_WAL),
                results.cell(size, path, DF_IMPORT),
                results.cell(size, path, DF_NODE)
            );
        }
    }
    Ok(())
}
