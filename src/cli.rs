//! The `identity`, `import` and `inspect` commands (the node is in `node`).

use crate::clock::now_ms;
use std::io::Read;
use std::path::Path;

use serde_json::json;

use crate::core::{Config, Engine, Outcome, Reason, Stats};
use crate::durable::{FileFrames, FrameItem, InlineDriver};
use crate::store::rocks::RocksStore;


pub fn open(data_dir: &Path, cfg: Config) -> anyhow_like::Result<InlineDriver<RocksStore>> {
    let store = RocksStore::open(data_dir)
        .map_err(|e| anyhow_like::Error(format!("cannot open the store at {}: {e}", data_dir.display())))?;
    InlineDriver::open(store, cfg, now_ms()).map_err(|e| anyhow_like::Error(format!("cannot open the node state: {e}")))
}

pub fn identity_json(engine: &Engine) -> serde_json::Value {
    crate::node::identity_json(engine.identity())
}

/// Frames handled per commit during import: large enough to amortize the
/// WAL sync (NUMBERS.md: ~90 µs) and fill a batch verification, small enough
/// that a crash loses little work to redo.
pub const IMPORT_BATCH_FRAMES: usize = 256;

pub fn stats_json(before: &Stats, after: &Stats, outcomes: &OutcomeCounts) -> serde_json::Value {
    let mut dropped = serde_json::Map::new();
    for r in Reason::ALL {
        let n = after.dropped[r.code() as usize] - before.dropped[r.code() as usize];
        dropped.insert(r.name().into(), json!(n));
    }
    json!({
        "frames": after.frames - before.frames,
        "malformed": after.malformed - before.malformed,
        "bad_signature": after.bad_signature - before.bad_signature,
        "duplicate": after.duplicates - before.duplicates,
        "genesis_refused": after.genesis_refused - before.genesis_refused,
        "applied": after.applied - before.applied,
        "dropped": dropped,
        "buffered": {
            "pending": outcomes.pending,
            "key_waiting": outcomes.key_waiting,
            "data_key_waiting": outcomes.data_key_waiting,
        },
        "released_by_cascade": after.cascade_released - before.cascade_released,
        "evicted": after.evicted - before.evicted,
        "keys_accepted": after.keys_accepted - before.keys_accepted,
        "keys_ignored": after.keys_ignored - before.keys_ignored,
        "divergences": after.divergences - before.divergences,
        "events": after.events - before.events,
    })
}

#[derive(Default)]
pub struct OutcomeCounts {
    pub pending: u64,
    pub key_waiting: u64,
    pub data_key_waiting: u64,
}

impl OutcomeCounts {
    fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::NotYet(crate::core::BufKind::Pending) => self.pending += 1,
            Outcome::NotYet(crate::core::BufKind::KeyWait) => self.key_waiting += 1,
            Outcome::NotYet(crate::core::BufKind::DataKeyWait) => self.data_key_waiting += 1,
            _ => {}
        }
    }
}

/// `dagfold import`: frames from a file or stdin through the engine.
pub fn import(data_dir: &Path, file: &str, batch_frames: usize, cfg: Config) -> anyhow_like::Result<serde_json::Value> {
    let mut node = open(data_dir, cfg)?;
    let input: Box<dyn Read> = if file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(file).map_err(|e| anyhow_like::Error(format!("cannot read {file}: {e}")))?,
        ))
    };
    let mut reader = FileFrames::new(input);
    let before = node.engine.stats.clone();
    let mut counts = OutcomeCounts::default();
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(batch_frames);
    let mut error: Option<String> = None;
    loop {
        let item = reader.next_frame();
        let done = match item {
            Ok(Some(FrameItem::Frame(f))) => {
                batch.push(f);
                false
            }
            Ok(Some(FrameItem::Oversized { .. })) => {
                // Past the frame limit (SPEC §7): malformed, the import goes on.
                node.engine.note_malformed();
                false
            }
            Ok(None) => true,
            Err(e) => {
                error = Some(e.to_string());
                true
            }
        };
        if batch.len() >= batch_frames || (done && !batch.is_empty()) {
            let (outcomes, _) = node
                .handle_frames(&batch, now_ms())
                .map_err(|e| anyhow_like::Error(format!("store write failed, nothing more is accepted: {e}")))?;
            outcomes.iter().for_each(|o| counts.add(o));
            batch.clear();
        }
        if done {
            break;
        }
    }
    let mut summary = stats_json(&before, &node.engine.stats, &counts);
    if let Some(e) = error {
        summary["error"] = json!(e);
        return Err(anyhow_like::Error(format!("{e}; everything before it is applied. summary: {summary}")));
    }
    Ok(summary)
}

pub fn inspect(data_dir: &Path, scope: Option<&str>, cfg: Config) -> anyhow_like::Result<serde_json::Value> {
    let mut node = open(data_dir, cfg)?;
    match scope {
        Some(hex_scope) => {
            let id = crate::protocol::parse_hash_hex(hex_scope)
                .ok_or_else(|| anyhow_like::Error(format!("--scope takes 64 hex characters, got {hex_scope:?}")))?;
            node.engine
                .status(&id)
                .map(|s| s.to_json())
                .ok_or_else(|| anyhow_like::Error(format!("no scope {hex_scope} with an applied genesis")))
        }
        None => {
            let ids = node.engine.scope_ids();
            Ok(serde_json::Value::Array(ids.iter().filter_map(|id| node.engine.status(id).map(|s| s.to_json())).collect()))
        }
    }
}

/// A minimal error type for the commands: a message for the operator.
pub mod anyhow_like {
    #[derive(Debug)]
    pub struct Error(pub String);
    impl std::fmt::Display for Error {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    impl std::error::Error for Error {}
    pub type Result<T> = std::result::Result<T, Error>;
}
