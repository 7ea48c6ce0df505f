//! Every bound of the node, in one place, each with the reason for its value
//! (STYLE.md: "put a limit on everything").
//!
//! Protocol limits (SPEC §7) are normative; the others are the
//! implementation's defaults and are overridable in `core::Config` or the
//! node's configuration.

/// SPEC §7: at most 32 `parents` and 32 `cut` ids per op.
pub const OP_PARENTS_MAX: u32 = 32;
/// SPEC §7: at most 32 `cut` ids per op.
pub const OP_CUT_MAX: u32 = 32;
/// SPEC §7: a payload is at most 256 KiB.
pub const OP_PAYLOAD_BYTES_MAX: u32 = 262_144;
/// SPEC §7: one wire frame after its 4-byte length prefix.
pub const FRAME_BYTES_MAX: u32 = 1_048_576;

/// SPEC §7 asks for at least 10,000 buffered ops per scope; the vectors need
/// 1,934 at most. 200,000 lets a 100,000-op chain delivered in reverse (the
/// `reversed` benchmark) buffer entirely before its root arrives, with room
/// for a second one; the byte bound below usually binds first.
pub const BUFFERED_OPS_PER_SCOPE_MAX: u64 = 200_000;
/// SPEC §7 asks for at least 64 MiB per scope.
pub const BUFFERED_BYTES_PER_SCOPE_MAX: u64 = 64 << 20;
/// Across all scopes: four scopes' worth of defaults, so that a flood in many
/// scopes at once still cannot take more than ~256 MiB of buffered ops.
pub const BUFFERED_OPS_TOTAL_MAX: u64 = 400_000;
pub const BUFFERED_BYTES_TOTAL_MAX: u64 = 256 << 20;

/// Heads-we-lack notes (from heartbeats) kept at most, the oldest dropped
/// as a note is added: each is up to 128 ids, so ~4 MiB in all. Bounded
/// where notes are added, not where a peer link takes them: with no peer
/// link up (no peer configured, or none reachable), a member's heartbeats
/// naming heads the node lacks would otherwise grow them without bound.
pub const LACKING_NOTES_MAX: usize = 1024;

/// SPEC §6 step 4: the default in-memory key wait of a data op.
pub const DATA_KEY_WAIT_MS_DEFAULT: u64 = 3_000;

/// Dropped verdicts remembered (SPEC §6: at least while a buffered op may
/// still arrive). One entry is ~80 bytes, so this caps the memory of a flood
/// of authentic-but-unauthorized ops at ~80 MiB; older verdicts are forgotten
/// oldest first, and a later copy of such an op is judged afresh.
pub const DROPPED_REMEMBERED_MAX: u64 = 1_000_000;

/// Applied ops kept in the in-memory index when the node has a cold index
/// (the store's ops table): about 60 B each, so ~16 MiB, plus the filter.
pub const HOT_APPLIED_MAX: usize = 1 << 18;
/// The filter in front of the cold index (`core::cold::IdFilter`).
pub const COLD_FILTER_BYTES: usize = 16 << 20;

/// Governance states at a cut kept in the cache. Data ops overwhelmingly use
/// their scope's current governance heads; a handful of older cuts are in
/// use while writers catch up with a governance change. A node holds many
/// scopes written at once, each with its own heads (and the single-op
/// shortcut reads its parent's state): the cache holds two cuts for each of
/// 32k scopes, within `GOV_CUT_CACHE_WEIGHT_MAX`. With 256 (before
/// 2026-12-05) `scopes_10k` recomputed a state for nearly every op. The
/// least recently used entries are evicted, as few as make room
/// (`core::governance`), not all when full: a flood of distinct cuts then
/// recomputes its own cuts, not those of every honest op. (The
/// keys ever made members of a scope, checked before any cut is computed,
/// need no bound of their own: one per accepted genesis or `AddMember`,
/// and those are bounded by what the scope's admins sign.)
pub const GOV_CUT_CACHE_MAX: usize = 65_536;

