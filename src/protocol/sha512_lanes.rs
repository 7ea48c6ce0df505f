//! SHA-512 of many short messages at once, eight in the lanes of AVX-512F:
//! the challenges `H(R || A || M)` of a batch's signatures (96 bytes each),
//! the blocks of its coefficients, the nonces and challenges of the node's
//! own signatures (`sig`).
//!
//! A message of at most `ONE_BLOCK_MAX` bytes is one block once padded.
//! sha2's compression takes one block at a time, ~140 ns each on this
//! machine kind (its AVX2 schedule, then 80 dependent rounds in scalar
//! registers), and a batch of 512 signatures hashed ~2.3 blocks per
//! signature: 12% of the verifier's thread in `causal` (`perf record`,
//! 2026-12-06). The rounds of eight independent blocks run side by side
//! here, word `t` of lane `i` being word `t` of block `i`; `cargo bench
//! --bench verify -- sha512` gives both.
//!
//! Without AVX-512F (checked once per call, cached by std) every block goes
//! through sha2; the tests compare both paths with it on every length.

use sha2::{Digest, Sha512};

/// The longest message that pads to one block: 128 bytes less the `0x80`
/// marker and the 16-byte length.
pub const ONE_BLOCK_MAX: usize = 128 - 1 - 16;

/// One message of at most `ONE_BLOCK_MAX` bytes, padded to its block.
#[derive(Clone)]
pub struct Block {
    bytes: [u8; 128],
    len: usize,
}

