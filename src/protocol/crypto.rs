//! Hashing, ids, payload sealing (SPEC §1, §3, §4) and key delivery (§9).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};

use super::types::*;

pub const OP_DOMAIN: &[u8] = b"dagfold/op/v1";
pub const PAYLOAD_DOMAIN: &[u8] = b"dagfold/payload/v1";
pub const CELL_DOMAIN: &[u8] = b"dagfold/cell/v1";
pub const WRAP_DOMAIN: &[u8] = b"dagfold/wrap/v1";

pub fn sha256(data: &[u8]) -> Hash {
    Sha256::digest(data).into()
}

pub fn sha256_parts(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// `H(tag || a || b)`: one tag byte and two hashes, 65 bytes, so exactly
/// two blocks, fed straight to the compression function. The sparse Merkle
/// tree's leaf and branch hashes (SPEC §8) are all of this shape and were a
/// quarter of the engine's thread in a reversed chain; the generic hasher
/// spent part of that on buffering and padding.
pub fn sha256_tag_pair(tag: u8, a: &Hash, b: &Hash) -> Hash {
    use sha2::digest::generic_array::GenericArray;
    let [b0, b1] = tag_pair_blocks(tag, a, b);
    let mut state = SHA256_IV;
    sha2::compress256(&mut state, &[GenericArray::from(b0), GenericArray::from(b1)]);
    state_bytes(&state)
}

pub(crate) const SHA256_IV: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// The two padded blocks of `tag || a || b` (65 bytes, length 520 bits).
pub(crate) fn tag_pair_blocks(tag: u8, a: &Hash, b: &Hash) -> [[u8; 64]; 2] {
    let mut bl = [[0u8; 64]; 2];
    bl[0][0] = tag;
    bl[0][1..33].copy_from_slice(a);
    bl[0][33..64].copy_from_slice(&b[..31]);
    bl[1][0] = b[31];
    bl[1][1] = 0x80;
    bl[1][56..64].copy_from_slice(&(65u64 * 8).to_be_bytes());
    bl
}

/// A SHA-256 state as the digest bytes.
pub(crate) fn state_bytes(state: &[u32; 8]) -> Hash {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// `delta_id = H("dagfold/op/v1" || body)`.
pub fn delta_id_of_body(body: &[u8]) -> Hash {
    sha256_parts(&[OP_DOMAIN, body])
}

/// The encoded op and its id.
pub fn encode_op(op: &Op) -> (Vec<u8>, Hash) {
    let bytes = encode(op);
    let id = delta_id_of_body(super::codec::op_body(&bytes));
    (bytes, id)
}

/// Bytes of a payload's associated data: the domain, the scope, the plane.
const PAYLOAD_AAD_BYTES: usize = PAYLOAD_DOMAIN.len() + 33;

pub fn payload_aad(scope: &Hash, plane: u8) -> [u8; PAYLOAD_AAD_BYTES] {
    let mut aad = [0u8; PAYLOAD_AAD_BYTES];
    let (domain, rest) = aad.split_at_mut(PAYLOAD_DOMAIN.len());
    domain.copy_from_slice(PAYLOAD_DOMAIN);
    rest[..32].copy_from_slice(scope);
    rest[32] = plane;
    aad
}

pub fn key_id_of(key: &[u8; 32]) -> Hash {
    sha256(key)
}

/// ChaCha20-Poly1305 (RFC 8439) of the payloads, through ring, whose
/// stitched assembly opens a benchmark op's ~90-byte payload in 262 ns
/// against RustCrypto's 614 (`cargo bench --bench verify -- aead`: 2.2×
/// at 300 and 1,200 bytes too). Every data op is opened once on the
/// decryptor's thread, every authored op sealed on the projector's. The
/// same bytes as `chacha20poly1305`'s, which seals the key deliveries (one
/// per member and key) and is the reference of this module's tests.
fn aead_seal(key: &[u8; 32], nonce: &[u8; 12], aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let mut sealed = Vec::with_capacity(plaintext.len() + ring::aead::CHACHA20_POLY1305.tag_len());
    sealed.extend_from_slice(plaintext);
    aead_key(key)
        .seal_in_place_append_tag(ring::aead::Nonce::assume_unique_for_key(*nonce), ring::aead::Aad::from(aad), &mut sealed)
        .expect("ChaCha20-Poly1305 sealing of a bounded payload cannot fail");
    sealed
}

/// `aead_seal`'s inverse: `None` for a tag that does not match, or a
/// ciphertext shorter than the tag.
fn aead_open(key: &[u8; 32], nonce: &[u8; 12], aad: &[u8], ciphertext: &[u8]) -> Option<Vec<u8>> {
    let mut plain = ciphertext.to_vec();
    let opened = aead_key(key)
        .open_in_place(ring::aead::Nonce::assume_unique_for_key(*nonce), ring::aead::Aad::from(aad), &mut plain)
        .ok()?
        .len();
    plain.truncate(opened);
    Some(plain)
}

fn aead_key(key: &[u8; 32]) -> ring::aead::LessSafeKey {
    ring::aead::LessSafeKey::new(ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

/// ChaCha20-Poly1305 seal of a payload (SPEC §4).
pub fn seal_payload(key: &[u8; 32], nonce: &[u8; 12], scope: &Hash, plane: u8, plaintext: &[u8]) -> Vec<u8> {
    aead_seal(key, nonce, &payload_aad(scope, plane), plaintext)
}

/// Opens a payload; `None` is a tag mismatch (`undecryptable`).
pub fn open_payload(key: &[u8; 32], nonce: &[u8; 12], scope: &Hash, plane: u8, ciphertext: &[u8]) -> Option<Vec<u8>> {
    aead_open(key, nonce, &payload_aad(scope, plane), ciphertext)
}

pub fn x25519_public(secret: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*secret)).to_bytes()
}

fn wrap_key(shared: &[u8; 32], ephemeral: &[u8; 32], recipient_kem: &[u8; 32]) -> [u8; 32] {
    sha256_parts(&[WRAP_DOMAIN, shared, ephemeral, recipient_kem])
}

fn delivery_aad(scope: &Hash, key_id: &Hash) -> [u8; 64] {
    let mut aad = [0u8; 64];
    aad[..32].copy_from_slice(scope);
    aad[32..].copy_from_slice(key_id);
    aad
}

/// Seals `key` to a recipient's X25519 `kem` key (SPEC §9), with the caller's
/// ephemeral secret (fresh randomness in the caller keeps this deterministic).
pub fn seal_key_delivery(
    scope: Hash,
    key: &[u8; 32],
    recipient: PublicKey,
    recipient_kem: &[u8; 32],
    ephemeral_secret: &[u8; 32],
) -> KeyDelivery {
    let e = x25519_dalek::StaticSecret::from(*ephemeral_secret);
    let ephemeral = x25519_dalek::PublicKey::from(&e).to_bytes();
    let shared = e.diffie_hellman(&x25519_dalek::PublicKey::from(*recipient_kem)).to_bytes();
    let wrap = wrap_key(&shared, &ephemeral, recipient_kem);
    let key_id = key_id_of(key);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&wrap));
    let sealed = cipher
        .encrypt(Nonce::from_slice(&[0u8; 12]), Payload { msg: key, aad: &delivery_aad(&scope, &key_id) })
        .expect("sealing 32 bytes cannot fail");
    KeyDelivery { scope, key_id, recipient, ephemeral, sealed }
}

