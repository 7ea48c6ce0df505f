//! Many independent `H(tag || a || b)` at once (the branch hashes of the
//! sparse Merkle tree, SPEC §8), interleaved four ways on SHA-NI.
//!
//! One SHA-256 compression on SHA-NI is a chain of 32 dependent
//! `sha256rnds2`; an out-of-order core does not overlap two consecutive
//! calls. Four independent messages interleaved round by round keep the
//! unit busy: 52–62 ns per hash of 65 bytes (two blocks) against sha2's 88
//! (`cargo bench --bench stages -- "tag pairs"`). A rehash of the tree has
//! that independence: the dirty branches of one bit do not depend on each
//! other.
//!
//! Without SHA-NI (checked once per call, cached by std) every hash goes
//! through `sha2::compress256`; the unit tests compare both paths with it.

use super::crypto::sha256_tag_pair;
use super::Hash;

fn has_sha_ni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse4.1")
            && std::arch::is_x86_feature_detected!("ssse3")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[i] = H(tag || pairs[i].0 || pairs[i].1)`; `out` is cleared first.
pub fn sha256_tag_pairs(tag: u8, pairs: &[(Hash, Hash)], out: &mut Vec<Hash>) {
    out.clear();
    out.reserve(pairs.len());
    #[cfg(target_arch = "x86_64")]
    if has_sha_ni() {
        let mut chunks = pairs.chunks_exact(4);
        for c in &mut chunks {
            // SAFETY: the CPU has SHA-NI, SSE4.1 and SSSE3 (checked above).
            out.extend(unsafe { ni::tag_pairs::<4>(tag, c) });
        }
        let rest = chunks.remainder();
        let mut twos = rest.chunks_exact(2);
        for c in &mut twos {
            out.extend(unsafe { ni::tag_pairs::<2>(tag, c) });
        }
        for c in twos.remainder().chunks_exact(1) {
            out.extend(unsafe { ni::tag_pairs::<1>(tag, c) });
        }
        return;
    }
    out.extend(pairs.iter().map(|(a, b)| sha256_tag_pair(tag, a, b)));
}

#[cfg(target_arch = "x86_64")]
mod ni {
    use crate::protocol::crypto::{state_bytes, tag_pair_blocks as blocks, SHA256_IV as IV};
    use crate::protocol::Hash;
    use core::arch::x86_64::*;

    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];

    /// N hashes of `tag || a || b`, their rounds interleaved.
    #[target_feature(enable = "sha,sse4.1,ssse3")]
    pub unsafe fn tag_pairs<const N: usize>(tag: u8, pairs: &[(Hash, Hash)]) -> [Hash; N] {
        debug_assert_eq!(pairs.len(), N);
        let bl: [[[u8; 64]; 2]; N] = core::array::from_fn(|j| blocks(tag, &pairs[j].0, &pairs[j].1));
        let mut st = [IV; N];
        compress::<N>(&mut st, &core::array::from_fn(|j| &bl[j][0]));
        compress::<N>(&mut st, &core::array::from_fn(|j| &bl[j][1]));
        core::array::from_fn(|j| state_bytes(&st[j]))
    }

    /// One block into each of N states. SHA-NI keeps the state as ABEF and
    /// CDGH; `sha256rnds2` does two rounds with the low two words of W+K.
    #[target_feature(enable = "sha,sse4.1,ssse3")]
    unsafe fn compress<const N: usize>(states: &mut [[u32; 8]; N], blocks: &[&[u8; 64]; N]) {
        // Big-endian words to lanes.
        let bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bu64 as i64, 0x0405060700010203u64 as i64);
        let mut abef = [_mm_setzero_si128(); N];
        let mut cdgh = [_mm_setzero_si128(); N];
        // The last four groups of four schedule words, as a ring.
        let mut w = [[_mm_setzero_si128(); 4]; N];
        for j in 0..N {
            let abcd = _mm_shuffle_epi32(_mm_loadu_si128(states[j].as_ptr() as *const __m128i), 0xB1);
            let efgh = _mm_shuffle_epi32(_mm_loadu_si128(states[j].as_ptr().add(4) as *const __m128i), 0x1B);
            abef[j] = _mm_alignr_epi8(abcd, efgh, 8);
            cdgh[j] = _mm_blend_epi16(efgh, abcd, 0xF0);
            for (q, g) in w[j].iter_mut().enumerate() {
                *g = _mm_shuffle_epi8(_mm_loadu_si128(blocks[j].as_ptr().add(16 * q) as *const __m128i), bswap);
            }
        }
        let (abef0, cdgh0) = (abef, cdgh);
        for r in 0..16 {
            let k = _mm_loadu_si128(K.as_ptr().add(4 * r) as *const __m128i);
            for j in 0..N {
                let cur = if r < 4 {
                    w[j][r]
                } else {
                    let (g0, g1, g2, g3) = (w[j][r % 4], w[j][(r + 1) % 4], w[j][(r + 2) % 4], w[j][(r + 3) % 4]);
                    let m = _mm_add_epi32(_mm_sha256msg1_epu32(g0, g1), _mm_alignr_epi8(g3, g2, 4));
                    let next = _mm_sha256msg2_epu32(m, g3);
                    w[j][r % 4] = next;
                    next
                };
                let wk = _mm_add_epi32(cur, k);
                cdgh[j] = _mm_sha256rnds2_epu32(cdgh[j], abef[j], wk);
                abef[j] = _mm_sha256rnds2_epu32(abef[j], cdgh[j], _mm_shuffle_epi32(wk, 0x0E));
            }
        }
        for j in 0..N {
            let x = _mm_shuffle_epi32(_mm_add_epi32(abef[j], abef0[j]), 0x1B);
            let y = _mm_shuffle_epi32(_mm_add_epi32(cdgh[j], cdgh0[j]), 0xB1);
            _mm_storeu_si128(states[j].as_mut_ptr() as *mut __m128i, _mm_blend_epi16(x, y, 0xF0));
            _mm_storeu_si128(states[j].as_mut_ptr().add(4) as *mut __m128i, _mm_alignr_epi8(y, x, 8));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crypto::sha256;

    fn inputs(n: usize) -> Vec<(Hash, Hash)> {
        (0..n as u32).map(|i| (sha256(&i.to_le_bytes()), sha256(&(i + 1_000_000).to_le_bytes()))).collect()
    }

    #[test]
    fn every_count_and_tag_equals_the_plain_hash() {
        let mut out = Vec::new();
        for n in 0..=13 {
            for tag in [0u8, 1, 0xFF] {
                let pairs = inputs(n);
                sha256_tag_pairs(tag, &pairs, &mut out);
                assert_eq!(out.len(), n);
                for ((a, b), h) in pairs.iter().zip(&out) {
                    assert_eq!(*h, sha256(&[&[tag][..], a, b].concat()), "n {n} tag {tag}");
                }
            }
        }
    }

    #[test]
    fn extreme_words_equal_the_plain_hash() {
        // All-ones and all-zero inputs exercise the carries of every add.
        let pairs = vec![([0xFF; 32], [0xFF; 32]), ([0; 32], [0; 32]), ([0xFF; 32], [0; 32]), ([0; 32], [0xFF; 32])];
        let mut out = Vec::new();
        sha256_tag_pairs(0xFF, &pairs, &mut out);
        for ((a, b), h) in pairs.iter().zip(&out) {
            assert_eq!(*h, sha256(&[&[0xFF][..], a, b].concat()));
        }
    }
}
