//! The synchronous driver: engine + store + batch verification, one atomic
//! write per batch of frames. `dagfold import`, the tests and the engine
//! benchmarks use it; the node's pipeline does the same work on threads.

use crate::core::{Config, Decoded, Engine, EventOut, Outcome, VerifiedOp};
use crate::protocol::sig;
use crate::store::{load_or_create_identity, Store, StoreError};

/// The engine driven inline, on the caller's thread (the node's pipeline
/// drives the same engine from its stage threads).
pub struct InlineDriver<S: Store> {
    pub engine: Engine,
    pub store: S,
    /// Sync the WAL on every commit (the durable default).
    pub sync: bool,
    /// Why a write failed, once one did: from then on every call is
    /// refused, one with nothing to write too, as the pipeline does
    /// (`PipelineState::refusing`).
    failed: Option<String>,
}

impl<S: Store> InlineDriver<S> {
    /// Opens the store, creating the identity on first use, and rebuilds the
    /// engine from it.
    pub fn open(mut store: S, cfg: Config, now_ms: u64) -> Result<Self, StoreError> {
        let identity = load_or_create_identity(&mut store)?;
        let cold = store.cold_reader();
        let mut engine = Engine::restore(cfg, identity, &store, cold, now_ms)?;
        if let Some(cold) = store.cold_reader() {
            // The filter of the applied ops, at once (the node reads it
            // while it serves).
            engine.complete_cold_filter_now(&*cold)?;
        }
        let commit = engine.take_commit()?;
        if !commit.writes.is_empty() {
            store.write(&commit.writes, true)?;
        }
        engine.note_durable(commit.number);
        Ok(InlineDriver { engine, store, sync: true, failed: None })
    }

    /// Handles frames in order (signatures verified as one batch) and
    /// commits everything they changed in one atomic write. Events are
    /// returned only once that write is durable.
    pub fn handle_frames(&mut self, frames: &[Vec<u8>], now_ms: u64) -> Result<(Vec<Outcome>, Vec<EventOut>), StoreError> {
        self.refuse_after_failure()?;
        let decoded: Vec<Option<Decoded>> = frames.iter().map(|f| crate::core::decode_frame(f).ok()).collect();
        let items: Vec<([u8; 32], [u8; 32], [u8; 64])> = decoded
            .iter()
            .filter_map(|d| match d {
                Some(Decoded::Op { id, op, .. }) => Some((op.author, *id, op.signature)),
                _ => None,
            })
            .collect();
        let mut verdicts = sig::verify_batch(&items).into_iter();
        let mut outcomes = Vec::with_capacity(frames.len());
        for d in decoded {
            outcomes.push(match d {
                None => self.engine.note_malformed(),
                Some(Decoded::Key(kd)) => {
                    self.engine.stats.frames += 1;
                    self.engine.handle_key(&kd, now_ms)
                }
                Some(Decoded::Op { id, op, bytes }) => {
                    let valid = verdicts.next().expect("one verdict per op");
                    self.engine.handle_checked(VerifiedOp { id, op, bytes, pre: Default::default() }, valid, now_ms)
                }
            });
        }
        let events = self.commit()?;
        Ok((outcomes, events))
    }

    /// Writes what the engine changed; returns the events now durable.
    /// A failed read of the engine's (`Engine::cold_failed`) is an error
    /// here, as a failed write is, and so at every later commit.
    pub fn commit(&mut self) -> Result<Vec<EventOut>, StoreError> {
        self.refuse_after_failure()?;
        let commit = self.engine.take_commit()?;
        if !commit.writes.is_empty() {
            if let Err(e) = self.store.write(&commit.writes, self.sync) {
                self.failed = Some(e.to_string());
                return Err(e);
            }
        }
        self.engine.note_durable(commit.number);
        Ok(commit.events)
    }

    fn refuse_after_failure(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(why) => Err(StoreError::Refusing(why.clone())),
            None => Ok(()),
        }
    }

    pub fn tick(&mut self, now_ms: u64) -> Result<(), StoreError> {
        self.engine.handle_tick(now_ms);
        self.commit().map(|_| ())
    }
}

/// Splits a byte stream of frames (`u32` LE length, then content) read from
/// a file or stdin (the QUIC side is `net::StreamFrames`).
pub struct FileFrames<R> {
    inner: R,
    offset: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("a frame at byte offset {offset} declares {len} bytes but the input ends after {available}")]
    Truncated { offset: u64, len: u32, available: u64 },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// One frame, or one whose declared length is past the frame limit (its
/// content is skipped, it counts as malformed: SPEC §10).
pub enum FrameItem {
    Frame(Vec<u8>),
    Oversized { offset: u64, len: u32 },
}

impl<R: std::io::Read> FileFrames<R> {
    pub fn new(inner: R) -> Self {
        FileFrames { inner, offset: 0 }
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, std::io::Error> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    pub fn next_frame(&mut self) -> Result<Option<FrameItem>, FrameReadError> {
        let start = self.offset;
        let mut len = [0u8; 4];
        let got = self.fill(&mut len)?;
        if got == 0 {
            return Ok(None);
        }
        if got < 4 {
            return Err(FrameReadError::Truncated { offset: start, len: 4, available: got as u64 });
        }
        let len = u32::from_le_bytes(len);
        self.offset += 4;
        if len > crate::limits::FRAME_BYTES_MAX {
            // Skip it in bounded chunks, never allocating `len`.
            let mut left = len as u64;
            let mut chunk = vec![0u8; 64 << 10];
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                let got = self.fill(&mut chunk[..n])?;
                self.offset += got as u64;
                if got < n {
                    return Err(FrameReadError::Truncated { offset: start, len, available: len as u64 - left + got as u64 });
                }
                left -= n as u64;
            }
            return Ok(Some(FrameItem::Oversized { offset: start, len }));
        }
        let mut buf = vec![0u8; len as usize];
        let got = self.fill(&mut buf)?;
        self.offset += got as u64;
        if got < len as usize {
            return Err(FrameReadError::Truncated { offset: start, len, available: got as u64 });
        }
        Ok(Some(FrameItem::Frame(buf)))
    }
}
