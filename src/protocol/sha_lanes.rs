//! Many independent `H(tag || a || b)` at once (the branch hashes of the
//! sparse Merkle tree, SPEC §8): interleaved four ways on SHA-NI, or
//! sixteen side by side in the lanes of AVX-512F.
//!
//! One SHA-256 compression on SHA-NI is a chain of 32 dependent
//! `sha256rnds2`; an out-of-order core does not overlap two consecutive
//! calls. Four independent messages interleaved round by round keep the
//! unit busy: on the AMD EPYC of this machine kind 52–62 ns per hash of 65
//! bytes (two blocks) against sha2's 88 (`cargo bench --bench stages --
//! "tag pairs"`). A rehash of the tree has that independence: the dirty
//! branches of one bit do not depend on each other.
//!
//! The Intel Xeon of the same machine kind runs SHA-NI near its
//! throughput already: 98 ns a hash interleaved, 112–116 alone. There the
//! rounds of sixteen hashes in the 32-bit lanes of AVX-512F (`x16`, word
//! `t` of lane `i` the word `t` of hash `i`'s block, as `sha512_lanes`
//! does for SHA-512, with BW's and VBMI's byte shuffles) are faster: 37
//! ns a hash. Which of the two is faster
//! is measured once, on the first call (`Lanes::chosen`: each on the same
//! 64 pairs, the best of five), not guessed from the CPU's name; every
//! path gives the same bytes, and the unit tests compare each with sha2.
//! `DAGFOLD_SHA256_LANES=sha2|ni|x16` names one instead (for measuring;
//! ignored if the CPU lacks it). The node shows the one it took as
//! `dagfold_sha256_lanes{way}` on `/metrics`.
//!
//! Without SHA-NI or AVX-512 (F, BW and VBMI; checked once, cached) every
//! hash goes through `sha2::compress256`.

use super::crypto::sha256_tag_pair;
use super::Hash;
use std::sync::OnceLock;

fn has_ni() -> bool {
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

/// A way to hash many tag pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// One at a time through `sha2::compress256`.
    Sha2,
    /// Four at a time, interleaved, on SHA-NI.
    Ni,
    /// Sixteen at a time in the lanes of AVX-512F (with BW and VBMI); a
    /// remainder of fewer than `X16_MIN` through SHA-NI (or sha2 without
    /// it).
    X16,
}

/// A remainder this short goes through SHA-NI, not a part-empty `x16`:
/// sixteen lanes cost about what eight hashes cost on SHA-NI.
#[cfg(target_arch = "x86_64")]
const X16_MIN: usize = 8;

impl Lanes {
    /// The ways this CPU has, `Sha2` first (detected once).
    pub fn available() -> &'static [Lanes] {
        static HAVE: OnceLock<Vec<Lanes>> = OnceLock::new();
        HAVE.get_or_init(|| {
            let mut v = vec![Lanes::Sha2];
            if has_ni() {
                v.push(Lanes::Ni);
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi")
            {
                v.push(Lanes::X16);
            }
            v
        })
    }

    /// Its name in `DAGFOLD_SHA256_LANES` and the `dagfold_sha256_lanes`
    /// gauge's `way` label.
    pub fn name(self) -> &'static str {
        match self {
            Lanes::Sha2 => "sha2",
            Lanes::Ni => "ni",
            Lanes::X16 => "x16",
        }
    }

    /// The way `sha256_tag_pairs` takes, decided on its first call.
    pub fn chosen() -> Lanes {
        static CHOSEN: OnceLock<Lanes> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let have = Lanes::available();
            let asked = std::env::var("DAGFOLD_SHA256_LANES").ok();
            let named = [Lanes::Sha2, Lanes::Ni, Lanes::X16].into_iter().find(|l| asked.as_deref() == Some(l.name()));
            match named {
                Some(l) if have.contains(&l) => l,
                _ => Lanes::fastest(have),
            }
        })
    }

    /// The fastest of `have` over 64 pairs, each the best of five runs of
    /// four (~0.3 ms in all). Only SHA-NI and `x16` are close enough to
    /// measure; each is far ahead of sha2.
    fn fastest(have: &[Lanes]) -> Lanes {
        let ways: Vec<Lanes> = have.iter().copied().filter(|&l| l != Lanes::Sha2).collect();
        if ways.len() < 2 {
            return ways.first().copied().unwrap_or(Lanes::Sha2);
        }
        let pairs: Vec<(Hash, Hash)> = (0..64u8).map(|i| ([i; 32], [!i; 32])).collect();
        let mut out = Vec::with_capacity(pairs.len());
        let mut best = vec![std::time::Duration::MAX; ways.len()];
        for _ in 0..5 {
            for (b, &l) in best.iter_mut().zip(&ways) {
                let t = std::time::Instant::now();
                for _ in 0..4 {
                    sha256_tag_pairs_by(l, 1, std::hint::black_box(&pairs), &mut out);
                }
                *b = (*b).min(t.elapsed());
            }
        }
        let i = (0..ways.len()).min_by_key(|&i| best[i]).expect("two ways");
        ways[i]
    }
}