/// The weight of the cached governance states in all
/// (`GovState::weight`: members, their X25519 keys, key ids and
/// ancestors, about 100 bytes each): ~50 MB at most in each of the two
/// caches (the engine's and the pipeline's replica), whatever the scopes'
/// sizes; a scope of 20 members and a few key rotations weighs ~50.
pub const GOV_CUT_CACHE_WEIGHT_MAX: usize = 1 << 19;

/// Decompressed Ed25519 keys the node keeps (`protocol::sig`'s key cache,
/// one for all verifying threads): ~200 bytes each, in 32 maps of 3,584
/// keys (7/8 of 4,096 buckets, so no map doubles), ~24 MB at most whatever
/// the cores. A key used within the last ~57,000 distinct keys is found:
/// every author of 10,000 scopes of five members each (`scopes_10k`'s
/// 50,000 keys), decompressed once rather than in every batch.
pub const KEY_CACHE_MAX: usize = 114_688;

/// Work items one cascade may process before it asserts: a cascade releases
/// each buffered op at most once per dependency (≤ 64), so it can never
/// exceed 64 × the buffered-op bound. Guards against a logic error looping.
pub const CASCADE_STEPS_MAX: u64 = 64 * BUFFERED_OPS_TOTAL_MAX + 1_000_000;

/// Projector shards at most (`--projector-shards`): a thread each, and
/// every commit is handed to each shard in a part, even an empty one, and
/// joined part by part (`pipeline::shards`): ~1–2 µs of channel work per
/// part, so at 256 parts a commit pays ~0.5 ms, under the WAL sync and
/// write it waits for anyway. A shard per four cores (the default) is 64
/// on a 256-core machine.
pub const PROJECTOR_SHARDS_MAX: usize = 256;

/// Once this share of `connections_max` (percent) is open, a new QUIC
/// connection whose address is not yet validated is answered with a Retry
/// instead of a slot: the client comes back with a token proving it receives
/// what is sent to its address, one round trip later (quinn's client follows
/// a Retry by itself). Half: spoofed Initials can then hold at most half the
/// slots, each for one handshake timeout, while the other half (the slots
/// kept for peers among them) go only to addresses that answered; below it
/// no client pays the extra round trip.
pub const CONNECTIONS_RETRY_FROM_PERCENT: u32 = 50;

/// Connection slots kept for each configured peer address, which only a
/// connection from that address may take: two, its link and a redial that
/// overlaps the old link until the old one's idle timeout frees its slot.
pub const PEER_SLOTS_PER_PEER: u32 = 2;

/// The most of `connections_max` (percent) kept for peers, however many are
/// configured: a quarter, so clients always keep three quarters. With the
/// Retry threshold this keeps every reserved slot behind a Retry, so a
/// spoofed peer address cannot take them (asserted below).
pub const PEER_SLOTS_PERCENT_MAX: u32 = 25;

