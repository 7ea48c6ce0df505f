//! Eight field elements modulo `p = 2^255 - 19` in the 64-bit lanes of a
//! 512-bit register, radix 2^52, with AVX-512 IFMA's 52-bit multiply-adds:
//! the arithmetic under `ifma`'s points. Every function needs the CPU's
//! `avx512f` and `avx512ifma` (`ifma::usable` checks them once).

use super::canonical;
use core::arch::x86_64::*;

/// `d = -121665/121666` and `sqrt(-1)` (0x52036cee…978a3 and
/// 0x2b832480…0ea0b0), little-endian words; `field_checks` tests both.
pub(super) const D: [u64; 4] = [0x75eb_4dca_1359_78a3, 0x0070_0a4d_4141_d8ab, 0x8cc7_4079_7779_e898, 0x5203_6cee_2b6f_fe73];
pub(super) const SQRT_M1: [u64; 4] = [0xc4ee_1b27_4a0e_a0b0, 0x2f43_1806_ad2f_e478, 0x2b4d_0099_3dfb_d7a7, 0x2b83_2480_4fc1_df0b];

/// Eight field elements, limb `i` of lane `j` in lane `j` of `self.0[i]`.
/// Invariant between operations: limbs 0–3 below 2^52, limb 4 below
/// 2^48 (IFMA multiplies the low 52 bits of each lane, so a limb must
/// never reach 2^52; a value is below 2^256, not necessarily below p).
#[derive(Clone, Copy)]
pub(super) struct F8(pub(super) [__m512i; 5]);

const M52: i64 = (1 << 52) - 1;
const M47: i64 = (1 << 47) - 1;

#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn splat(x: u64) -> __m512i {
    _mm512_set1_epi64(x as i64)
}

#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn load(lanes: &[[u64; 5]; 8]) -> F8 {
    F8(std::array::from_fn(|i| {
        let col: [u64; 8] = std::array::from_fn(|j| lanes[j][i]);
        _mm512_loadu_si512(col.as_ptr() as *const _)
    }))
}

#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn store(a: &F8) -> [[u64; 5]; 8] {
    let mut cols = [[0u64; 8]; 5];
    for i in 0..5 {
        _mm512_storeu_si512(cols[i].as_mut_ptr() as *mut _, a.0[i]);
    }
    std::array::from_fn(|j| std::array::from_fn(|i| cols[i][j]))
}

/// Limbs below 2^63 back to the invariant: fold the bits from 2^255 up
/// into limb 0 (`2^255 = 19`), then carry once up the limbs.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn normalize(mut t: [__m512i; 5]) -> F8 {
    let m52 = _mm512_set1_epi64(M52);
    let c = _mm512_srli_epi64::<47>(t[4]);
    t[4] = _mm512_and_si512(t[4], _mm512_set1_epi64(M47));
    t[0] = _mm512_madd52lo_epu64(t[0], c, splat(19));
    for k in 0..4 {
        let c = _mm512_srli_epi64::<52>(t[k]);
        t[k] = _mm512_and_si512(t[k], m52);
        t[k + 1] = _mm512_add_epi64(t[k + 1], c);
    }
    F8(t)
}

/// `a·b`: ten column sums of 52-bit partial products (each below 2^56),
/// then `reduce`: carried, the upper five folded down with
/// `2^260 = 2^5·19 = 608`.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn mul(a: &F8, b: &F8) -> F8 {
    let mut z = [_mm512_setzero_si512(); 10];
    for i in 0..5 {
        for j in 0..5 {
            z[i + j] = _mm512_madd52lo_epu64(z[i + j], a.0[i], b.0[j]);
            z[i + j + 1] = _mm512_madd52hi_epu64(z[i + j + 1], a.0[i], b.0[j]);
        }
    }
    reduce(z)
}

/// Ten column sums (each below 2^57) of a product to the invariant.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn reduce(mut z: [__m512i; 10]) -> F8 {
    let m52 = _mm512_set1_epi64(M52);
    for k in 0..9 {
        let c = _mm512_srli_epi64::<52>(z[k]);
        z[k] = _mm512_and_si512(z[k], m52);
        z[k + 1] = _mm512_add_epi64(z[k + 1], c);
    }
    // z[9] < 2^45 (limb 4 of both inputs < 2^48), so 608·z[9] < 2^55:
    // its high part (at 2^260 again) is folded once more below.
    let c608 = splat(608);
    let mut t = [z[0], z[1], z[2], z[3], z[4]];
    for k in 5..10 {
        t[k - 5] = _mm512_madd52lo_epu64(t[k - 5], z[k], c608);
        if k < 9 {
            t[k - 4] = _mm512_madd52hi_epu64(t[k - 4], z[k], c608);
        }
    }
    let h = _mm512_madd52hi_epu64(_mm512_setzero_si512(), z[9], c608);
    t[0] = _mm512_madd52lo_epu64(t[0], h, c608);
    normalize(t)
}

/// `a²`: the cross products once, doubled (15 products instead of 25).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn square(a: &F8) -> F8 {
    let mut cross = [_mm512_setzero_si512(); 10];
    for i in 0..5 {
        for j in i + 1..5 {
            cross[i + j] = _mm512_madd52lo_epu64(cross[i + j], a.0[i], a.0[j]);
            cross[i + j + 1] = _mm512_madd52hi_epu64(cross[i + j + 1], a.0[i], a.0[j]);
        }
    }
    // Each column: at most four cross terms (< 2^54, doubled < 2^55)
    // plus two square terms.
    let mut z: [__m512i; 10] = std::array::from_fn(|k| _mm512_slli_epi64::<1>(cross[k]));
    for i in 0..5 {
        z[2 * i] = _mm512_madd52lo_epu64(z[2 * i], a.0[i], a.0[i]);
        z[2 * i + 1] = _mm512_madd52hi_epu64(z[2 * i + 1], a.0[i], a.0[i]);
    }
    reduce(z)
}

