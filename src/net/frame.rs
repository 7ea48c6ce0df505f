//! Framing on a QUIC stream (SPEC §10): a `u32` little-endian length, then
//! that many bytes of content; many frames a stream.
//!
//! Reading is split in two (`read_length`, `read_content`) so the server can
//! reserve memory for a frame between learning its length and allocating it;
//! `read_frame` composes them for everyone else.

use quinn::{ReadError, ReadExactError, RecvStream, SendStream, VarInt, WriteError};

/// One frame's content, after its 4-byte length prefix: SPEC §7's limit,
/// defined once in `limits` (the transport knows the bound, not the
/// protocol's types).
pub const FRAME_CONTENT_BYTES_MAX: u32 = crate::limits::FRAME_BYTES_MAX;

/// Size of the length prefix on the wire.
pub const FRAME_PREFIX_BYTES: u32 = 4;

/// Why a frame could not be read. The first two are the peer's fault
/// (malformed, SPEC §10); the rest are the stream or connection going away.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is over the limit. Nothing was allocated for it.
    #[error("frame length {len} over the limit {max}")]
    Oversize { len: u32, max: u32 },
    /// The stream ended (FIN) inside a length prefix or inside a content.
    #[error("stream ended inside a frame: {got} of {expected} bytes")]
    Truncated { expected: u32, got: u32 },
    /// The peer reset the stream with this application error code.
    #[error("stream reset by the peer with code {0}")]
    Reset(VarInt),
    /// The connection was lost, or the stream was already stopped locally.
    #[error("read failed: {0}")]
    Read(ReadError),
}

impl FrameError {
    /// True when the peer sent bytes that are not valid framing.
    pub fn is_malformed(&self) -> bool {
        matches!(self, FrameError::Oversize { .. } | FrameError::Truncated { .. })
    }
}

impl From<ReadError> for FrameError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Reset(code) => FrameError::Reset(code),
            other => FrameError::Read(other),
        }
    }
}

/// Why a frame could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameWriteError {
    /// The content is over the SPEC limit: every peer would reject it as
    /// malformed, so it is never put on the wire.
    #[error("frame content of {len} bytes over the limit {FRAME_CONTENT_BYTES_MAX}")]
    Oversize { len: usize },
    /// The peer stopped the stream, or the connection was lost.
    #[error("write failed: {0}")]
    Write(#[from] WriteError),
}

/// Reads the next length prefix. `Ok(None)` on a clean end of stream between
/// frames. A length over `max_len` is an error before anything is allocated.
pub async fn read_length(recv: &mut RecvStream, max_len: u32) -> Result<Option<u32>, FrameError> {
    let mut prefix = [0u8; FRAME_PREFIX_BYTES as usize];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(ReadExactError::FinishedEarly(got)) => {
            return Err(FrameError::Truncated {
                expected: FRAME_PREFIX_BYTES,
                got: got as u32, // < 4: read into a 4-byte buffer
            });
        }
        Err(ReadExactError::ReadError(e)) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(prefix);
    if len > max_len {
        return Err(FrameError::Oversize { len, max: max_len });
    }
    Ok(Some(len))
}

