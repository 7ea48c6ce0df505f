//! The dialing side: how a node (or a tool, or a test) reaches a peer and
//! writes frames to it. The node's peer links use [`Dialer`] and [`Link`],
//! so that they never touch a QUIC type themselves.
//!
//! Every wait here is bounded by the connection: the handshake and a silent
//! peer by the idle timeout, a peer that does not read by flow control (the
//! write blocks; wrap it in a timeout if blocking is not acceptable).

use std::net::SocketAddr;

use quinn::{ClosedStream, Connection, ConnectionError, Endpoint, RecvStream, SendStream, StoppedError, VarInt};

use super::frame::{read_frame, write_frame, FrameError, FrameWriteError, FRAME_CONTENT_BYTES_MAX};
use super::server::{client_config, NetError, ServerConfig};
use super::tls::{Ed25519Key, NodeCert, SERVER_NAME};

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The endpoint could not start the attempt (no client config, closed
    /// endpoint, bad address).
    #[error("connect: {0}")]
    Start(#[from] quinn::ConnectError),
    /// The handshake failed or timed out (or the server did not prove the
    /// key it was dialed with).
    #[error("handshake: {0}")]
    Handshake(#[from] ConnectionError),
    /// No client config could be made for the dial.
    #[error("client config: {0}")]
    Config(String),
}

/// Why frames could not be sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The stream could not be opened: the connection is gone.
    #[error("open stream: {0}")]
    Open(#[from] ConnectionError),
    #[error(transparent)]
    Frame(#[from] FrameWriteError),
    /// The stream was closed before it was finished.
    #[error("finish: {0}")]
    Finish(#[from] ClosedStream),
    /// The peer stopped the stream with this code (`ERR_MALFORMED`, ...).
    #[error("stopped by the peer with code {0}")]
    Stopped(VarInt),
    /// The connection was lost before the peer acknowledged the frames.
    #[error("not acknowledged: {0}")]
    Unacknowledged(StoppedError),
}

/// An endpoint for dialing only (tools, tests): bound to `bind`, no server
/// config, our transport bounds, anonymous, accepting any server key.
/// Needs a tokio runtime.
pub fn client_endpoint(bind: SocketAddr, cfg: &ServerConfig) -> Result<Endpoint, NetError> {
    client_endpoint_as(bind, cfg, None)
}

/// An endpoint for dialing only that presents `identity` (SPEC §10: a
/// client proving a member's key), accepting any server key unless a dial
/// names one ([`connect_peer`]).
pub fn client_endpoint_as(bind: SocketAddr, cfg: &ServerConfig, identity: Option<&NodeCert>) -> Result<Endpoint, NetError> {
    cfg.validate()?;
    let mut endpoint = Endpoint::client(bind).map_err(|source| NetError::Bind { addr: bind, source })?;
    endpoint.set_default_client_config(client_config(cfg, identity, None)?);
    Ok(endpoint)
}

/// A node to dial: `KEY@ADDR` (the handshake aborts unless the server
/// proves KEY, 64 hex characters) or `ADDR` (any key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    pub key: Option<Ed25519Key>,
    pub addr: SocketAddr,
}

impl std::str::FromStr for PeerAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<PeerAddr, String> {
        let (key, addr) = match s.split_once('@') {
            Some((k, a)) => {
                let key = hex::decode(k).ok().and_then(|v| <[u8; 32]>::try_from(v).ok());
                (Some(key.ok_or_else(|| format!("{s:?}: the key before @ takes 64 hex characters"))?), a)
            }
            None => (None, s),
        };
        let addr = addr.parse().map_err(|e| format!("{s:?}: {e} (KEY@HOST:PORT or HOST:PORT)"))?;
        Ok(PeerAddr { key, addr })
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(k) => write!(f, "{}@{}", hex::encode(k), self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

impl<'de> serde::Deserialize<'de> for PeerAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PeerAddr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for PeerAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

/// Connects to `peer` from `endpoint`: with the endpoint's default client
/// config for a bare address, or, when the peer's key is given, one that
/// presents `identity` and aborts the handshake unless the server proves
/// that key.
pub async fn connect_peer(
    endpoint: &Endpoint,
    cfg: &ServerConfig,
    identity: Option<&NodeCert>,
    peer: &PeerAddr,
) -> Result<Connection, ConnectError> {
    match peer.key {
        None => connect(endpoint, peer.addr).await,
        Some(key) => {
            let config = client_config(cfg, identity, Some(key)).map_err(|e| ConnectError::Config(e.to_string()))?;
            Ok(endpoint.connect_with(config, peer.addr, SERVER_NAME)?.await?)
        }
    }
}

/// Connects to a dagfold node at `addr` with the endpoint's default client
/// config, which for endpoints from `make_endpoint` / `client_endpoint` is
/// the accept-any config with ALPN `dagfold/1`.
pub async fn connect(endpoint: &Endpoint, addr: SocketAddr) -> Result<Connection, ConnectError> {
    Ok(endpoint.connect(addr, SERVER_NAME)?.await?)
}

/// Dials configured peers from the node's endpoint (the one `make_endpoint`
/// made, which also serves, so a peer sees our connections come from the
/// address we listen on).
#[derive(Clone, Debug)]
pub struct Dialer {
    endpoint: Endpoint,
    cfg: ServerConfig,
    identity: std::sync::Arc<NodeCert>,
}

impl Dialer {
    /// Dials from `endpoint` presenting `identity` (the node's).
    pub fn new(endpoint: &Endpoint, cfg: &ServerConfig, identity: NodeCert) -> Dialer {
        Dialer { endpoint: endpoint.clone(), cfg: cfg.clone(), identity: std::sync::Arc::new(identity) }
    }

    /// Connects to `peer` (see [`connect_peer`]).
    pub async fn dial(&self, peer: &PeerAddr) -> Result<Link, ConnectError> {
        Ok(Link { conn: connect_peer(&self.endpoint, &self.cfg, Some(&self.identity), peer).await? })
    }
}

/// A connection to a peer node: streams of frames to it, and its end.
#[derive(Debug)]
pub struct Link {
    conn: Connection,
}

impl Link {
    /// The key the peer proved in the handshake (a node always proves one).
    pub fn peer_key(&self) -> Option<Ed25519Key> {
        super::tls::peer_key(&self.conn)
    }

    /// Opens a unidirectional stream to write frames on.
    pub async fn open_uni(&self) -> Result<FrameWriter, ConnectionError> {
        Ok(FrameWriter { send: self.conn.open_uni().await? })
    }

    /// Opens a bidirectional stream (see [`open_bi`]).
    pub async fn open_bi(&self) -> Result<(FrameWriter, StreamFrames), ConnectionError> {
        open_bi(&self.conn).await
    }

    /// Completes once the connection is closed, by either side or by its
    /// idle timeout.
    pub async fn closed(&self) {
        self.conn.closed().await;
    }
}

/// Opens a unidirectional stream, writes `frames` on it, finishes it, and
/// waits until the peer has acknowledged all of it (received, not
/// necessarily processed), so the caller may close the connection after.
pub async fn send_frames_uni<I>(conn: &Connection, frames: I) -> Result<(), SendError>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let mut send = conn.open_uni().await?;
    for frame in frames {
        write_frame(&mut send, frame.as_ref()).await?;
    }
    send.finish()?;
    match send.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(SendError::Stopped(code)),
        Err(e) => Err(SendError::Unacknowledged(e)),
    }
}

/// Opens a bidirectional stream: frames written on the writer reach the
/// peer's decoder; the peer's replies come out of the reader. The peer sees
/// the stream only once the first frame is written.
pub async fn open_bi(conn: &Connection) -> Result<(FrameWriter, StreamFrames), ConnectionError> {
    let (send, recv) = conn.open_bi().await?;
    Ok((FrameWriter { send }, StreamFrames { recv, max_len: FRAME_CONTENT_BYTES_MAX }))
}

/// Writes frames on one stream.
#[derive(Debug)]
pub struct FrameWriter {
    send: SendStream,
}

impl FrameWriter {
    /// Writes one frame; waits while flow control says the peer is full.
    pub async fn write(&mut self, content: &[u8]) -> Result<(), FrameWriteError> {
        write_frame(&mut self.send, content).await
    }

    /// Writes frames in one stream write (`frame::write_frames`).
    pub async fn write_many(&mut self, contents: &[&[u8]]) -> Result<(), FrameWriteError> {
        super::frame::write_frames(&mut self.send, contents).await
    }

    /// Ends the stream after the frames written so far.
    pub fn finish(&mut self) -> Result<(), ClosedStream> {
        self.send.finish()
    }

    /// The stream itself, to write raw bytes (tests of malformed framing).
    pub fn send_stream(&mut self) -> &mut SendStream {
        &mut self.send
    }
}

/// Reads frames from one QUIC stream, up to the SPEC frame limit (frames
/// from a file are `durable::FileFrames`).
#[derive(Debug)]
pub struct StreamFrames {
    recv: RecvStream,
    max_len: u32,
}

impl StreamFrames {
    /// The next frame, or `None` once the peer finished the stream.
    pub async fn read(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        read_frame(&mut self.recv, self.max_len).await
    }

    /// Tells the peer to stop sending, with an application error code.
    pub fn stop(&mut self, code: u32) -> Result<(), ClosedStream> {
        self.recv.stop(VarInt::from_u32(code))
    }
}
