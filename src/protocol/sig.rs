//! Ed25519 signature validity, exactly as SPEC §1 defines it, one at a time
//! and in batches.
//!
//! A signature `(R, S)` by key `A` on message `M` is valid iff
//!
//! 1. `S < L` (the scalar is canonical);
//! 2. `A` and `R` are canonical point encodings (decompressing and compressing
//!    again gives back the same 32 bytes);
//! 3. neither `A` nor `R` is of small order (`[8]P` is not the identity);
//! 4. the **cofactored** equation `[8][S]B = [8]R + [8][k]A` holds, with
//!    `k = SHA-512(R || A || M) mod L`.
//!
//! # Why the cofactored equation
//!
//! A point of the curve is `P = P' + T`, with `P'` in the prime-order subgroup
//! and `T` one of the eight torsion points. The cofactorless equation
//! `[S]B = R + [k]A` also tests the torsion components of `R` and `A`, and a
//! random-linear-combination batch check `Σ z_i([S_i]B - R_i - [k_i]A_i) = 0`
//! cannot test them consistently: a torsion residue `T_i` is multiplied by
//! `z_i`, and whether `Σ z_i·T_i` vanishes depends on the coefficients, i.e.
//! on what else happened to be in the batch. Multiplying by the cofactor 8
//! kills every torsion component, in the single check and in the batch alike,
//! so the batch verdict is a function of each signature alone (ZIP-215's
//! reasoning, and SPEC §1's rule): no node can reach a verdict that depends on
//! how its pipeline grouped the operations. The canonical and small-order
//! tests come on top of the equation, per item, in both paths.
//!
//! Signing is plain RFC 8032 (through `ed25519-dalek`); honest signatures
//! pass every Ed25519 verifier, this one included.

use std::collections::HashMap;
use std::ops::Range;

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::IsIdentity;
use ed25519_dalek::{Signer as _, SigningKey};
use sha2::{Digest, Sha512};

use super::edwards_lanes;
use super::sha512_lanes::{self, Block};
use super::idhash::IdState;

/// Maps keyed by public keys, with the hasher of the node's id maps.
type KeyMap<V> = HashMap<[u8; 32], V, IdState>;

/// An Ed25519 public key, as its 32-byte encoding (SPEC §2).
pub type PublicKey = [u8; 32];

/// Domain separation of the Fiat-Shamir transcript that derives the batch
/// coefficients.
const BATCH_TRANSCRIPT_DOMAIN: &[u8] = b"dagfold/sig/batch-coefficients/v2";

/// SPEC §1 validity of `signature` by `public_key` over the 32-byte `message`
/// (a `delta_id`): `S < L`; `A` and `R` canonical; neither of small order;
/// cofactored equation `[8][S]B = [8]R + [8][k]A`, `k = SHA-512(R||A||M) mod L`.
///
/// The cofactored equation is used (rather than `[S]B = R + [k]A`) so that
/// this verdict and the one of [`verify_batch`] agree on every input.
pub fn verify(public_key: &[u8; 32], message: &[u8; 32], signature: &[u8; 64]) -> bool {
    verify_message(public_key, message, signature)
}

/// [`verify`] for a message of any length (the protocol only signs 32-byte
/// ids; this form exists for generic test suites such as Wycheproof).
pub fn verify_message(public_key: &[u8; 32], message: &[u8], signature: &[u8; 64]) -> bool {
    match Prepared::new(public_key, message, signature) {
        Some(p) => cofactored_equation_holds(&p.minus_a, &p.r, &p.s, &p.k),
        None => false,
    }
}

/// Verdicts for many signatures at once: `result[i] == verify(items[i])` for
/// every input, whatever else is in the batch. Items are
/// `(public_key, message, signature)`.
///
/// Items that pass the per-item tests (`S < L`, canonical, not small order)
/// are checked together by one cofactored random linear combination,
/// `[8](Σ z_i([S_i]B - R_i - [k_i]A_i)) = 0`, computed as a single
/// variable-time multiscalar multiplication. If it fails, the batch is
/// bisected while the failures stay in one half, and falls back to single
/// checks (on the already decoded points) where both halves fail. Because of
/// the cofactor the combination of valid items is exactly the identity for
/// any coefficients, so a valid signature is never rejected; an invalid one is
/// accepted only if the coefficients happen to cancel its residue, which for
/// a given batch happens with probability about 2^-128 (the coefficients are
/// 128-bit and invertible modulo `L`).
///
/// The coefficients `z_i` are derived deterministically (Fiat-Shamir) from a
/// SHA-512 hash of every item in the batch, so the engine stays deterministic
/// and no one can choose an invalid signature's residue after seeing them.
pub fn verify_batch(items: &[([u8; 32], [u8; 32], [u8; 64])]) -> Vec<bool> {
    verify_batch_messages(items)
}