/// `out[i] = H(tag || pairs[i].0 || pairs[i].1)`; `out` is cleared first.
pub fn sha256_tag_pairs(tag: u8, pairs: &[(Hash, Hash)], out: &mut Vec<Hash>) {
    sha256_tag_pairs_by(Lanes::chosen(), tag, pairs, out);
}

/// `sha256_tag_pairs` the way `lanes` says.
///
/// # Panics
/// If this CPU lacks `lanes` (see `Lanes::available`).
pub fn sha256_tag_pairs_by(lanes: Lanes, tag: u8, pairs: &[(Hash, Hash)], out: &mut Vec<Hash>) {
    out.clear();
    out.reserve(pairs.len());
    let mut rest = pairs;
    #[cfg(target_arch = "x86_64")]
    {
        let have = Lanes::available();
        assert!(lanes == Lanes::Sha2 || have.contains(&lanes), "this CPU lacks {lanes:?}");
        if lanes == Lanes::X16 {
            let mut sixteens = rest.chunks_exact(16);
            for c in &mut sixteens {
                // SAFETY: the CPU has AVX-512F, BW and VBMI (asserted above).
                out.extend(unsafe { x16::tag_pairs(tag, c) });
            }
            rest = sixteens.remainder();
            if rest.len() >= X16_MIN {
                // SAFETY: as above.
                out.extend_from_slice(&unsafe { x16::tag_pairs(tag, rest) }[..rest.len()]);
                return;
            }
        }
        if lanes != Lanes::Sha2 && have.contains(&Lanes::Ni) {
            let mut fours = rest.chunks_exact(4);
            for c in &mut fours {
                // SAFETY: the CPU has SHA-NI, SSE4.1 and SSSE3 (`Ni` is available).
                out.extend(unsafe { ni::tag_pairs::<4>(tag, c) });
            }
            let tail = fours.remainder();
            let mut twos = tail.chunks_exact(2);
            for c in &mut twos {
                out.extend(unsafe { ni::tag_pairs::<2>(tag, c) });
            }
            for c in twos.remainder().chunks_exact(1) {
                out.extend(unsafe { ni::tag_pairs::<1>(tag, c) });
            }
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = lanes;
    out.extend(rest.iter().map(|(a, b)| sha256_tag_pair(tag, a, b)));
}

/// FIPS 180-4's 64 round constants.
#[cfg(target_arch = "x86_64")]
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

#[cfg(target_arch = "x86_64")]
mod ni {
    use super::K;
    use crate::protocol::crypto::{state_bytes, tag_pair_blocks as blocks, SHA256_IV as IV};
    use crate::protocol::Hash;
    use core::arch::x86_64::*;

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

#[cfg(target_arch = "x86_64")]
mod x16 {
    use super::K;
    use crate::protocol::crypto::SHA256_IV as IV;
    use crate::protocol::Hash;
    use core::arch::x86_64::*;

    #[inline(always)]
    unsafe fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
        _mm512_ternarylogic_epi32::<0x96>(a, b, c)
    }

    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }

    /// Each 32-bit word's bytes reversed (SHA-256's words are big endian).
    #[inline(always)]
    unsafe fn bswap(x: __m512i) -> __m512i {
        let order = _mm512_set_epi64(
            0x0c0d0e0f08090a0bu64 as i64,
            0x0405060700010203u64 as i64,
            0x0c0d0e0f08090a0bu64 as i64,
            0x0405060700010203u64 as i64,
            0x0c0d0e0f08090a0bu64 as i64,
            0x0405060700010203u64 as i64,
            0x0c0d0e0f08090a0bu64 as i64,
            0x0405060700010203u64 as i64,
        );
        _mm512_shuffle_epi8(x, order)
    }

    /// The 16 × 16 words of `r` transposed: word `c` of row `i` becomes
    /// word `i` of row `c`. Pairs of rows interleaved by 32 and 64 bits
    /// within each 128-bit lane, then the lanes gathered twice.
    #[inline(always)]
    unsafe fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
        let mut t = [_mm512_setzero_si512(); 16];
        for k in 0..8 {
            t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
        }
        // u[4g + m], lane j: word 4j + m of rows 4g..4g + 3.
        let mut u = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
            u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
            u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
            u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
        }
        let mut v = [_mm512_setzero_si512(); 16];
        for h in 0..2 {
            for m in 0..4 {
                v[8 * h + m] = _mm512_shuffle_i32x4::<0x88>(u[8 * h + m], u[8 * h + 4 + m]);
                v[8 * h + 4 + m] = _mm512_shuffle_i32x4::<0xDD>(u[8 * h + m], u[8 * h + 4 + m]);
            }
        }
        let mut w = [_mm512_setzero_si512(); 16];
        for m in 0..8 {
            w[m] = _mm512_shuffle_i32x4::<0x88>(v[m], v[8 + m]);
            w[m + 8] = _mm512_shuffle_i32x4::<0xDD>(v[m], v[8 + m]);
        }
        w
    }

    /// `H(tag || a || b)` of each of up to sixteen pairs, one a lane; the
    /// lanes past `pairs.len()` hash copies of its first pair.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) unsafe fn tag_pairs(tag: u8, pairs: &[(Hash, Hash)]) -> [Hash; 16] {
        debug_assert!(!pairs.is_empty() && pairs.len() <= 16);
        // Each pair's first block, `tag || a || b[..31]`, its words in host
        // order, one row a pair; transposed, word t of every pair in w[t].
        // A row is `a || b` moved up a byte and each word's bytes reversed,
        // in one byte permute: byte k of word t is the block's byte
        // 4t + 3 - k, which is byte 4t + 2 - k of `a || b`; the tag (the
        // block's byte 0, byte 3 of word 0) is put in after. The second
        // block is `b[31]`, the `0x80` marker and the length (520 bits):
        // only its word 0 differs between pairs.
        let from: [u8; 64] = core::array::from_fn(|j| ((j & !3) + 2).wrapping_sub(j & 3) as u8 & 63);
        let from = _mm512_loadu_si512(from.as_ptr().cast());
        let tags = _mm512_set1_epi8(tag as i8);
        let mut last = [0u32; 16];
        let mut rows = [_mm512_setzero_si512(); 16];
        for (i, row) in rows.iter_mut().enumerate() {
            let (a, b) = pairs.get(i).unwrap_or(&pairs[0]);
            let ab = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(a.as_ptr().cast())), _mm256_loadu_si256(b.as_ptr().cast()));
            *row = _mm512_mask_blend_epi8(1 << 3, _mm512_permutexvar_epi8(from, ab), tags);
            last[i] = (b[31] as u32) << 24 | 0x0080_0000;
        }
        let mut st = IV.map(|v| _mm512_set1_epi32(v as i32));
        let mut w = transpose(rows);
        compress(&mut st, &mut w);
        let mut w = [_mm512_setzero_si512(); 16];
        w[0] = _mm512_loadu_si512(last.as_ptr().cast());
        w[15] = _mm512_set1_epi32(65 * 8);
        compress(&mut st, &mut w);
        // Back to one row a pair: its eight state words, big endian.
        let zero = _mm512_setzero_si512();
        let rows = transpose([st[0], st[1], st[2], st[3], st[4], st[5], st[6], st[7], zero, zero, zero, zero, zero, zero, zero, zero]);
        let mut out = [[0u8; 32]; 16];
        for (o, r) in out.iter_mut().zip(rows) {
            _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm512_castsi512_si256(bswap(r)));
        }
        out
    }

    /// One block, its words in `w` (consumed as the schedule's ring), into
    /// each lane's state. The rounds go sixteen at a time, written out, so
    /// that every index into the ring is a constant and the ring stays in
    /// registers (as a loop, it went through the stack).
    #[inline(always)]
    unsafe fn compress(st: &mut [__m512i; 8], w: &mut [__m512i; 16]) {
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *st;
        // Round `base + j`; past the first sixteen, its word from the ring.
        macro_rules! round {
            ($base:expr, $j:literal) => {{
                let wt = if $base == 0 {
                    w[$j]
                } else {
                    let w15 = w[($j + 1) & 15];
                    let w2 = w[($j + 14) & 15];
                    let s0 = xor3(_mm512_ror_epi32::<7>(w15), _mm512_ror_epi32::<18>(w15), _mm512_srli_epi32::<3>(w15));
                    let s1 = xor3(_mm512_ror_epi32::<17>(w2), _mm512_ror_epi32::<19>(w2), _mm512_srli_epi32::<10>(w2));
                    let v = add(add(w[$j], s0), add(w[($j + 9) & 15], s1));
                    w[$j] = v;
                    v
                };
                let big_s1 = xor3(_mm512_ror_epi32::<6>(e), _mm512_ror_epi32::<11>(e), _mm512_ror_epi32::<25>(e));
                // Ch(e, f, g) = e ? f : g.
                let ch = _mm512_ternarylogic_epi32::<0xCA>(e, f, g);
                let t1 = add(add(h, big_s1), add(add(ch, _mm512_set1_epi32(K[$base + $j] as i32)), wt));
                let big_s0 = xor3(_mm512_ror_epi32::<2>(a), _mm512_ror_epi32::<13>(a), _mm512_ror_epi32::<22>(a));
                // Maj(a, b, c): two of three.
                let maj = _mm512_ternarylogic_epi32::<0xE8>(a, b, c);
                h = g;
                g = f;
                f = e;
                e = add(d, t1);
                d = c;
                c = b;
                b = a;
                a = add(t1, add(big_s0, maj));
            }};
        }
        macro_rules! sixteen {
            ($base:expr) => {{
                round!($base, 0);
                round!($base, 1);
                round!($base, 2);
                round!($base, 3);
                round!($base, 4);
                round!($base, 5);
                round!($base, 6);
                round!($base, 7);
                round!($base, 8);
                round!($base, 9);
                round!($base, 10);
                round!($base, 11);
                round!($base, 12);
                round!($base, 13);
                round!($base, 14);
                round!($base, 15);
            }};
        }
        sixteen!(0);
        sixteen!(16);
        sixteen!(32);
        sixteen!(48);
        for (s, v) in st.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = add(*s, v);
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
    fn every_way_count_and_tag_equals_the_plain_hash() {
        let mut out = Vec::new();
        // Up to 40: whole sixteens, and remainders above and below X16_MIN.
        for &lanes in Lanes::available() {
            for n in 0..=40 {
                for tag in [0u8, 1, 0xFF] {
                    let pairs = inputs(n);
                    sha256_tag_pairs_by(lanes, tag, &pairs, &mut out);
                    assert_eq!(out.len(), n);
                    for ((a, b), h) in pairs.iter().zip(&out) {
                        assert_eq!(*h, sha256(&[&[tag][..], a, b].concat()), "{lanes:?} n {n} tag {tag}");
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_words_equal_the_plain_hash() {
        // All-ones and all-zero inputs exercise the carries of every add.
        let four = [([0xFF; 32], [0xFF; 32]), ([0; 32], [0; 32]), ([0xFF; 32], [0; 32]), ([0; 32], [0xFF; 32])];
        let pairs: Vec<(Hash, Hash)> = four.iter().cycle().take(16).copied().collect();
        let mut out = Vec::new();
        for &lanes in Lanes::available() {
            sha256_tag_pairs_by(lanes, 0xFF, &pairs, &mut out);
            for ((a, b), h) in pairs.iter().zip(&out) {
                assert_eq!(*h, sha256(&[&[0xFF][..], a, b].concat()), "{lanes:?}");
            }
        }
    }

    #[test]
    fn the_chosen_way_is_one_this_cpu_has() {
        let chosen = Lanes::chosen();
        assert!(Lanes::available().contains(&chosen));
        assert_eq!(Lanes::chosen(), chosen, "decided once");
        #[cfg(target_arch = "x86_64")]
        if std::env::var_os("DAGFOLD_SHA256_LANES").is_none() && Lanes::available().len() > 1 {
            assert_ne!(chosen, Lanes::Sha2, "a CPU with SHA-NI or AVX-512F hashes in lanes");
        }
    }
}