/// Opens a delivery addressed to us (SPEC §9): `None` if the shared secret is
/// all zero, the seal does not open, or the key is not 32 bytes hashing to
/// `key_id`. The caller checks `recipient`.
pub fn open_key_delivery(kd: &KeyDelivery, kem_secret: &[u8; 32]) -> Option<[u8; 32]> {
    open_key_delivery_to(kd, kem_secret, &x25519_public(kem_secret))
}

/// `open_key_delivery` with the recipient's X25519 public key already
/// known (`kem_public = x25519_public(kem_secret)`): a fixed-base
/// multiplication less per delivery, a quarter of its cost.
pub fn open_key_delivery_to(kd: &KeyDelivery, kem_secret: &[u8; 32], kem_public: &[u8; 32]) -> Option<[u8; 32]> {
    debug_assert_eq!(*kem_public, x25519_public(kem_secret), "the public key of the secret");
    let r = x25519_dalek::StaticSecret::from(*kem_secret);
    let shared = r.diffie_hellman(&x25519_dalek::PublicKey::from(kd.ephemeral)).to_bytes();
    open_with_shared(kd, &shared, kem_public)
}

/// `open_key_delivery_to` of each of `kds`, in order, their X25519s
/// computed together (`edwards_lanes::x25519_many`: eight at a time in
/// IFMA lanes, ~6.7× dalek's serial ladder each).
pub fn open_key_deliveries_to(kds: &[&KeyDelivery], kem_secret: &[u8; 32], kem_public: &[u8; 32]) -> Vec<Option<[u8; 32]>> {
    debug_assert_eq!(*kem_public, x25519_public(kem_secret), "the public key of the secret");
    let ephemerals: Vec<[u8; 32]> = kds.iter().map(|kd| kd.ephemeral).collect();
    let shared = super::edwards_lanes::x25519_many(kem_secret, &ephemerals);
    kds.iter().zip(&shared).map(|(kd, s)| open_with_shared(kd, s, kem_public)).collect()
}

/// The rest of an opening, from the X25519 shared secret.
fn open_with_shared(kd: &KeyDelivery, shared: &[u8; 32], recipient_kem: &[u8; 32]) -> Option<[u8; 32]> {
    if *shared == [0u8; 32] {
        return None;
    }
    let wrap = wrap_key(shared, &kd.ephemeral, recipient_kem);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&wrap));
    let key = cipher
        .decrypt(Nonce::from_slice(&[0u8; 12]), Payload { msg: &kd.sealed, aad: &delivery_aad(&kd.scope, &kd.key_id) })
        .ok()?;
    let key: [u8; 32] = key.try_into().ok()?;
    (key_id_of(&key) == kd.key_id).then_some(key)
}