/// Subscriptions one connection may hold at once (the node holds at most
/// 4,096, `node::hub::SUBSCRIPTIONS_MAX`). A client uses one stream per
/// subscription and a connection has at most `streams_per_connection_max`
/// streams open (default 32), so at the defaults that binds first; this
/// bound keeps one connection to 1/64 of the node's slots when the stream
/// limit is raised. A client following more scopes opens a connection more.
pub const SUBSCRIPTIONS_PER_CONNECTION_MAX: u32 = 64;
/// Subscriptions one proven key (a member or a configured peer) may hold
/// at once over all its connections: a key cannot hold the node's slots
/// through many connections. 256 lets one user follow 256 scopes (the full
/// subscribers flood holds 126 under one key); filling the node's 4,096
/// takes 16 keys, each a member of a held scope or a configured peer.
pub const SUBSCRIPTIONS_PER_KEY_MAX: u32 = 256;
/// Bytes of events queued for one subscriber (besides its 4,096 events,
/// `node::hub::SUBSCRIBER_QUEUE_EVENTS_MAX`); over it the subscriber is
/// dropped as lagging, like one whose queue is full. Events of up to 256 KiB
/// could otherwise queue 1 GiB per subscriber. 4 MiB holds four maximum
/// frames (an event always fits an empty queue) and 4,096 events of 1 KiB,
/// so a reader of typical events (a few hundred bytes) meets the event bound
/// first; over the node's 4,096 subscribers, at most 16 GiB in the worst case.
pub const SUBSCRIBER_QUEUE_BYTES_MAX: u64 = 4 << 20;
/// Bytes of ops one sync reply collects (besides `SYNC_OPS_MAX` ops); the
/// rest is asked for again (the requester's buffered ops name their missing
/// parents). A reply is collected under one of the node's two sync permits
/// and sent after it is released, one at a time per connection, so what
/// waits for a slow reader is this many bytes per connection: 4 MiB is
/// 4,096 ops of 1 KiB, and at the default 256 connections at most 1 GiB
/// where two replies of 4,096 ops of 256 KiB could hold 2 GiB before.
pub const SYNC_REPLY_BYTES_MAX: u64 = 4 << 20;

/// API.md, "Encoding": a request body over 1 MiB is refused (413). A frame
/// is at most 1 MiB too, so nothing the API writes needs more.
pub const API_BODY_BYTES_MAX: usize = 1 << 20;
/// API.md: the bearer token is 32 random bytes (256 bits: not guessable).
pub const API_TOKEN_BYTES: usize = 32;
/// The API's event streams (Server-Sent Events) open at once. Each holds a
/// connection (`api::API_CONNECTIONS_MAX` leaves room beside them) and one
/// of the hub's subscriptions (`node::hub::SUBSCRIPTIONS_MAX`, shared with
/// the QUIC subscribers); an application follows a few scopes, each with a
/// stream or two. Past it a stream is refused (503), retryable.
pub const API_EVENT_STREAMS_MAX: usize = 128;
/// Items one listing page holds at most (API.md: `limit` at most 1000):
/// 1,000 cells of up to a few KiB read in one blocking task and one
/// response of a few MiB at most. A larger `limit` is 400.
pub const API_ITEMS_PAGE_MAX: usize = 1000;
/// Items a listing page holds when `limit` is not given (API.md).
pub const API_ITEMS_PAGE_DEFAULT: usize = 100;
/// Entities one `GET .../entities` page holds at most, for the same reason;
/// past it the answer carries `next_after` to ask for the rest.
pub const API_ENTITIES_PAGE_MAX: usize = 1000;

const _: () = assert!(OP_PAYLOAD_BYTES_MAX < FRAME_BYTES_MAX);
const _: () = assert!(BUFFERED_OPS_PER_SCOPE_MAX >= 10_000);
const _: () = assert!(BUFFERED_BYTES_PER_SCOPE_MAX >= 64 << 20);
const _: () = assert!(BUFFERED_OPS_TOTAL_MAX >= BUFFERED_OPS_PER_SCOPE_MAX);
const _: () = assert!(BUFFERED_BYTES_TOTAL_MAX >= BUFFERED_BYTES_PER_SCOPE_MAX);
const _: () = assert!(CONNECTIONS_RETRY_FROM_PERCENT + PEER_SLOTS_PERCENT_MAX <= 100);
const _: () = assert!(SUBSCRIBER_QUEUE_BYTES_MAX >= 4 * FRAME_BYTES_MAX as u64);
const _: () = assert!(SYNC_REPLY_BYTES_MAX >= FRAME_BYTES_MAX as u64);
const _: () = assert!(SUBSCRIPTIONS_PER_CONNECTION_MAX <= SUBSCRIPTIONS_PER_KEY_MAX);
const _: () = assert!(API_BODY_BYTES_MAX >= FRAME_BYTES_MAX as usize);
const _: () = assert!(API_ITEMS_PAGE_DEFAULT <= API_ITEMS_PAGE_MAX);