/// [`verify_batch`] for messages of any length: `result[i] ==
/// verify_message(items[i])` for every input.
pub fn verify_batch_messages<M: AsRef<[u8]>>(items: &[([u8; 32], M, [u8; 64])]) -> Vec<bool> {
    let mut verdicts = vec![false; items.len()];
    if items.len() == 1 {
        let (pk, msg, sig) = &items[0];
        verdicts[0] = verify_message(pk, msg.as_ref(), sig);
        return verdicts;
    }

    let (entries, minus_keys) = batch_entries(items);
    let batch = Batch {
        entries: &entries,
        minus_keys: &minus_keys,
    };
    let mut scratch = Scratch::default();
    if batch.holds(0..entries.len(), &mut scratch) {
        for e in &entries {
            verdicts[e.index] = true;
        }
    } else {
        batch.isolate(0..entries.len(), &mut verdicts, &mut scratch);
    }
    verdicts
}

/// Each distinct key's slot in the negated decoded keys (None: it fails
/// `decode_point`'s tests), and those keys. A key seen lately comes from
/// `cache`; the others that pass the tests on the bytes are decompressed in
/// one call, eight at a time where the CPU allows: a batch from many
/// authors has as many keys as signatures (authors_1k, scopes_10k), and
/// dalek's one-at-a-time decompression was as costly as the batch's `R`s
/// were before theirs went eight at a time.
fn decode_keys<'a>(cache: &KeyCache, keys: impl Iterator<Item = &'a [u8; 32]>) -> (KeyMap<Option<usize>>, Vec<EdwardsPoint>) {
    let mut slots: KeyMap<Option<usize>> = KeyMap::default();
    let mut minus_keys: Vec<EdwardsPoint> = Vec::new();
    let mut testable: Vec<[u8; 32]> = Vec::new();
    let mut misses = 0;
    for pk in keys {
        if slots.contains_key(pk) {
            continue;
        }
        let found = cache.get(pk);
        misses += u64::from(found.is_none());
        let slot = match found {
            Some(Some(minus)) => {
                minus_keys.push(minus);
                Some(minus_keys.len() - 1)
            }
            Some(None) => None,
            None => {
                if passes_encoding_tests(pk) {
                    testable.push(*pk);
                } else {
                    cache.insert(*pk, None);
                }
                None
            }
        };
        slots.insert(*pk, slot);
    }
    for (pk, point) in testable.iter().zip(edwards_lanes::decompress_many(&testable)) {
        let minus = point.map(|a| -a);
        cache.insert(*pk, minus);
        if let Some(minus) = minus {
            minus_keys.push(minus);
            slots.insert(*pk, Some(minus_keys.len() - 1));
        }
    }
    // Counted once per batch: the counters are shared by every verifier.
    cache.count(slots.len() as u64 - misses, misses);
    (slots, minus_keys)
}

/// The node's decompressed keys, shared by every verifying thread.
static KEYS: std::sync::LazyLock<KeyCache> = std::sync::LazyLock::new(|| KeyCache::new(crate::limits::KEY_CACHE_MAX));

/// Hits and misses of the node's key cache since the start (the verifiers
/// publish them as `dagfold_key_cache_{hits,misses}_total`).
pub fn key_cache_counts() -> (u64, u64) {
    KEYS.counts()
}

/// Bytes of memory the node's key cache holds (its maps' slots), for the
/// memory gauges.
pub fn key_cache_bytes() -> u64 {
    let slot = std::mem::size_of::<([u8; 32], Option<EdwardsPoint>)>() + 1;
    KEYS.shards
        .iter()
        .map(|s| {
            let g = s.lock().unwrap_or_else(|p| p.into_inner());
            ((g.newer.capacity() + g.older.capacity()) * slot) as u64
        })
        .sum()
}

/// Shards of a `KeyCache`, chosen by a key's first byte: a verifier holds
/// one shard's lock for one lookup or insert, so many verifiers rarely meet.
const KEY_CACHE_SHARDS: usize = 16;

/// Negated decompressed keys of the batches verified lately (`None`: the
/// key fails `decode_point`'s tests), so that an author's key is
/// decompressed once, not once per batch: in `authors_1k` each of a batch's
/// ~60 keys was decompressed again, half the batch's decompressions. A pure
/// function's results, so it changes no verdict.
///
/// One cache for all verifying threads, its size the node's and not a
/// multiple of its cores: with a cache per thread, each thread saw every
/// key, and in `scopes_10k` (50,000 keys, each signing a few times far
/// apart) 89% of lookups missed (a replay of its key sequence, batches of
/// 512 on two threads); one shared cache of 114,688 keys misses only each
/// key's first use (25%).
///
/// Each shard keeps two generations of at most `max / 2 / KEY_CACHE_SHARDS`
/// keys: when the newer fills, the older is dropped and the newer takes its
/// place; a key found in the older moves to the newer. So a key used within
/// the last `max / 2 / KEY_CACHE_SHARDS` distinct keys of its shard is
/// found, whatever keys an attacker adds.
struct KeyCache {
    shards: Vec<std::sync::Mutex<Generations>>,
    /// Keys per generation of one shard.
    generation: usize,
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Generations {
    newer: KeyMap<Option<EdwardsPoint>>,
    older: KeyMap<Option<EdwardsPoint>>,
}

impl KeyCache {
    fn new(max: usize) -> KeyCache {
        KeyCache {
            shards: (0..KEY_CACHE_SHARDS).map(|_| Default::default()).collect(),
            generation: (max / 2 / KEY_CACHE_SHARDS).max(1),
            hits: Default::default(),
            misses: Default::default(),
        }
    }

