//! QUIC transport (SPEC §10): the endpoint, its TLS, length-prefixed framing,
//! the accept loop that turns frames into decoded items, and client helpers.
//!
//! Architecture invariant: this module knows quinn and rustls but not the
//! protocol types. What a frame means is decided by a [`server::FrameDecoder`]
//! supplied by the node, so the transport can be tested (and reused by tools)
//! on its own.
//!
//! Memory stays bounded end to end: QUIC flow control bounds what a peer may
//! have in flight (stream and connection receive windows), a byte budget
//! bounds frames held between the socket and the node's sink, and the
//! node's bounded ingest bounds the rest. When the node falls behind, stream
//! tasks stop reading and the peers' writes block (see `server`).

pub mod client;
pub mod fair;
pub mod frame;
pub mod reply;
pub mod server;
pub mod tls;

/// QUIC application error codes that dagfold sends when it stops a stream or
/// closes a connection. One namespace for both, as QUIC allows; fixed values,
/// since peers see them on the wire.
pub mod codes {
    /// No error: a normal close.
    pub const ERR_NONE: u32 = 0;
    /// The stream carried a malformed frame (over the limit, truncated, or not
    /// decodable, SPEC §10). Sent with `STOP_SENDING` on that stream only.
    pub const ERR_MALFORMED: u32 = 1;
    /// The node is shutting down (connection close), or no longer takes items
    /// from this stream.
    pub const ERR_SHUTDOWN: u32 = 2;
    /// A frame's content, or a reply frame, did not move within its deadline.
    pub const ERR_TIMEOUT: u32 = 3;
    /// The request reveals a scope the client may not see: it proved no
    /// key, or one that is neither a member of the scope nor a configured
    /// peer (SPEC §10). Sent with `RESET_STREAM` on that stream only.
    pub const ERR_UNAUTHORIZED: u32 = 4;
}

pub use client::{client_endpoint, connect, connect_peer, open_bi, send_frames_uni, Dialer, FrameWriter, Link, PeerAddr, StreamFrames};
pub use codes::{ERR_MALFORMED, ERR_NONE, ERR_SHUTDOWN, ERR_TIMEOUT, ERR_UNAUTHORIZED};
pub use tls::{identity_cert, Ed25519Key, NodeCert};
pub use frame::{read_frame, write_frame, write_frames, FrameError, FrameWriteError, FRAME_CONTENT_BYTES_MAX};
pub use fair::{IngestClosed, ItemSink};
pub use server::{close_endpoint, make_endpoint, run_server, FrameDecoder, Inbound, Reply, ServerConfig};
/// A lost connection, as the dialing side sees it.
pub use quinn::ConnectionError;