impl Block {
    /// The message that is `parts` joined, or None if it is longer than
    /// `ONE_BLOCK_MAX`.
    pub fn of(parts: &[&[u8]]) -> Option<Block> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > ONE_BLOCK_MAX {
            return None;
        }
        let mut bytes = [0u8; 128];
        let mut at = 0;
        for p in parts {
            bytes[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        bytes[len] = 0x80;
        bytes[112..].copy_from_slice(&((len as u128) * 8).to_be_bytes());
        Some(Block { bytes, len })
    }

    fn message(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `SHA-512` of each block's message, in order, appended to `out`.
pub fn digests(blocks: &[Block], out: &mut Vec<[u8; 64]>) {
    out.reserve(blocks.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512f() && blocks.len() > 1 {
        let mut eights = blocks.chunks_exact(8);
        for c in &mut eights {
            let lanes: &[Block; 8] = c.try_into().expect("a chunk of eight");
            // SAFETY: the CPU has AVX-512F (checked above).
            out.extend(unsafe { x8::digests(lanes) });
        }
        let rest = eights.remainder();
        if rest.len() > 1 {
            // The spare lanes hash copies of the first block, not read.
            let lanes: [Block; 8] = std::array::from_fn(|i| rest.get(i).unwrap_or(&rest[0]).clone());
            // SAFETY: as above.
            let all = unsafe { x8::digests(&lanes) };
            out.extend_from_slice(&all[..rest.len()]);
        } else {
            out.extend(rest.iter().map(one));
        }
        return;
    }
    out.extend(blocks.iter().map(one));
}

fn one(b: &Block) -> [u8; 64] {
    Sha512::digest(b.message()).into()
}

const IV: [u64; 8] = [
    0x6a09e667f3bcc908,
    0xbb67ae8584caa73b,
    0x3c6ef372fe94f82b,
    0xa54ff53a5f1d36f1,
    0x510e527fade682d1,
    0x9b05688c2b3e6c1f,
    0x1f83d9abfb41bd6b,
    0x5be0cd19137e2179,
];

/// FIPS 180-4's 80 round constants.
const K: [u64; 80] = [
    0x428a2f98d728ae22, 0x7137449123ef65cd, 0xb5c0fbcfec4d3b2f, 0xe9b5dba58189dbbc, 0x3956c25bf348b538,
    0x59f111f1b605d019, 0x923f82a4af194f9b, 0xab1c5ed5da6d8118, 0xd807aa98a3030242, 0x12835b0145706fbe,
    0x243185be4ee4b28c, 0x550c7dc3d5ffb4e2, 0x72be5d74f27b896f, 0x80deb1fe3b1696b1, 0x9bdc06a725c71235,
    0xc19bf174cf692694, 0xe49b69c19ef14ad2, 0xefbe4786384f25e3, 0x0fc19dc68b8cd5b5, 0x240ca1cc77ac9c65,
    0x2de92c6f592b0275, 0x4a7484aa6ea6e483, 0x5cb0a9dcbd41fbd4, 0x76f988da831153b5, 0x983e5152ee66dfab,
    0xa831c66d2db43210, 0xb00327c898fb213f, 0xbf597fc7beef0ee4, 0xc6e00bf33da88fc2, 0xd5a79147930aa725,
    0x06ca6351e003826f, 0x142929670a0e6e70, 0x27b70a8546d22ffc, 0x2e1b21385c26c926, 0x4d2c6dfc5ac42aed,
    0x53380d139d95b3df, 0x650a73548baf63de, 0x766a0abb3c77b2a8, 0x81c2c92e47edaee6, 0x92722c851482353b,
    0xa2bfe8a14cf10364, 0xa81a664bbc423001, 0xc24b8b70d0f89791, 0xc76c51a30654be30, 0xd192e819d6ef5218,
    0xd69906245565a910, 0xf40e35855771202a, 0x106aa07032bbd1b8, 0x19a4c116b8d2d0c8, 0x1e376c085141ab53,
    0x2748774cdf8eeb99, 0x34b0bcb5e19b48a8, 0x391c0cb3c5c95a63, 0x4ed8aa4ae3418acb, 0x5b9cca4f7763e373,
    0x682e6ff3d6b2b8a3, 0x748f82ee5defb2fc, 0x78a5636f43172f60, 0x84c87814a1f0ab72, 0x8cc702081a6439ec,
    0x90befffa23631e28, 0xa4506cebde82bde9, 0xbef9a3f7b2c67915, 0xc67178f2e372532b, 0xca273eceea26619c,
    0xd186b8c721c0c207, 0xeada7dd6cde0eb1e, 0xf57d4f7fee6ed178, 0x06f067aa72176fba, 0x0a637dc5a2c898a6,
    0x113f9804bef90dae, 0x1b710b35131c471b, 0x28db77f523047d84, 0x32caab7b40c72493, 0x3c9ebe0a15c9bebc,
    0x431d67c49c100d4c, 0x4cc5d4becb3e42b6, 0x597f299cfc657e2a, 0x5fcb6fab3ad6faec, 0x6c44198c4a475817,
];

#[cfg(target_arch = "x86_64")]
mod x8 {
    use super::{Block, IV, K};
    use core::arch::x86_64::*;

    #[inline(always)]
    unsafe fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
        _mm512_ternarylogic_epi64::<0x96>(a, b, c)
    }

    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi64(a, b)
    }

    /// The digests of eight one-block messages.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn digests(blocks: &[Block; 8]) -> [[u8; 64]; 8] {
        // w[t] holds word t of the eight blocks (big endian), lane i block i.
        let mut w = [_mm512_setzero_si512(); 16];
        for (t, wt) in w.iter_mut().enumerate() {
            let lanes: [u64; 8] =
                std::array::from_fn(|i| u64::from_be_bytes(blocks[i].bytes[8 * t..8 * t + 8].try_into().expect("eight bytes")));
            *wt = _mm512_loadu_si512(lanes.as_ptr().cast());
        }
        let iv = IV.map(|v| _mm512_set1_epi64(v as i64));
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = iv;
        for (t, k) in K.iter().enumerate() {
            let wt = if t < 16 {
                w[t]
            } else {
                let w15 = w[(t - 15) & 15];
                let w2 = w[(t - 2) & 15];
                let s0 = xor3(_mm512_ror_epi64::<1>(w15), _mm512_ror_epi64::<8>(w15), _mm512_srli_epi64::<7>(w15));
                let s1 = xor3(_mm512_ror_epi64::<19>(w2), _mm512_ror_epi64::<61>(w2), _mm512_srli_epi64::<6>(w2));
                let v = add(add(w[t & 15], s0), add(w[(t - 7) & 15], s1));
                w[t & 15] = v;
                v
            };
            let big_s1 = xor3(_mm512_ror_epi64::<14>(e), _mm512_ror_epi64::<18>(e), _mm512_ror_epi64::<41>(e));
            // Ch(e, f, g) = e ? f : g.
            let ch = _mm512_ternarylogic_epi64::<0xCA>(e, f, g);
            let t1 = add(add(h, big_s1), add(add(ch, _mm512_set1_epi64(*k as i64)), wt));
            let big_s0 = xor3(_mm512_ror_epi64::<28>(a), _mm512_ror_epi64::<34>(a), _mm512_ror_epi64::<39>(a));
            // Maj(a, b, c): two of three.
            let maj = _mm512_ternarylogic_epi64::<0xE8>(a, b, c);
            let t2 = add(big_s0, maj);
            h = g;
            g = f;
            f = e;
            e = add(d, t1);
            d = c;
            c = b;
            b = a;
            a = add(t1, t2);
        }
        let state = [a, b, c, d, e, f, g, h];
        let mut out = [[0u8; 64]; 8];
        for (j, (s, v)) in state.iter().zip(iv).enumerate() {
            let mut lanes = [0u64; 8];
            _mm512_storeu_si512(lanes.as_mut_ptr().cast(), add(*s, v));
            for (o, l) in out.iter_mut().zip(lanes) {
                o[8 * j..8 * j + 8].copy_from_slice(&l.to_be_bytes());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: &[u8]) -> [u8; 64] {
        Sha512::digest(m).into()
    }

    #[test]
    fn every_length_and_count_hashes_as_sha2_does() {
        // Lengths 0..=111, each lane a different message, in runs of every
        // count from 1 to 19 (the eights, the remainders, one alone).
        let messages: Vec<Vec<u8>> =
            (0..=ONE_BLOCK_MAX).map(|n| (0..n).map(|i| (i * 31 + n * 7 + 1) as u8).collect()).collect();
        for count in 1..20 {
            for start in (0..messages.len()).step_by(count) {
                let run = &messages[start..(start + count).min(messages.len())];
                let blocks: Vec<Block> = run.iter().map(|m| Block::of(&[m]).expect("fits one block")).collect();
                let mut out = Vec::new();
                digests(&blocks, &mut out);
                let want: Vec<[u8; 64]> = run.iter().map(|m| reference(m)).collect();
                assert_eq!(out, want, "count {count}, from length {start}");
            }
        }
    }

    #[test]
    fn parts_are_joined_and_long_messages_refused() {
        let (r, a, m) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let mut out = vec![[9u8; 64]];
        digests(&[Block::of(&[&r, &a, &m]).unwrap(), Block::of(&[&r, &m]).unwrap()], &mut out);
        let joined: Vec<u8> = [r, a, m].concat();
        assert_eq!(out, vec![[9u8; 64], reference(&joined), reference(&[r, m].concat())], "appended after what was there");
        assert!(Block::of(&[&[0u8; 100], &[0u8; 11]]).is_some());
        assert!(Block::of(&[&[0u8; 100], &[0u8; 12]]).is_none());
    }

    #[test]
    fn nist_short_vectors() {
        // FIPS 180-4's examples: "abc" and the empty message.
        let mut out = Vec::new();
        let blocks: Vec<Block> = (0..9).map(|i| Block::of(&[if i % 2 == 0 { b"abc" } else { b"" }]).unwrap()).collect();
        digests(&blocks, &mut out);
        let abc = hex::decode("ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f").unwrap();
        let empty = hex::decode("cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e").unwrap();
        for (i, d) in out.iter().enumerate() {
            assert_eq!(d.as_slice(), if i % 2 == 0 { &abc[..] } else { &empty[..] }, "message {i}");
        }
    }
}
