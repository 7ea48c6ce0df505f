//! Replies: frames the node writes back on the bidirectional stream a
//! request came on (sync answers, subscription events), each stream's
//! writer a task of its own, bounded in frames queued and in how long one
//! frame may wait for the peer; and a refusal, the stream reset with an
//! application error (SPEC §10).

use std::fmt;
use std::time::Duration;

use metrics::counter;
use quinn::{SendStream, VarInt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::codes::ERR_TIMEOUT;
use super::frame::{write_frame, FRAME_CONTENT_BYTES_MAX};

/// Frames queued on one [`Reply`] before `send` waits (`try_send` fails).
/// Replies are the node's own data (sync answers, acks): a few frames of
/// slack keep the writer busy without letting one slow reader pin much
/// memory (at most this × 1 MiB per bidirectional stream).
pub const REPLY_FRAMES_QUEUED_MAX: usize = 8;

/// How long one reply frame may take to be accepted by quinn (i.e. for the
/// peer to extend flow-control credit). A peer that does not read its replies
/// for this long has its stream reset with [`ERR_TIMEOUT`], which wakes every
/// waiting `Reply::send` with [`ReplyClosed`]: this is what bounds `send`.
pub const REPLY_FRAME_WRITE_TIMEOUT_MS: u32 = 10_000;

/// Writes frames back on the bidirectional stream a frame came on.
///
/// Cloneable; a writer task drains a queue of [`REPLY_FRAMES_QUEUED_MAX`]
/// frames onto the stream, and finishes the stream once every handle (and
/// the stream's reader) has dropped. Neither method blocks unboundedly: a
/// peer that stops reading has its stream reset after
/// [`REPLY_FRAME_WRITE_TIMEOUT_MS`], which closes the queue.
#[derive(Clone, Debug)]
pub struct Reply {
    frames: mpsc::Sender<ReplyItem>,
}

/// What the reply writer takes: a frame, or the end of the stream with an
/// application error (a refusal, SPEC §10).
#[derive(Debug)]
enum ReplyItem {
    Frame(Vec<u8>),
    Reset(u32),
}

impl ReplyItem {
    fn into_frame(self) -> Vec<u8> {
        match self {
            ReplyItem::Frame(f) => f,
            ReplyItem::Reset(_) => Vec::new(),
        }
    }
}

/// The reply stream is gone (the peer stopped it, the connection was lost,
/// or the writer timed out). Holds the frame that was not sent.
#[derive(thiserror::Error)]
#[error("reply stream closed")]
pub struct ReplyClosed(pub Vec<u8>);

impl fmt::Debug for ReplyClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplyClosed({} bytes)", self.0.len())
    }
}

/// Why `Reply::try_send` did not queue the frame, which it gives back.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TrySendError {
    #[error("reply queue full")]
    Full(Vec<u8>),
    #[error("reply stream closed")]
    Closed(Vec<u8>),
}

impl fmt::Debug for TrySendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(frame) => write!(f, "Full({} bytes)", frame.len()),
            TrySendError::Closed(frame) => write!(f, "Closed({} bytes)", frame.len()),
        }
    }
}

impl Reply {
    /// Starts the writer task for `send` in `tasks`.
    pub(super) fn spawn(send: SendStream, tasks: &mut JoinSet<()>) -> Reply {
        let (frames, queue) = mpsc::channel(REPLY_FRAMES_QUEUED_MAX);
        tasks.spawn(write_replies(send, queue));
        Reply { frames }
    }

    /// Queues one frame's content, waiting while the queue is full.
    ///
    /// Panics if the content is over the SPEC frame limit: the node's own
    /// frames are built within it, so that is a programmer's error.
    pub async fn send(&self, frame: Vec<u8>) -> Result<(), ReplyClosed> {
        assert_frame_len(&frame);
        self.frames.send(ReplyItem::Frame(frame)).await.map_err(|e| ReplyClosed(e.0.into_frame()))
    }

    /// Ends the stream with the application error `code` (what was queued
    /// before is written first): how a request is refused (SPEC §10).
    pub async fn refuse(&self, code: u32) {
        let _ = self.frames.send(ReplyItem::Reset(code)).await;
    }

    /// Queues one frame's content if there is room, at once.
    ///
    /// Panics if the content is over the SPEC frame limit (see `send`).
    pub fn try_send(&self, frame: Vec<u8>) -> Result<(), TrySendError> {
        assert_frame_len(&frame);
        self.frames.try_send(ReplyItem::Frame(frame)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(item) => TrySendError::Full(item.into_frame()),
            mpsc::error::TrySendError::Closed(item) => TrySendError::Closed(item.into_frame()),
        })
    }

    /// True once the stream can take no more frames.
    pub fn is_closed(&self) -> bool {
        self.frames.is_closed()
    }

    /// Completes once the stream can take no more frames: the peer stopped
    /// it, the connection was lost, or a write timed out.
    pub async fn closed(&self) {
        self.frames.closed().await
    }
}

fn assert_frame_len(frame: &[u8]) {
    assert!(
        frame.len() <= FRAME_CONTENT_BYTES_MAX as usize,
        "reply frame of {} bytes over the SPEC limit",
        frame.len()
    );
}

/// Drains a reply queue onto its stream; finishes the stream when the queue
/// closes. Returning early drops the queue, which wakes waiting senders. It
/// also returns as soon as the peer stops the stream or the connection is
/// lost, even while nothing is queued: a handler waiting for something to
/// send (a subscription to a quiet scope) learns of it through
/// [`Reply::closed`] instead of holding its slot until it next sends.
async fn write_replies(mut send: SendStream, mut queue: mpsc::Receiver<ReplyItem>) {
    let timeout = Duration::from_millis(u64::from(REPLY_FRAME_WRITE_TIMEOUT_MS));
    let stopped = send.stopped();
    tokio::pin!(stopped);
    loop {
        let frame = tokio::select! {
            item = queue.recv() => match item {
                Some(ReplyItem::Frame(frame)) => frame,
                Some(ReplyItem::Reset(code)) => {
                    let _ = send.reset(VarInt::from_u32(code));
                    return;
                }
                None => break,
            },
            // Before `finish` this completes only on STOP_SENDING or a lost
            // connection: nobody will read what we would write.
            _ = &mut stopped => return,
        };
        match tokio::time::timeout(timeout, write_frame(&mut send, &frame)).await {
            Ok(Ok(())) => {}
            // The peer stopped the stream or the connection is gone.
            Ok(Err(_)) => return,
            Err(_elapsed) => {
                counter!(super::server::metric::REPLIES_TIMED_OUT).increment(1);
                let _ = send.reset(VarInt::from_u32(ERR_TIMEOUT));
                return;
            }
        }
    }
    // Already reset or lost if this fails: nothing left to do either way.
    let _ = send.finish();
}