/// Reads exactly `len` bytes of content. The caller has checked `len` against
/// its limit (`read_length` does). Memory grows as the bytes arrive, so a
/// frame announced but never sent costs at most [`CONTENT_FIRST_ALLOC_BYTES`].
pub async fn read_content(recv: &mut RecvStream, len: u32) -> Result<Vec<u8>, FrameError> {
    let len = len as usize;
    let mut content = Vec::with_capacity(len.min(CONTENT_FIRST_ALLOC_BYTES));
    while content.len() < len {
        match recv.read_chunk(len - content.len(), true).await {
            Ok(Some(chunk)) => content.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(FrameError::Truncated {
                    expected: len as u32,      // a u32 argument
                    got: content.len() as u32, // < len
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(content)
}

/// What `read_content` allocates before any content has arrived.
pub const CONTENT_FIRST_ALLOC_BYTES: usize = 64 * 1024;

/// A read buffer over one stream, for the server: frames are parsed out of
/// chunks as quinn hands them over (one call per chunk, not two per frame),
/// and their content is borrowed from the buffer rather than copied into an
/// allocation of its own.
///
/// Memory: the buffer holds the frame being read plus at most
/// [`LOOKAHEAD_BYTES`] of what follows it; after a large frame it shrinks.
pub(crate) struct StreamBuf {
    data: Vec<u8>,
    pos: usize,
}

/// What one read may take beyond the bytes the current frame still needs.
pub(crate) const LOOKAHEAD_BYTES: usize = 16 * 1024;

impl StreamBuf {
    pub fn new() -> StreamBuf {
        StreamBuf { data: Vec::new(), pos: 0 }
    }

    fn avail(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Makes at least `n` bytes available. `Ok(false)` if the stream ended
    /// first (the bytes available are then all there will be).
    async fn fill(&mut self, recv: &mut RecvStream, n: usize) -> Result<bool, FrameError> {
        while self.avail() < n {
            if self.pos > 0 {
                self.data.drain(..self.pos);
                self.pos = 0;
            }
            let want = n - self.data.len() + LOOKAHEAD_BYTES;
            match recv.read_chunk(want, true).await? {
                Some(chunk) => self.data.extend_from_slice(&chunk.bytes),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The next length prefix, as [`read_length`] (`Ok(None)`: a clean end
    /// between frames).
    pub async fn length(&mut self, recv: &mut RecvStream, max_len: u32) -> Result<Option<u32>, FrameError> {
        let prefix = FRAME_PREFIX_BYTES as usize;
        if !self.fill(recv, prefix).await? {
            return match self.avail() {
                0 => Ok(None),
                got => Err(FrameError::Truncated { expected: FRAME_PREFIX_BYTES, got: got as u32 }),
            };
        }
        let len = u32::from_le_bytes(self.data[self.pos..self.pos + prefix].try_into().expect("4 bytes"));
        if len > max_len {
            return Err(FrameError::Oversize { len, max: max_len });
        }
        self.pos += prefix;
        Ok(Some(len))
    }

    /// Waits until `len` bytes of content are in the buffer.
    pub async fn content(&mut self, recv: &mut RecvStream, len: u32) -> Result<(), FrameError> {
        if self.fill(recv, len as usize).await? {
            Ok(())
        } else {
            Err(FrameError::Truncated { expected: len, got: self.avail() as u32 })
        }
    }

    /// Takes the `len` bytes of content that [`StreamBuf::content`] waited
    /// for, and gives back room a large frame took.
    pub fn take(&mut self, len: u32, f: impl FnOnce(&[u8])) {
        let end = self.pos + len as usize;
        f(&self.data[self.pos..end]);
        self.pos = end;
        if self.data.capacity() > 4 * LOOKAHEAD_BYTES {
            self.data.drain(..self.pos);
            self.pos = 0;
            self.data.shrink_to(2 * LOOKAHEAD_BYTES);
        }
    }
}

/// Reads one frame. `Ok(None)` on a clean end of stream between frames;
/// `Ok(Some(vec![]))` for a zero-length frame (valid framing: what an empty
/// content means is the decoder's business).
pub async fn read_frame(recv: &mut RecvStream, max_len: u32) -> Result<Option<Vec<u8>>, FrameError> {
    match read_length(recv, max_len).await? {
        None => Ok(None),
        Some(len) => read_content(recv, len).await.map(Some),
    }
}

/// A frame's length prefix, or `Oversize`.
fn prefix(content: &[u8]) -> Result<[u8; 4], FrameWriteError> {
    if content.len() > FRAME_CONTENT_BYTES_MAX as usize {
        return Err(FrameWriteError::Oversize { len: content.len() });
    }
    Ok((content.len() as u32).to_le_bytes())
}

/// Writes frames in one stream write: each length prefix and content
/// copied into one buffer, so that the stream's lock is taken, and the
/// connection woken, once for all of them (a gossip burst: one op per
/// frame). Nothing is written when one of them is oversize.
pub async fn write_frames(send: &mut SendStream, contents: &[&[u8]]) -> Result<(), FrameWriteError> {
    let prefixes = contents.iter().map(|c| prefix(c)).collect::<Result<Vec<_>, _>>()?;
    let mut buf = Vec::with_capacity(contents.iter().map(|c| 4 + c.len()).sum());
    for (p, c) in prefixes.iter().zip(contents) {
        buf.extend_from_slice(p);
        buf.extend_from_slice(c);
    }
    send.write_all(&buf).await?;
    Ok(())
}

/// Writes one frame: its length prefix, then its content. Two writes
/// rather than one concatenated buffer: quinn copies both into its send
/// buffer anyway, so this saves a copy of the content (up to 1 MiB).
pub async fn write_frame(send: &mut SendStream, content: &[u8]) -> Result<(), FrameWriteError> {
    send.write_all(&prefix(content)?).await?;
    send.write_all(content).await?;
    Ok(())
}
