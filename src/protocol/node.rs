//! The node's own messages, wire variants 2..=254 (SPEC §10 leaves them to
//! the implementation; `docs/PROTOCOL.md` documents them). They travel in
//! the same frames as `Message` (u32 LE length, then variant byte, then the
//! borsh body) and never reach the core.

use borsh::{BorshDeserialize, BorshSerialize};

use super::types::Hash;

pub const MSG_HEARTBEAT: u8 = 2;
pub const MSG_SYNC_REQUEST: u8 = 3;
pub const MSG_SYNC_DONE: u8 = 4;
pub const MSG_SUBSCRIBE: u8 = 5;
pub const MSG_EVENT: u8 = 6;
pub const MSG_LAGGED: u8 = 7;
pub const MSG_KEYS_REQUEST: u8 = 8;

/// Heads listed per plane in one heartbeat entry; more concurrent heads
/// than this are rare, and a sync fills in the rest.
pub const HEARTBEAT_HEADS_MAX: usize = 64;
/// Scopes per heartbeat frame (~4.2 KB each at most: well inside a frame).
pub const HEARTBEAT_SCOPES_MAX: usize = 128;
/// Ids named in one sync request.
pub const SYNC_IDS_MAX: usize = 256;
/// Ops one sync response may carry: bounds the work a peer can ask for.
pub const SYNC_OPS_MAX: u32 = 4096;
/// Key deliveries one `KeysRequest` reply carries at most (~200 bytes
/// each: ~200 KB); the requester asks again after the last one sent.
pub const KEYS_REPLY_MAX: u32 = 1024;

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct ScopeBeat {
    pub scope: Hash,
    pub root: Hash,
    pub governance_heads: Vec<Hash>,
    pub data_heads: Vec<Hash>,
}

/// Sent every heartbeat interval on a unidirectional stream.
#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct Heartbeat {
    pub scopes: Vec<ScopeBeat>,
}

/// Opens a bidirectional stream: "send me `want` and their ancestors that
/// are not ancestors of `have`, at most `max_ops`". The reply is a series of
/// `Message::Op` frames, then one `SyncDone`.
#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct SyncRequest {
    pub scope: Hash,
    pub want: Vec<Hash>,
    pub have: Vec<Hash>,
    pub max_ops: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct SyncDone {
    pub sent: u32,
}

/// Opens a bidirectional stream: "send me the events of `scope` from
/// sequence number `from_seq` (1 is the first), then each new one". The
/// reply is a series of `EventFrame`s; a subscriber that falls behind gets
/// one `Lagged` and the stream ends; it resubscribes from `next_seq`.
#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct Subscribe {
    pub scope: Hash,
    pub from_seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct EventFrame {
    pub scope: Hash,
    pub seq: u64,
    pub op: Hash,
    pub kind: String,
    pub data: Vec<u8>,
}

/// Opens a bidirectional stream: "send me the key deliveries you made to
/// the key I proved, those stored after (`after_scope`, `after_key_id`)
/// (both ZERO: from the first)". The reply is at most `KEYS_REPLY_MAX`
/// `Message::Key` frames in (scope, key_id) order, then one `SyncDone`.
#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct KeysRequest {
    pub after_scope: Hash,
    pub after_key_id: Hash,
}

#[derive(Clone, Debug, PartialEq, Eq, BorshSerialize, BorshDeserialize)]
pub struct Lagged {
    pub scope: Hash,
    pub next_seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeMessage {
    Heartbeat(Heartbeat),
    SyncRequest(SyncRequest),
    SyncDone(SyncDone),
    Subscribe(Subscribe),
    Event(EventFrame),
    Lagged(Lagged),
    KeysRequest(KeysRequest),
}

impl NodeMessage {
    pub fn encode(&self) -> Vec<u8> {
        let (tag, body) = match self {
            NodeMessage::Heartbeat(m) => (MSG_HEARTBEAT, borsh::to_vec(m)),
            NodeMessage::SyncRequest(m) => (MSG_SYNC_REQUEST, borsh::to_vec(m)),
            NodeMessage::SyncDone(m) => (MSG_SYNC_DONE, borsh::to_vec(m)),
            NodeMessage::Subscribe(m) => (MSG_SUBSCRIBE, borsh::to_vec(m)),
            NodeMessage::Event(m) => (MSG_EVENT, borsh::to_vec(m)),
            NodeMessage::Lagged(m) => (MSG_LAGGED, borsh::to_vec(m)),
            NodeMessage::KeysRequest(m) => (MSG_KEYS_REQUEST, borsh::to_vec(m)),
        };
        let mut out = vec![tag];
        out.extend(body.expect("encoding into a Vec cannot fail"));
        out
    }

    /// Decodes a node message; `None` when the frame is not one (or breaks
    /// its bounds). Frames are at most 1 MiB, and borsh's derived decoder
    /// never preallocates past what the input holds, so this is bounded.
    pub fn decode(frame: &[u8]) -> Option<NodeMessage> {
        let (&tag, body) = frame.split_first()?;
        let m = match tag {
            MSG_HEARTBEAT => {
                let h: Heartbeat = borsh::from_slice(body).ok()?;
                let ok = h.scopes.len() <= HEARTBEAT_SCOPES_MAX
                    && h.scopes.iter().all(|s| s.governance_heads.len() <= HEARTBEAT_HEADS_MAX && s.data_heads.len() <= HEARTBEAT_HEADS_MAX);
                ok.then_some(NodeMessage::Heartbeat(h))?
            }
            MSG_SYNC_REQUEST => {
                let r: SyncRequest = borsh::from_slice(body).ok()?;
                (r.want.len() <= SYNC_IDS_MAX && r.have.len() <= SYNC_IDS_MAX).then_some(NodeMessage::SyncRequest(r))?
            }
            MSG_SYNC_DONE => NodeMessage::SyncDone(borsh::from_slice(body).ok()?),
            MSG_SUBSCRIBE => NodeMessage::Subscribe(borsh::from_slice(body).ok()?),
            MSG_EVENT => NodeMessage::Event(borsh::from_slice(body).ok()?),
            MSG_LAGGED => NodeMessage::Lagged(borsh::from_slice(body).ok()?),
            MSG_KEYS_REQUEST => NodeMessage::KeysRequest(borsh::from_slice(body).ok()?),
            _ => return None,
        };
        Some(m)
    }

    pub fn is_node_variant(tag: u8) -> bool {
        (MSG_HEARTBEAT..=MSG_KEYS_REQUEST).contains(&tag)
    }
}