/// `p = H("dagfold/cell/v1" || borsh(entity) || borsh(key))` (SPEC §8).
pub fn cell_path(entity: &str, key: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(CELL_DOMAIN);
    h.update((entity.len() as u32).to_le_bytes());
    h.update(entity.as_bytes());
    h.update((key.len() as u32).to_le_bytes());
    h.update(key);
    h.finalize().into()
}

/// `leaf = H([0x00] || p || H(borsh(cell)))`.
pub fn cell_leaf(path: &Hash, cell: &Cell) -> Hash {
    sha256_tag_pair(0, path, &sha256(&encode(cell)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_seal_and_open_as_the_reference_does() {
        // RustCrypto's ChaCha20-Poly1305, the reference.
        let cipher = |key: &[u8; 32]| ChaCha20Poly1305::new(Key::from_slice(key));
        for n in (0..=300).chain([1023, 1024, 1025, 4096]) {
            let i = n as u32;
            let key = sha256(&i.to_le_bytes());
            let nonce: [u8; 12] = sha256(&key)[..12].try_into().unwrap();
            let scope = sha256(&nonce);
            let plane = (i % 3) as u8;
            let plain: Vec<u8> = (0..n).map(|j| (j * 7 + n) as u8).collect();
            let aad = payload_aad(&scope, plane);
            let expected = cipher(&key).encrypt(Nonce::from_slice(&nonce), Payload { msg: &plain, aad: &aad }).unwrap();
            let sealed = seal_payload(&key, &nonce, &scope, plane, &plain);
            assert_eq!(sealed, expected, "{n} bytes sealed");
            assert_eq!(open_payload(&key, &nonce, &scope, plane, &sealed).as_deref(), Some(&plain[..]), "{n} bytes opened");
        }
    }

    #[test]
    fn a_payload_altered_anywhere_does_not_open() {
        let (key, nonce, scope) = ([1u8; 32], [2u8; 12], [3u8; 32]);
        let sealed = seal_payload(&key, &nonce, &scope, PLANE_DATA, b"a payload of some bytes");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x20;
            assert_eq!(open_payload(&key, &nonce, &scope, PLANE_DATA, &bad), None, "byte {i} flipped");
        }
        for cut in 0..sealed.len() {
            assert_eq!(open_payload(&key, &nonce, &scope, PLANE_DATA, &sealed[..cut]), None, "cut to {cut} bytes");
        }
        assert_eq!(open_payload(&[9; 32], &nonce, &scope, PLANE_DATA, &sealed), None, "another key");
        assert_eq!(open_payload(&key, &[9; 12], &scope, PLANE_DATA, &sealed), None, "another nonce");
        assert_eq!(open_payload(&key, &nonce, &[9; 32], PLANE_DATA, &sealed), None, "another scope");
        assert_eq!(open_payload(&key, &nonce, &scope, PLANE_GOVERNANCE, &sealed), None, "the other plane");
        assert!(open_payload(&key, &nonce, &scope, PLANE_DATA, &sealed).is_some());
    }

    /// Wycheproof's ChaCha20-Poly1305 cases of the sizes the spec uses (a
    /// 32-byte key, a 12-byte nonce, a 16-byte tag): each valid one seals
    /// to its bytes and opens, each invalid one does not open.
    #[test]
    fn wycheproof_chacha20_poly1305() {
        use wycheproof::aead::{TestName, TestSet};
        let set = TestSet::load(TestName::ChaCha20Poly1305).unwrap();
        let (mut valid, mut invalid) = (0, 0);
        for group in set.test_groups.iter().filter(|g| g.key_size == 256 && g.nonce_size == 96 && g.tag_size == 128) {
            for t in &group.tests {
                let key: [u8; 32] = t.key.as_slice().try_into().unwrap();
                let nonce: [u8; 12] = t.nonce.as_slice().try_into().unwrap();
                let sealed = [t.ct.as_slice(), t.tag.as_slice()].concat();
                let opened = aead_open(&key, &nonce, &t.aad, &sealed);
                if t.result.must_fail() {
                    assert_eq!(opened, None, "tcId {} opens", t.tc_id);
                    invalid += 1;
                } else {
                    assert_eq!(opened.as_deref(), Some(t.pt.as_slice()), "tcId {} does not open", t.tc_id);
                    assert_eq!(aead_seal(&key, &nonce, &t.aad, &t.pt), sealed, "tcId {} seals otherwise", t.tc_id);
                    valid += 1;
                }
            }
        }
        assert!(valid > 100 && invalid > 50, "{valid} valid and {invalid} invalid cases");
    }

    #[test]
    fn the_two_block_hash_equals_the_generic_one() {
        for i in 0u32..200 {
            let a = sha256(&i.to_le_bytes());
            let b = sha256(&a);
            let tag = (i % 3) as u8;
            assert_eq!(sha256_tag_pair(tag, &a, &b), sha256_parts(&[&[tag], &a, &b]));
        }
    }
}