    fn shard(&self, key: &[u8; 32]) -> std::sync::MutexGuard<'_, Generations> {
        // A panic elsewhere while the lock was held leaves entries that are
        // each a complete decompression: still good.
        self.shards[key[0] as usize % KEY_CACHE_SHARDS].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: &[u8; 32]) -> Option<Option<EdwardsPoint>> {
        let mut g = self.shard(key);
        match g.newer.get(key) {
            Some(v) => Some(*v),
            None => g.older.remove(key).inspect(|v| g.insert(*key, *v, self.generation)),
        }
    }

    /// Adds a batch's lookups to the counts.
    fn count(&self, hits: u64, misses: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.hits.fetch_add(hits, Relaxed);
        self.misses.fetch_add(misses, Relaxed);
    }

    fn insert(&self, key: [u8; 32], value: Option<EdwardsPoint>) {
        self.shard(&key).insert(key, value, self.generation);
    }

    fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }

    /// Keys held, in all shards.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map_or(0, |g| g.newer.len() + g.older.len())).sum()
    }
}

impl Generations {
    fn insert(&mut self, key: [u8; 32], value: Option<EdwardsPoint>, generation: usize) {
        if self.newer.len() >= generation {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(key, value);
    }
}

/// The items of a batch that pass the per-item tests, decoded, with their
/// coefficients, sorted by key; and the negated decoded keys.
fn batch_entries<M: AsRef<[u8]>>(items: &[([u8; 32], M, [u8; 64])]) -> (Vec<Entry>, Vec<EdwardsPoint>) {
    let digests = challenge_digests(items);
    let coefficients = batch_coefficients(items, &digests);

    // Per-item tests. Keys are decoded once per distinct key, and the entries
    // are sorted by key so that the signatures of one key form contiguous runs:
    // any sub-range then folds each run into a single multiscalar term.
    let (key_slots, minus_keys) = decode_keys(&KEYS, items.iter().map(|(pk, _, _)| pk));
    // The tests on the bytes first; then every `R` that passed them is
    // decompressed in one call (eight at a time where the CPU allows).
    let mut passed: Vec<(usize, usize, Scalar)> = Vec::with_capacity(items.len());
    for (index, (pk, _, sig)) in items.iter().enumerate() {
        let Some(key) = key_slots[pk] else { continue };
        let Some(s) = decode_s(sig) else { continue };
        if !passes_encoding_tests(sig[..32].try_into().expect("64-byte signature")) {
            continue;
        }
        passed.push((index, key, s));
    }
    // In key order (stable: by index within a key) before the entries are
    // made, rather than the entries after: an entry is ~300 bytes, and
    // sorting them was most of the verifier's memmove.
    passed.sort_by_key(|p| p.1);
    let r_bytes: Vec<[u8; 32]> =
        passed.iter().map(|(index, _, _)| items[*index].2[..32].try_into().expect("64-byte signature")).collect();
    let mut entries: Vec<Entry> = Vec::with_capacity(passed.len());
    for ((index, key, s), r) in passed.into_iter().zip(edwards_lanes::decompress_many(&r_bytes)) {
        let Some(r) = r else { continue };
        let k = Scalar::from_bytes_mod_order_wide(&digests[index]);
        entries.push(Entry {
            index,
            key,
            r,
            s,
            k,
            z: coefficients[index],
        });
    }
    (entries, minus_keys)
}

/// Sign a 32-byte message with a 32-byte Ed25519 seed (RFC 8032), for tools
/// and tests.
pub fn sign(seed: &[u8; 32], message: &[u8; 32]) -> [u8; 64] {
    Signer::new(seed).sign(message)
}

/// A signing key kept expanded, for a node that signs many ops (its API's
/// writes): `sign` above derives the public key again on every call, a
/// second scalar multiplication as costly as the signature's own.
pub struct Signer {
    key: SigningKey,
    expanded: ed25519_dalek::hazmat::ExpandedSecretKey,
}

impl Signer {
    pub fn new(seed: &[u8; 32]) -> Signer {
        Signer { key: SigningKey::from_bytes(seed), expanded: ed25519_dalek::hazmat::ExpandedSecretKey::from(seed) }
    }

    /// The signature of RFC 8032 on a 32-byte message, as `sign` makes it.
    pub fn sign(&self, message: &[u8; 32]) -> [u8; 64] {
        self.key.sign(message).to_bytes()
    }

