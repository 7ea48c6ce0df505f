//! The `identity`, `import` and `inspect` commands (the node is in `node`).

use crate::clock::now_ms;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::core::{Config, Engine, Outcome, Reason, Stats};
use crate::durable::{FileFrames, FrameItem, FrameReadError, InlineDriver};
use crate::store::rocks::RocksStore;
use crate::store::StoreError;

/// Why a data directory could not be opened (`identity`, and the start of
/// `import` and `inspect`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("cannot open the store at {}: {source}", path.display())]
    Store { path: PathBuf, source: StoreError },
    #[error("cannot open the node state: {0}")]
    State(StoreError),
}

/// Why `dagfold import` stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("cannot read {file}: {source}")]
    Read { file: String, source: std::io::Error },
    /// A commit failed: the node state refuses further writes.
    #[error("store write failed, nothing more is accepted: {0}")]
    Store(StoreError),
    /// The input broke off (a truncated frame, a read error); every frame
    /// before it is applied. `summary` is the JSON summary up to there, with
    /// the error under `"error"`.
    #[error("{source}; everything before it is applied. summary: {summary}")]
    Input { source: FrameReadError, summary: serde_json::Value },
}

/// Why `dagfold inspect` printed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("--scope takes 64 hex characters, got {0:?}")]
    Scope(String),
    #[error("no scope {0} with an applied genesis")]
    NoScope(String),
}

pub fn open(data_dir: &Path, cfg: Config) -> Result<InlineDriver<RocksStore>, OpenError> {
    let store = RocksStore::open(data_dir).map_err(|source| OpenError::Store { path: data_dir.to_path_buf(), source })?;
    InlineDriver::open(store, cfg, now_ms()).map_err(OpenError::State)
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
pub fn import(data_dir: &Path, file: &str, batch_frames: usize, cfg: Config) -> Result<serde_json::Value, ImportError> {
    let mut node = open(data_dir, cfg)?;
    let input: Box<dyn Read> = if file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(file).map_err(|source| ImportError::Read { file: file.to_owned(), source })?,
        ))
    };
    let mut reader = FileFrames::new(input);
    let before = node.engine.stats.clone();
    let mut counts = OutcomeCounts::default();
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(batch_frames);
    let mut error: Option<FrameReadError> = None;
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
                error = Some(e);
                true
            }
        };
        if batch.len() >= batch_frames || (done && !batch.is_empty()) {
            let (outcomes, _) = node.handle_frames(&batch, now_ms()).map_err(ImportError::Store)?;
            outcomes.iter().for_each(|o| counts.add(o));
            batch.clear();
        }
        if done {
            break;
        }
    }
    let mut summary = stats_json(&before, &node.engine.stats, &counts);
    if let Some(e) = error {
        summary["error"] = json!(e.to_string());
        return Err(ImportError::Input { source: e, summary });
    }
    Ok(summary)
}

pub fn inspect(data_dir: &Path, scope: Option<&str>, cfg: Config) -> Result<serde_json::Value, InspectError> {
    let mut node = open(data_dir, cfg)?;
    match scope {
        Some(hex_scope) => {
            let id = crate::protocol::parse_hash_hex(hex_scope).ok_or_else(|| InspectError::Scope(hex_scope.to_owned()))?;
            node.engine
                .status(&id)
                .map(|s| s.to_json())
                .ok_or_else(|| InspectError::NoScope(hex_scope.to_owned()))
        }
        None => {
            let ids = node.engine.scope_ids();
            Ok(serde_json::Value::Array(ids.iter().filter_map(|id| node.engine.status(id).map(|s| s.to_json())).collect()))
        }
    }
}