#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn square_n(a: &F8, n: u32) -> F8 {
    let mut x = *a;
    for _ in 0..n {
        x = square(&x);
    }
    x
}

/// `a - b`, as `a + 4p - b` (4p's limbs exceed any limb of `b`).
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn sub(a: &F8, b: &F8) -> F8 {
    let four_p: [u64; 5] = [(1 << 54) - 76, (1 << 54) - 4, (1 << 54) - 4, (1 << 54) - 4, (1 << 49) - 4];
    normalize(std::array::from_fn(|i| _mm512_sub_epi64(_mm512_add_epi64(a.0[i], splat(four_p[i])), b.0[i])))
}

#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn add(a: &F8, b: &F8) -> F8 {
    normalize(std::array::from_fn(|i| _mm512_add_epi64(a.0[i], b.0[i])))
}

#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn add_one(a: &F8) -> F8 {
    let mut t = a.0;
    t[0] = _mm512_add_epi64(t[0], splat(1));
    normalize(t)
}

#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn constant(c: &[u64; 4]) -> F8 {
    let l = canonical::limbs52(c);
    F8(std::array::from_fn(|i| splat(l[i])))
}

/// `x^(p - 2) = (x^(2^252 - 3))^8 · x^3`, the inverse of `x` (0 for 0).
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn invert(x: &F8) -> F8 {
    mul(&square_n(&pow_p58(x), 3), &mul(&square(x), x))
}

/// `x^(2^252 - 3)`, the addition chain of RFC 8032's square root.
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn pow_p58(x: &F8) -> F8 {
    let t0 = square(x); // 2
    let t1 = square_n(&t0, 2); // 8
    let t2 = mul(x, &t1); // 9
    let t3 = mul(&t0, &t2); // 11
    let t4 = square(&t3); // 22
    let t5 = mul(&t2, &t4); // 31 = 2^5 - 1
    let t7 = mul(&square_n(&t5, 5), &t5); // 2^10 - 1
    let t9 = mul(&square_n(&t7, 10), &t7); // 2^20 - 1
    let t11 = mul(&square_n(&t9, 20), &t9); // 2^40 - 1
    let t13 = mul(&square_n(&t11, 10), &t7); // 2^50 - 1
    let t15 = mul(&square_n(&t13, 50), &t13); // 2^100 - 1
    let t17 = mul(&square_n(&t15, 100), &t15); // 2^200 - 1
    let t19 = mul(&square_n(&t17, 50), &t13); // 2^250 - 1
    mul(&square_n(&t19, 2), x) // 2^252 - 3
}

#[cfg(test)]
pub(crate) fn field_checks() {
    // SAFETY: the caller checked the CPU features.
    unsafe {
        let s = constant(&SQRT_M1);
        let sq = store(&mul(&s, &s));
        assert_eq!(canonical::from_limbs52(&sq[0]), canonical::neg(&[1, 0, 0, 0]), "sqrt(-1)^2 = -1");
        // d·121666 = -121665
        let d = constant(&D);
        let k = constant(&[121666, 0, 0, 0]);
        let dk = store(&mul(&d, &k));
        assert_eq!(canonical::from_limbs52(&dk[3]), canonical::neg(&[121665, 0, 0, 0]), "d = -121665/121666");
        // Full 52-bit limbs: (2^104 - 1)² = 2^208 - 2^105 + 1 < p, so
        // the product needs no reduction and must equal u128 arithmetic.
        let x = (1u128 << 104) - 1;
        let a = [(1u64 << 52) - 1, (1 << 52) - 1, 0, 0, 0];
        let av = F8(std::array::from_fn(|i| splat(a[i])));
        let aa = store(&mul(&av, &av));
        assert_eq!(store(&square(&av))[0], aa[0]);
        assert_eq!(canonical::from_limbs52(&aa[0]), square_words(x));
        // The largest value the invariant allows, 2^256 - 1 = 2p + 37,
        // squared: 37² = 1369.
        let b = [(1u64 << 52) - 1, (1 << 52) - 1, (1 << 52) - 1, (1 << 52) - 1, (1 << 48) - 1];
        let bv = F8(std::array::from_fn(|i| splat(b[i])));
        let bb = store(&mul(&bv, &bv));
        assert_eq!(store(&square(&bv))[0], bb[0]);
        assert_eq!(canonical::from_limbs52(&bb[0]), [1369, 0, 0, 0]);
    }
}

#[cfg(test)]
fn square_words(x: u128) -> [u64; 4] {
    // x² for x < 2^128 as 256-bit words.
    let (a1, a0) = ((x >> 64) as u64 as u128, x as u64 as u128);
    let p00 = a0 * a0;
    let p01 = a0 * a1;
    let p11 = a1 * a1;
    let mut w = [0u128; 5];
    w[0] = p00 & u64::MAX as u128;
    w[1] = (p00 >> 64) + 2 * (p01 & u64::MAX as u128);
    w[2] = 2 * (p01 >> 64) + (p11 & u64::MAX as u128);
    w[3] = p11 >> 64;
    for i in 0..4 {
        let c = w[i] >> 64;
        w[i] &= u64::MAX as u128;
        w[i + 1] += c;
    }
    [w[0] as u64, w[1] as u64, w[2] as u64, w[3] as u64]
}