    /// `sign` of each message, in order, with the `R`s computed together
    /// (`edwards_lanes::mul_base_many`: eight `[r]B` at once in the lanes of
    /// AVX-512 IFMA, and one field inversion for the eight). RFC 8032's steps as
    /// ed25519-dalek takes them: `r = SHA-512(prefix || M)`, `R = [r]B`,
    /// `k = SHA-512(R || A || M)`, `S = r + k·a`; the signatures are
    /// deterministic, and the tests compare them with `sign`'s bytes.
    pub fn sign_many(&self, messages: &[[u8; 32]]) -> Vec<[u8; 64]> {
        let wide = |blocks: Vec<Block>| {
            let mut hashes = Vec::with_capacity(blocks.len());
            sha512_lanes::digests(&blocks, &mut hashes);
            hashes.iter().map(Scalar::from_bytes_mod_order_wide).collect::<Vec<Scalar>>()
        };
        let rs = wide(messages.iter().map(|m| Block::of(&[&self.expanded.hash_prefix, m]).expect("64 bytes")).collect());
        let encodings = super::edwards_lanes::mul_base_many(&rs);
        let public = self.key.verifying_key().to_bytes();
        let ks = wide(messages.iter().zip(&encodings).map(|(m, big_r)| Block::of(&[big_r, &public, m]).expect("96 bytes")).collect());
        messages
            .iter()
            .zip(rs)
            .zip(encodings)
            .zip(ks)
            .map(|(((_, r), big_r), k)| {
                let s = k * self.expanded.scalar + r;
                let mut sig = [0u8; 64];
                sig[..32].copy_from_slice(&big_r);
                sig[32..].copy_from_slice(s.as_bytes());
                sig
            })
            .collect()
    }
}

/// The Ed25519 public key of a 32-byte seed (RFC 8032).
pub fn public_key_from_seed(seed: &[u8; 32]) -> [u8; 32] {
    SigningKey::from_bytes(seed).verifying_key().to_bytes()
}

/// The canonical-encoding test of SPEC §1, decided on the bytes alone: true
/// iff decompressing `bytes` (when it decodes) and compressing the point again
/// would give back `bytes`.
///
/// Decompression reads `y` from the low 255 bits modulo `p = 2^255 - 19` and
/// gives `x` the parity of the sign bit, except that `x = 0` has no negative.
/// So the round trip changes the bytes exactly when `y >= p`, or when the sign
/// bit is set on a point with `x = 0`, i.e. `y = 1` (the identity) or
/// `y = p - 1` (the point of order 2). This saves the field inversion of a
/// compression per point; `tests/signatures.rs` checks the equivalence.
pub fn is_canonical_encoding(bytes: &[u8; 32]) -> bool {
    // The low 255 bits are p + c for some 0 <= c < 19, or equal p - 1, only
    // if bits 8 to 254 (all but the low byte and the sign bit) are ones.
    let high_all_ones = bytes[1..31].iter().all(|&b| b == 0xff) && bytes[31] & 0x7f == 0x7f;
    // y >= p = 0x7fff..ffed
    if high_all_ones && bytes[0] >= 0xed {
        return false;
    }
    if bytes[31] & 0x80 != 0 {
        let y_is_one = bytes[0] == 1 && bytes[1..31].iter().all(|&b| b == 0) && bytes[31] == 0x80;
        let y_is_minus_one = high_all_ones && bytes[0] == 0xec;
        if y_is_one || y_is_minus_one {
            return false;
        }
    }
    true
}

/// Decode a point that passes the encoding tests of SPEC §1: it decompresses,
/// its encoding is canonical, and it is not of small order.
fn decode_point(bytes: &[u8; 32]) -> Option<EdwardsPoint> {
    if !passes_encoding_tests(bytes) {
        return None;
    }
    CompressedEdwardsY(*bytes).decompress()
}

/// SPEC §1's tests of a point's bytes, before it is decompressed: the
/// encoding is canonical and not one of a small-order point.
fn passes_encoding_tests(bytes: &[u8; 32]) -> bool {
    is_canonical_encoding(bytes) && !is_small_order_encoding(bytes)
}

/// The small-order test of SPEC §1 on a canonical encoding, decided on the
/// bytes: a canonical encoding is the compression of the point it decodes
/// to, and compression is one-to-one, so the point is one of the eight
/// torsion points iff the bytes are one of their eight encodings. This
/// saves three doublings and a comparison per point (about as long as the
/// IFMA decompression itself); `tests/signatures.rs` checks the equivalence.
pub fn is_small_order_encoding(bytes: &[u8; 32]) -> bool {
    static ENCODINGS: std::sync::OnceLock<[[u8; 32]; 8]> = std::sync::OnceLock::new();
    ENCODINGS
        .get_or_init(|| curve25519_dalek::constants::EIGHT_TORSION.map(|t| t.compress().to_bytes()))
        .contains(bytes)
}

/// `S` of a signature, if it is canonical (`< L`).
fn decode_s(signature: &[u8; 64]) -> Option<Scalar> {
    let mut s_bytes = [0u8; 32];
    s_bytes.copy_from_slice(&signature[32..]);
    Option::<Scalar>::from(Scalar::from_canonical_bytes(s_bytes))
}

/// `R` (decoded per [`decode_point`]) and `S` (`< L`) of a signature.
fn decode_r_and_s(signature: &[u8; 64]) -> Option<(EdwardsPoint, Scalar)> {
    let s = decode_s(signature)?;
    let mut r_bytes = [0u8; 32];
    r_bytes.copy_from_slice(&signature[..32]);
    let r = decode_point(&r_bytes)?;
    Some((r, s))
}

/// `SHA-512(R || A || M)` of every item, in order, whose reduction modulo
/// `L` is its `challenge`: those that are one block (a 32-byte message,
/// as every op's id) hashed eight at a time (`sha512_lanes`).
fn challenge_digests<M: AsRef<[u8]>>(items: &[([u8; 32], M, [u8; 64])]) -> Vec<[u8; 64]> {
    let mut digests = Vec::with_capacity(items.len());
    let mut blocks: Vec<Block> = Vec::with_capacity(items.len());
    for (pk, msg, sig) in items {
        match Block::of(&[&sig[..32], pk, msg.as_ref()]) {
            Some(b) => blocks.push(b),
            None => {
                // A long message: the blocks before it first, in order.
                sha512_lanes::digests(&blocks, &mut digests);
                blocks.clear();
                digests.push(challenge_digest(&sig[..32], pk, msg.as_ref()));
            }
        }
    }
    sha512_lanes::digests(&blocks, &mut digests);
    digests
}

/// `k = SHA-512(R || A || M) mod L`, over the encodings as received.
fn challenge(r_bytes: &[u8], public_key: &[u8; 32], message: &[u8]) -> Scalar {
    Scalar::from_bytes_mod_order_wide(&challenge_digest(r_bytes, public_key, message))
}

/// `SHA-512(R || A || M)`, one message at a time.
fn challenge_digest(r_bytes: &[u8], public_key: &[u8; 32], message: &[u8]) -> [u8; 64] {
    Sha512::new().chain_update(r_bytes).chain_update(public_key).chain_update(message).finalize().into()
}

/// `[8]([S]B - [k]A - R) == identity`, given `-A`.
fn cofactored_equation_holds(
    minus_a: &EdwardsPoint,
    r: &EdwardsPoint,
    s: &Scalar,
    k: &Scalar,
) -> bool {
    // [k](-A) + [S]B, with the precomputed basepoint table.
    let sb_minus_ka = EdwardsPoint::vartime_double_scalar_mul_basepoint(k, minus_a, s);
    (sb_minus_ka - r).mul_by_cofactor().is_identity()
}

/// One signature that passed the per-item tests, ready for the equation.
struct Prepared {
    minus_a: EdwardsPoint,
    r: EdwardsPoint,
    s: Scalar,
    k: Scalar,
}

impl Prepared {
    fn new(public_key: &[u8; 32], message: &[u8], signature: &[u8; 64]) -> Option<Self> {
        let (r, s) = decode_r_and_s(signature)?;
        let a = decode_point(public_key)?;
        let k = challenge(&signature[..32], public_key, message);
        Some(Prepared {
            minus_a: -a,
            r,
            s,
            k,
        })
    }
}

/// The 128-bit coefficients `z_i`, one per item, derived from a SHA-512 hash
/// of the whole batch: `seed = SHA-512(domain || n || for each item: the
/// first 32 bytes of its challenge digest SHA-512(R || A || M) || S)`, then
/// `SHA-512(seed || j)` (`j` a u64 block counter) gives the coefficients of
/// items `4j..4j+4`, 16 bytes each, read little-endian. A zero coefficient
/// (probability 2^-128) is replaced by 1, so every coefficient is invertible
/// modulo `L`.
///
/// The seed binds each item's `R`, `A` and `M` through its digest (`R` and
/// `A` are 32 bytes each, so `R || A || M` is read one way only), cut to
/// 256 bits: finding two items of one cut digest costs 2^128, the batch's
/// own bound. The digests are computed eight at a time for the challenges
/// anyway; the transcript then hashes 64 bytes per item where it hashed
/// the item's 136 (`sha512_lanes`, 2026-12-06).
fn batch_coefficients<M: AsRef<[u8]>>(items: &[([u8; 32], M, [u8; 64])], digests: &[[u8; 64]]) -> Vec<Scalar> {
    let mut transcript = Sha512::new();
    transcript.update(BATCH_TRANSCRIPT_DOMAIN);
    transcript.update((items.len() as u64).to_le_bytes());
    for ((_, _, sig), digest) in items.iter().zip(digests) {
        transcript.update(&digest[..32]);
        transcript.update(&sig[32..]);
    }
    let seed = transcript.finalize();

    let blocks: Vec<Block> = (0..items.len().div_ceil(4) as u64)
        .map(|j| Block::of(&[seed.as_slice(), &j.to_le_bytes()]).expect("72 bytes: one block"))
        .collect();
    let mut hashes = Vec::with_capacity(blocks.len());
    sha512_lanes::digests(&blocks, &mut hashes);
    let mut coefficients = Vec::with_capacity(items.len());
    for out in hashes {
        for chunk in out.chunks_exact(16) {
            if coefficients.len() == items.len() {
                break;
            }
            let mut bytes = [0u8; 32];
            bytes[..16].copy_from_slice(chunk);
            if bytes == [0u8; 32] {
                bytes[0] = 1;
            }
            coefficients.push(Scalar::from_bytes_mod_order(bytes));
        }
    }
    coefficients
}

/// `Σ z_i·x_i mod L` for 128-bit coefficients `z_i` (`batch_coefficients`)
/// and scalars `x_i`, the products summed as integers and reduced once.
/// Each product is below 2^381 (2^128 · 2^253), so the 448 bits hold
/// 2^67 of them; dalek's `z * x` reduced every product, two Montgomery
/// reductions each, and with the additions was ~9% of a verifier's thread
/// in `causal`.
#[derive(Default)]
struct WideSum([u64; 7]);

impl WideSum {
    fn add_product(&mut self, z: &Scalar, x: &Scalar) {
        let zb = z.as_bytes();
        debug_assert!(zb[16..].iter().all(|&b| b == 0), "a coefficient is 128 bits");
        let limb = |b: &[u8; 32], i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("eight bytes"));
        let xb = x.as_bytes();
        let xs = [limb(xb, 0), limb(xb, 1), limb(xb, 2), limb(xb, 3)];
        for i in 0..2 {
            let zi = u128::from(limb(zb, i));
            let mut carry: u128 = 0;
            for (j, xj) in xs.iter().enumerate() {
                let t = zi * u128::from(*xj) + u128::from(self.0[i + j]) + carry;
                self.0[i + j] = t as u64;
                carry = t >> 64;
            }
            let mut k = i + 4;
            while carry != 0 {
                let t = u128::from(self.0[k]) + carry;
                self.0[k] = t as u64;
                carry = t >> 64;
                k += 1;
            }
        }
    }

    fn reduce(&self) -> Scalar {
        let mut wide = [0u8; 64];
        for (w, l) in wide.chunks_exact_mut(8).zip(self.0) {
            w.copy_from_slice(&l.to_le_bytes());
        }
        Scalar::from_bytes_mod_order_wide(&wide)
    }
}

/// A batch entry: an item that passed the per-item tests.
struct Entry {
    /// Position of the item in the caller's slice.
    index: usize,
    /// Slot of its key in [`Batch::minus_keys`].
    key: usize,
    r: EdwardsPoint,
    s: Scalar,
    k: Scalar,
    /// Its coefficient in the random linear combination.
    z: Scalar,
}

/// Reusable buffers for the multiscalar multiplications of one batch.
#[derive(Default)]
struct Scratch {
    scalars: Vec<Scalar>,
    points: Vec<EdwardsPoint>,
}

/// Entries sorted by key slot, and the negated decoded keys.
struct Batch<'a> {
    entries: &'a [Entry],
    minus_keys: &'a [EdwardsPoint],
}

impl Batch<'_> {
    /// Whether the cofactored combination over `range` is the identity:
    /// `[8]([Σ z_i S_i]B + Σ_keys [Σ z_i k_i](-A) + Σ [z_i](-R_i)) == 0`.
    ///
    /// For one entry this is exactly its single check (its `z` is invertible
    /// modulo `L`, and `[8]` of the residue lies in the prime-order subgroup),
    /// so the cheaper double-base multiplication is used.
    fn holds(&self, range: Range<usize>, scratch: &mut Scratch) -> bool {
        let entries = &self.entries[range];
        match entries {
            [] => return true,
            [e] => return cofactored_equation_holds(&self.minus_keys[e.key], &e.r, &e.s, &e.k),
            _ => {}
        }
        let Scratch { scalars, points } = scratch;
        scalars.clear();
        points.clear();

        // The basepoint term, combined into one coefficient. Each `R` goes
        // in negated with its 128-bit `z`, not as is with `-z`: `-z` is a
        // full-width scalar, while the multiscalar multiplication skips a
        // scalar's zero digits, so a 128-bit one costs half the bucket
        // additions (these terms are all but two or three of the batch).
        // The coefficients' sums of products are summed unreduced and
        // reduced once (`WideSum`).
        let mut b_coefficient = WideSum::default();
        for e in entries {
            b_coefficient.add_product(&e.z, &e.s);
            scalars.push(e.z);
            points.push(-e.r);
        }
        scalars.push(b_coefficient.reduce());
        points.push(ED25519_BASEPOINT_POINT);

        // One term per run of entries that share a key.
        let mut run = entries[0].key;
        let mut a_coefficient = WideSum::default();
        for e in entries {
            if e.key != run {
                scalars.push(a_coefficient.reduce());
                points.push(self.minus_keys[run]);
                run = e.key;
                a_coefficient = WideSum::default();
            }
            a_coefficient.add_product(&e.z, &e.k);
        }
        scalars.push(a_coefficient.reduce());
        points.push(self.minus_keys[run]);

        edwards_lanes::vartime_multiscalar_mul(scalars, points)
            .mul_by_cofactor()
            .is_identity()
    }

    /// Settle the verdicts of a range whose combined check is known to fail.
    ///
    /// Bisect while the failures stay on one side: the residues add up (the
    /// check is linear), so when one half holds, the other is known to fail
    /// without checking it, and a failing single entry is invalid. A range
    /// holding one invalid signature is thus settled in about `log2(n)`
    /// shrinking checks. When both halves fail the range holds several
    /// invalid signatures, bisection would cost more than it saves, and the
    /// entries of both halves get single checks (reusing their decoded
    /// points). So a batch full of invalid signatures costs about one
    /// combined check of each level visited plus the single checks, never
    /// the `n log n` of a full bisection.
    fn isolate(&self, range: Range<usize>, verdicts: &mut [bool], scratch: &mut Scratch) {
        if range.len() <= 1 {
            return; // a failing single entry: its verdict stays false
        }
        let mid = range.start + range.len() / 2;
        let (left, right) = (range.start..mid, mid..range.end);
        if self.holds(left.clone(), scratch) {
            self.accept(left, verdicts);
            self.isolate(right, verdicts, scratch);
        } else if self.holds(right.clone(), scratch) {
            self.accept(right, verdicts);
            self.isolate(left, verdicts, scratch);
        } else {
            // A failing half of one entry is invalid already.
            for half in [left, right].into_iter().filter(|h| h.len() > 1) {
                for e in &self.entries[half] {
                    verdicts[e.index] =
                        cofactored_equation_holds(&self.minus_keys[e.key], &e.r, &e.s, &e.k);
                }
            }
        }
    }

    fn accept(&self, range: Range<usize>, verdicts: &mut [bool]) {
        for e in &self.entries[range] {
            verdicts[e.index] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_made_together_are_those_made_one_by_one() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for n in [0usize, 1, 2, 7, 8, 9, 16, 23] {
            let mut seed = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rng, &mut seed);
            let signer = Signer::new(&seed);
            let messages: Vec<[u8; 32]> = (0..n)
                .map(|_| {
                    let mut m = [0u8; 32];
                    rand::RngCore::fill_bytes(&mut rng, &mut m);
                    m
                })
                .collect();
            let together = signer.sign_many(&messages);
            let alone: Vec<[u8; 64]> = messages.iter().map(|m| signer.sign(m)).collect();
            assert_eq!(together, alone, "{n} messages");
            assert!(messages.iter().zip(&together).all(|(m, s)| verify(&public_key_from_seed(&seed), m, s)));
        }
    }

    /// The unreduced sums agree with dalek's scalar arithmetic, at the
    /// extremes too (every coefficient and scalar at its largest).
    #[test]
    fn sums_of_products_reduced_once_are_those_reduced_each_time() {
        use rand::{RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let largest = Scalar::ZERO - Scalar::ONE; // L - 1
        let mut z_max = [0u8; 32];
        z_max[..16].fill(0xff);
        let z_max = Scalar::from_bytes_mod_order(z_max);
        for n in [1usize, 2, 7, 512, 5000] {
            let mut wide = WideSum::default();
            let mut want = Scalar::ZERO;
            for i in 0..n {
                let (z, x) = if i % 3 == 0 {
                    (z_max, largest)
                } else {
                    let mut zb = [0u8; 32];
                    rng.fill_bytes(&mut zb[..16]);
                    let mut xb = [0u8; 64];
                    rng.fill_bytes(&mut xb);
                    (Scalar::from_bytes_mod_order(zb), Scalar::from_bytes_mod_order_wide(&xb))
                };
                wide.add_product(&z, &x);
                want += z * x;
            }
            assert_eq!(wide.reduce(), want, "{n} products");
        }
    }

    /// Messages of every length in one batch: those whose challenge is one
    /// SHA-512 block (up to 47 bytes) hashed in lanes, the longer ones one
    /// at a time between them, each challenge still its own item's; with a
    /// forgery of either kind the batch fails and isolates just it.
    #[test]
    fn a_batch_of_short_and_long_messages_judges_each_as_alone() {
        let keys: Vec<SigningKey> = (0..5u8).map(|i| SigningKey::from_bytes(&[i + 1; 32])).collect();
        let mut items: Vec<([u8; 32], Vec<u8>, [u8; 64])> = (0..40usize)
            .map(|i| {
                let len = [0, 1, 32, 46, 47, 48, 49, 100, 300][i % 9];
                let msg: Vec<u8> = (0..len).map(|j| (i * 13 + j) as u8).collect();
                let key = &keys[i % keys.len()];
                (key.verifying_key().to_bytes(), msg.clone(), key.sign(&msg).to_bytes())
            })
            .collect();
        assert_eq!(verify_batch_messages(&items), vec![true; items.len()]);
        // A message changed under a long-message item and a short one.
        items[7].1[0] ^= 1; // 100 bytes
        items[11].1[0] ^= 1; // 32 bytes
        let alone: Vec<bool> = items.iter().map(|(pk, m, sig)| verify_message(pk, m, sig)).collect();
        assert_eq!(alone.iter().filter(|v| !**v).count(), 2);
        assert_eq!(verify_batch_messages(&items), alone);
    }

    /// A key seen in an earlier batch, on any thread, is not decompressed
    /// again, one that fails the tests or the curve included, and the
    /// verdicts are the single check's either way; the cache holds at most
    /// its bound however many keys come, and still finds the newest.
    #[test]
    fn keys_are_decompressed_once_within_the_bound() {
        let message = [9u8; 32];
        let mut items: Vec<([u8; 32], [u8; 32], [u8; 64])> = (0..20u8)
            .map(|i| {
                let seed = [i + 1; 32];
                (public_key_from_seed(&seed), message, sign(&seed, &message))
            })
            .collect();
        let off_curve = (0u8..=255)
            .map(|b| {
                let mut k = [0u8; 32];
                k[0] = b;
                k[1] = 1;
                k
            })
            .find(|k| passes_encoding_tests(k) && CompressedEdwardsY(*k).decompress().is_none())
            .expect("a y with no x");
        let non_canonical = [0xff; 32];
        let small_order = curve25519_dalek::constants::EIGHT_TORSION[1].compress().to_bytes();
        let forged = items[0].2;
        for key in [off_curve, non_canonical, small_order] {
            items.push((key, message, forged));
        }
        items.push((items[3].0, [1; 32], items[3].2)); // a repeated key, a wrong message
        let distinct = 23;
        let single: Vec<bool> = items.iter().map(|(k, m, sig)| verify(k, m, sig)).collect();
        assert_eq!(single.iter().filter(|v| **v).count(), 20);

        // The node's cache, through `verify_batch`, on two threads in turn
        // (other tests may use it at the same time: its counts only grow).
        let (hits_before, _) = key_cache_counts();
        let first = std::thread::scope(|s| s.spawn(|| verify_batch(&items)).join().unwrap());
        let again = std::thread::scope(|s| s.spawn(|| verify_batch(&items)).join().unwrap());
        assert_eq!(first, single);
        assert_eq!(again, single);
        assert!(key_cache_counts().0 >= hits_before + distinct, "the second thread found the first's keys");

        // A cache of its own, counted exactly.
        let cache = KeyCache::new(1024);
        let decoded = |cache: &KeyCache| {
            let (slots, minus_keys) = decode_keys(cache, items.iter().map(|(k, _, _)| k));
            let valid: Vec<bool> = items.iter().map(|(k, _, _)| slots[k].is_some()).collect();
            (valid, minus_keys.iter().map(|p| p.compress().to_bytes()).collect::<Vec<_>>())
        };
        let fresh = decoded(&cache);
        assert_eq!(cache.counts(), (0, distinct), "every key decoded once");
        assert_eq!(cache.held(), distinct as usize);
        assert_eq!(decoded(&cache), fresh, "the cache's keys are the ones decoded");
        assert_eq!(cache.counts(), (distinct, distinct), "no key decoded again");
        assert_eq!(fresh.0.iter().filter(|v| **v).count(), 21, "only the three bad keys' items fail");

        // Many more keys than the bound, spread over the shards: the cache
        // holds no more than it, and the newest keys are still found while
        // the first batch's are gone.
        let mut key = [0u8; 32];
        for i in 0..8 * 1024u32 {
            key[..4].copy_from_slice(&i.to_le_bytes());
            decode_keys(&cache, [key].iter());
        }
        let held = cache.held();
        assert!(held <= 1024, "{held} keys held");
        assert!(held >= 1024 / 2, "{held} keys held");
        let (hits, misses) = cache.counts();
        decode_keys(&cache, [key].iter());
        assert_eq!(cache.counts(), (hits + 1, misses));
        decode_keys(&cache, [items[0].0].iter());
        assert_eq!(cache.counts(), (hits + 1, misses + 1));
    }

    /// The combined check of a batch holds at once for honest signatures
    /// (a wrong combination would still give right verdicts, through the
    /// bisection down to single checks, only many times slower), and fails
    /// with one forgery among them.
    #[test]
    fn an_honest_batch_holds_at_once_and_one_forgery_fails_it() {
        let items: Vec<([u8; 32], [u8; 32], [u8; 64])> = (0..64u8)
            .map(|i| {
                let seed = [i % 4 + 1; 32];
                let msg = [i; 32];
                (public_key_from_seed(&seed), msg, sign(&seed, &msg))
            })
            .collect();
        let (entries, minus_keys) = batch_entries(&items);
        assert_eq!(entries.len(), 64);
        let batch = Batch { entries: &entries, minus_keys: &minus_keys };
        assert!(batch.holds(0..entries.len(), &mut Scratch::default()));
        assert!(batch.holds(3..40, &mut Scratch::default()));
        let mut forged = items.clone();
        forged[17].1[0] ^= 1;
        let (entries, minus_keys) = batch_entries(&forged);
        let batch = Batch { entries: &entries, minus_keys: &minus_keys };
        assert!(!batch.holds(0..entries.len(), &mut Scratch::default()));
        assert_eq!(verify_batch(&forged).iter().filter(|v| !**v).count(), 1);
    }
}
