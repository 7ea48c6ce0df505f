//! Edwards point decompression, multiples of the basepoint and multiscalar
//! sums, eight at a time with AVX-512 IFMA.
//!
//! Decompressing `R` is the square root `x = sqrt((y² - 1) / (d·y² + 1))`:
//! about 254 field squarings in a chain, which `curve25519-dalek` runs in
//! serial 51-bit arithmetic. In a batch of 64 signatures by one key that
//! was 41% of the verification time (3.85 of 9.33 µs per signature), as
//! much as the whole AVX2 multiscalar multiplication. dalek's own IFMA
//! backend needs a nightly compiler; the IFMA intrinsics themselves are
//! stable, so this module runs the same chain in radix 2^52 on the eight
//! 64-bit lanes of a 512-bit register, one point per lane: 0.70 µs per
//! point against dalek's 3.42 (`cargo bench --bench verify -- decompress`,
//! AMD EPYC), and the batch of 64 one-key signatures 9.37 → 6.80 µs each.
//!
//! The result must be dalek's `EdwardsPoint`, whose coordinates are private.
//! It is built from the four coordinates `(X : Y : 1 : X·Y)` in dalek's
//! 51-bit limbs by a transmute, which depends on the layout of that struct:
//! so before the first use a self-test decompresses known points both ways
//! and compares them (equality, compression, addition, the cofactor
//! multiple); if anything differs, or the CPU lacks IFMA, every call takes
//! dalek's `decompress` instead. Either way the answer is exactly
//! `CompressedEdwardsY(bytes).decompress()` for every input
//! (`tests` below and `tests/signatures.rs` compare them).
//!
//! A node signing its own ops needs `R = [r]B` for each: dalek's
//! fixed-base multiplication (64 additions of table entries, in serial
//! arithmetic) was ~46% of the projector's time in `tools/bench
//! api_writes`. `mul_base_many` runs the same method eight scalars at a
//! time in the lanes, in constant time, and hands out only the compressed
//! `R`, which the signature publishes; the self-test also compares it with
//! dalek's before first use.
//!
//! A batch verification ends in one multiscalar sum of its `R`s, keys and
//! the basepoint (`sig`'s `Batch::holds`), which dalek 4.1 runs in AVX2.
//! `vartime_multiscalar_mul` puts eight points to a row, one per lane, the
//! rows sharing the doublings, and hands the eight lane sums to dalek to
//! add. The points go into the lanes and back by the same transmute, so
//! the self-test compares sums with dalek's too. (curve25519-dalek 5.0 has
//! an IFMA backend on stable Rust behind a crate-wide `--cfg`; in a scratch
//! measurement its multiscalar sum was 1.29× dalek 4.1's; with the lanes
//! here a whole batch of 64 distinct keys verified 1.6–2.5× faster.)

use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;

/// `CompressedEdwardsY(b).decompress()` for each `b`, in order.
pub fn decompress_many(encodings: &[[u8; 32]]) -> Vec<Option<EdwardsPoint>> {
    #[cfg(target_arch = "x86_64")]
    if ifma::usable() {
        return ifma::decompress_many(encodings);
    }
    encodings.iter().map(|b| CompressedEdwardsY(*b).decompress()).collect()
}

/// `EdwardsPoint::mul_base(s).compress()` for each scalar, in order: a
/// node signing a commit's ops computes every `R = [r]B` here. On the IFMA
/// path eight scalars are multiplied at once, one per lane, with dalek's
/// radix-16 method and a table of the same multiples of `B`, and the eight
/// points are compressed with one field inversion. dalek's serial `[r]B`
/// was ~46% of the projector's time in `tools/bench api_writes`.
pub fn mul_base_many(scalars: &[Scalar]) -> Vec<[u8; 32]> {
    #[cfg(target_arch = "x86_64")]
    if ifma::usable() {
        return ifma::mul_base_many(scalars);
    }
    scalars.iter().map(|r| EdwardsPoint::mul_base(r).compress().to_bytes()).collect()
}

/// `Σ [scalars[i]] points[i]`, the value of dalek's
/// `EdwardsPoint::vartime_multiscalar_mul` (its coordinates may differ by a
/// common factor), in variable time: for batch verification, where every
/// input is public. On the IFMA path the points go eight to a row, one per
/// lane, and the row shares the doublings: each lane sums its points with
/// signed radix-16 digits from a table of their first eight multiples, so a
/// 128-bit coefficient (a signature's `z`) costs 33 additions and a row of
/// eight of them as much as one. Fewer than `LANES_FROM` points take
/// dalek's, which wastes no lanes.
pub fn vartime_multiscalar_mul(scalars: &[Scalar], points: &[EdwardsPoint]) -> EdwardsPoint {
    assert_eq!(scalars.len(), points.len(), "one scalar a point");
    #[cfg(target_arch = "x86_64")]
    if points.len() >= LANES_FROM && ifma::usable() {
        return ifma::multiscalar(scalars, points);
    }
    use curve25519_dalek::traits::VartimeMultiscalarMul;
    EdwardsPoint::vartime_multiscalar_mul(scalars.iter(), points.iter())
}

/// Below this many points dalek's multiscalar multiplication is the
/// quicker: a row of eight lanes costs the same with one point in it.
const LANES_FROM: usize = 16;

/// Whether `decompress_many` takes the IFMA path on this machine.
pub fn accelerated() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        ifma::usable()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Field elements modulo `p = 2^255 - 19` as four little-endian 64-bit
/// words, fully reduced: the scalar side of the conversions.
mod canonical {
    pub const P: [u64; 4] = [0xffff_ffff_ffff_ffed, u64::MAX, u64::MAX, 0x7fff_ffff_ffff_ffff];
    const M52: u64 = (1 << 52) - 1;
    const M51: u64 = (1 << 51) - 1;

    fn geq(a: &[u64; 4], b: &[u64; 4]) -> bool {
        for i in (0..4).rev() {
            if a[i] != b[i] {
                return a[i] > b[i];
            }
        }
        true
    }

    fn sub(a: &[u64; 4], b: &[u64; 4]) -> [u64; 4] {
        let mut out = [0u64; 4];
        let mut borrow = 0u64;
        for i in 0..4 {
            let (d, b1) = a[i].overflowing_sub(b[i]);
            let (d, b2) = d.overflowing_sub(borrow);
            out[i] = d;
            borrow = (b1 | b2) as u64;
        }
        out
    }

    /// The low 255 bits of `bytes` as radix-2^52 limbs (limb 4 < 2^47), as
    /// dalek's `FieldElement::from_bytes` reads them (no reduction).
    pub fn limbs52_from_bytes(bytes: &[u8; 32]) -> [u64; 5] {
        let mut w: [u64; 4] = std::array::from_fn(|i| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()));
        w[3] &= 0x7fff_ffff_ffff_ffff;
        limbs52(&w)
    }

    /// Limbs of a value below 2^255 in radix 2^52.
    pub fn limbs52(w: &[u64; 4]) -> [u64; 5] {
        [w[0] & M52, (w[0] >> 52 | w[1] << 12) & M52, (w[1] >> 40 | w[2] << 24) & M52, (w[2] >> 28 | w[3] << 36) & M52, w[3] >> 16]
    }

    /// The reduced value of radix-2^52 limbs with limbs 0–3 < 2^52 and
    /// limb 4 < 2^48 (so the value is below 2^256 < 3p).
    pub fn from_limbs52(l: &[u64; 5]) -> [u64; 4] {
        debug_assert!(l[..4].iter().all(|x| *x <= M52) && l[4] < 1 << 48);
        let mut w = [l[0] | l[1] << 52, l[1] >> 12 | l[2] << 40, l[2] >> 24 | l[3] << 28, l[3] >> 36 | l[4] << 16];
        while geq(&w, &P) {
            w = sub(&w, &P);
        }
        w
    }

    /// `-x mod p` of a reduced `x`.
    pub fn neg(x: &[u64; 4]) -> [u64; 4] {
        if *x == [0; 4] {
            *x
        } else {
            sub(&P, x)
        }
    }

    /// The reduced value of dalek's radix-2^51 limbs (each below 2^63, as
    /// dalek keeps them between operations: below 2^52): the points of a
    /// batch verification going into the lanes.
    pub fn from_limbs51(l: &[u64; 5]) -> [u64; 4] {
        // The value, below 2^267, in five words.
        let mut w = [0u64; 5];
        for (i, &limb) in l.iter().enumerate() {
            let (word, shift) = ((51 * i) / 64, (51 * i) % 64);
            let v = (limb as u128) << shift;
            let mut carry = 0u128;
            for (k, part) in [v as u64, (v >> 64) as u64].into_iter().enumerate() {
                let t = w[word + k] as u128 + part as u128 + carry;
                w[word + k] = t as u64;
                carry = t >> 64;
            }
            let mut k = word + 2;
            while k < 5 {
                let t = w[k] as u128 + carry;
                w[k] = t as u64;
                carry = t >> 64;
                k += 1;
            }
        }
        // Fold the bits from 2^255 up (2^255 = 19 mod p), twice: the first
        // fold leaves at most one bit there.
        let mut r = [w[0], w[1], w[2], w[3]];
        let mut high = (w[3] >> 63) as u128 | (w[4] as u128) << 1;
        for _ in 0..2 {
            r[3] &= 0x7fff_ffff_ffff_ffff;
            let mut carry = high * 19;
            for x in r.iter_mut() {
                let t = *x as u128 + (carry & u64::MAX as u128);
                *x = t as u64;
                carry = (carry >> 64) + (t >> 64);
            }
            high = (r[3] >> 63) as u128;
        }
        while geq(&r, &P) {
            r = sub(&r, &P);
        }
        r
    }

    /// dalek's radix-2^51 limbs of a reduced value.
    pub fn limbs51(w: &[u64; 4]) -> [u64; 5] {
        [w[0] & M51, (w[0] >> 51 | w[1] << 13) & M51, (w[1] >> 38 | w[2] << 26) & M51, (w[2] >> 25 | w[3] << 39) & M51, (w[3] >> 12) & M51]
    }

}

#[cfg(target_arch = "x86_64")]
mod ifma {
    use super::canonical;
    use core::arch::x86_64::*;
    use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
    use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
    use curve25519_dalek::scalar::Scalar;
    use std::sync::OnceLock;

    /// `d = -121665/121666` and `sqrt(-1)` (0x52036cee…978a3 and
    /// 0x2b832480…0ea0b0), little-endian words; `field_checks` tests both.
    const D: [u64; 4] = [0x75eb_4dca_1359_78a3, 0x0070_0a4d_4141_d8ab, 0x8cc7_4079_7779_e898, 0x5203_6cee_2b6f_fe73];
    const SQRT_M1: [u64; 4] = [0xc4ee_1b27_4a0e_a0b0, 0x2f43_1806_ad2f_e478, 0x2b4d_0099_3dfb_d7a7, 0x2b83_2480_4fc1_df0b];

    /// Eight field elements, limb `i` of lane `j` in lane `j` of `self.0[i]`.
    /// Invariant between operations: limbs 0–3 below 2^52, limb 4 below
    /// 2^48 (IFMA multiplies the low 52 bits of each lane, so a limb must
    /// never reach 2^52; a value is below 2^256, not necessarily below p).
    #[derive(Clone, Copy)]
    struct F8([__m512i; 5]);

    pub fn usable() -> bool {
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| {
            if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512ifma")) {
                return false;
            }
            let ok = self_test();
            if !ok {
                eprintln!("dagfold: the IFMA point decompression disagreed with curve25519-dalek's; using dalek's");
            }
            ok
        })
    }

    /// Known encodings decompressed both ways, the points compared through
    /// dalek's own arithmetic (which reads every coordinate).
    fn self_test() -> bool {
        let mut encodings: Vec<[u8; 32]> = Vec::new();
        let mut p = ED25519_BASEPOINT_POINT;
        for _ in 0..20 {
            encodings.push(p.compress().to_bytes());
            encodings.push((-p).compress().to_bytes());
            p = p + p + ED25519_BASEPOINT_POINT;
        }
        for i in 0..8u8 {
            let mut b = [i.wrapping_mul(37); 32];
            b[31] &= 0x7f;
            encodings.push(b); // mostly not on the curve
        }
        // SAFETY: usable() checked the CPU features before the self-test.
        let fast = unsafe { decompress_all(&encodings) };
        // [r]B of scalars with every digit pattern at the ends: 0, 1, the
        // largest, and a spread of others.
        let mut scalars = vec![Scalar::ZERO, Scalar::ONE, -Scalar::ONE, Scalar::from(8u8), Scalar::from(9u8)];
        scalars.extend((0..19u64).map(|i| Scalar::from_bytes_mod_order(std::array::from_fn(|k| (k as u64 * 131 + i * 17 + 3) as u8))));
        // SAFETY: as above.
        let products = unsafe { mul_base_all(&scalars) };
        if scalars.iter().zip(&products).any(|(r, c)| EdwardsPoint::mul_base(r).compress().to_bytes() != *c) {
            return false;
        }
        // Multiscalar sums of points with and without torsion parts, with
        // zero, 128-bit and full-width scalars, against dalek's.
        let mut points: Vec<EdwardsPoint> = Vec::new();
        let mut q = ED25519_BASEPOINT_POINT;
        for i in 0..19u8 {
            points.push(q + curve25519_dalek::constants::EIGHT_TORSION[(i % 8) as usize]);
            q = q + q + ED25519_BASEPOINT_POINT;
        }
        let scalars: Vec<Scalar> = (0..19u8)
            .map(|i| match i % 3 {
                0 => Scalar::from(i as u64 * 0x1234_5678_9abc_def1),
                1 => Scalar::from_bytes_mod_order(std::array::from_fn(|k| if k < 16 { i ^ (k as u8 * 29) } else { 0 })),
                _ => -Scalar::from_bytes_mod_order([i.wrapping_mul(101); 32]),
            })
            .chain([Scalar::ZERO])
            .collect();
        points.push(ED25519_BASEPOINT_POINT);
        for n in [points.len(), 9, 8] {
            use curve25519_dalek::traits::VartimeMultiscalarMul;
            // SAFETY: as above.
            let sum = unsafe { multiscalar_lanes(&scalars[..n], &points[..n]) };
            if sum.compress() != EdwardsPoint::vartime_multiscalar_mul(&scalars[..n], &points[..n]).compress() {
                return false;
            }
        }
        let three = Scalar::from(3u8);
        encodings.iter().zip(&fast).all(|(b, f)| match (CompressedEdwardsY(*b).decompress(), f) {
            (None, None) => true,
            (Some(d), Some(f)) => {
                d == *f
                    && f.compress().to_bytes() == *b
                    && (d + f).compress() == (d + d).compress()
                    && (f * three).compress() == (d * three).compress()
                    && f.mul_by_cofactor().compress() == d.mul_by_cofactor().compress()
            }
            _ => false,
        })
    }

    pub fn decompress_many(encodings: &[[u8; 32]]) -> Vec<Option<EdwardsPoint>> {
        // SAFETY: only called once usable() has seen the CPU features.
        unsafe { decompress_all(encodings) }
    }

    pub fn mul_base_many(scalars: &[Scalar]) -> Vec<[u8; 32]> {
        // SAFETY: only called once usable() has seen the CPU features.
        unsafe { mul_base_all(scalars) }
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn mul_base_all(scalars: &[Scalar]) -> Vec<[u8; 32]> {
        let table = basepoint_table();
        let mut out = Vec::with_capacity(scalars.len());
        for chunk in scalars.chunks(8) {
            if chunk.len() == 1 {
                // Eight lanes for one scalar cost more than dalek's serial
                // multiplication (`cargo bench --bench verify -- sign`).
                out.push(EdwardsPoint::mul_base(&chunk[0]).compress().to_bytes());
                continue;
            }
            let lanes: [Scalar; 8] = std::array::from_fn(|j| chunk.get(j).copied().unwrap_or(Scalar::ZERO));
            out.extend_from_slice(&mul_base8(table, &lanes)[..chunk.len()]);
        }
        out
    }

    /// One entry of the table: the affine Niels form `(y + x, y - x,
    /// 2d·x·y)` of a multiple of `B`, each coordinate in radix-2^52 limbs.
    type Niels = [[u64; 5]; 3];

    /// dalek's basepoint table: `table[i][k] = (k + 1)·256^i·B` for `i` in
    /// 0..32 and `k` in 0..8 (30 KiB), computed once with dalek's
    /// arithmetic and decompressed here to affine coordinates.
    fn basepoint_table() -> &'static [[Niels; 8]; 32] {
        static TABLE: OnceLock<Box<[[Niels; 8]; 32]>> = OnceLock::new();
        TABLE.get_or_init(|| {
            let mut encodings = Vec::with_capacity(256);
            let mut base = ED25519_BASEPOINT_POINT;
            for _ in 0..32 {
                let mut multiple = base;
                for _ in 0..8 {
                    encodings.push(multiple.compress().to_bytes());
                    multiple += base;
                }
                base = base * Scalar::from(256u16);
            }
            let mut table = Box::new([[[[0u64; 5]; 3]; 8]; 32]);
            for (group, chunk) in encodings.chunks(8).enumerate() {
                // SAFETY: only reached from mul_base_all, behind usable()'s
                // check of the CPU features (or from its self-test, after it).
                let niels = unsafe { niels8(chunk.try_into().expect("eight multiples a row")) };
                table[group] = niels;
            }
            table
        })
    }

    /// The affine Niels forms of eight points given by their (valid)
    /// encodings.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn niels8(encodings: &[[u8; 32]; 8]) -> [Niels; 8] {
        let (xs, valid, y) = recover_x8(encodings);
        assert!(valid.iter().all(|v| *v), "multiples of B decompress");
        let x = load(&std::array::from_fn(|j| canonical::limbs52(&xs[j])));
        let two_d = mul(&constant(&D), &constant(&[2, 0, 0, 0]));
        let coords = [store(&add(&y, &x)), store(&sub(&y, &x)), store(&mul(&two_d, &mul(&x, &y)))];
        std::array::from_fn(|j| std::array::from_fn(|f| canonical::limbs52(&canonical::from_limbs52(&coords[f][j]))))
    }

    /// The extended coordinates `(X : Y : Z : T)` of eight points.
    type Point8 = [F8; 4];

    /// `[s]B` for the eight scalars, compressed: dalek's
    /// `EdwardsBasepointTable::mul_base` lane by lane. The scalar's signed
    /// radix-16 digits `a_i` in `[-8, 8]` pick `|a_i|·16^i·B` from the table
    /// with a scan of all eight entries and a masked negation, so neither
    /// the time nor the memory touched depends on the secret scalar; the
    /// odd digits are summed first and the sum multiplied by 16. Only the
    /// affine result, which the signature publishes, leaves the lanes.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn mul_base8(table: &[[Niels; 8]; 32], scalars: &[Scalar; 8]) -> [[u8; 32]; 8] {
        let digits: [[i8; 64]; 8] = std::array::from_fn(|j| radix_16(&scalars[j]));
        let digit = |i: usize| _mm512_set_epi64(digits[7][i] as i64, digits[6][i] as i64, digits[5][i] as i64, digits[4][i] as i64, digits[3][i] as i64, digits[2][i] as i64, digits[1][i] as i64, digits[0][i] as i64);
        let (zero, one) = (constant(&[0; 4]), constant(&[1, 0, 0, 0]));
        let mut p: Point8 = [zero, one, one, zero];
        for i in (1..64).step_by(2) {
            p = add_niels(&p, &select(&table[i / 2], digit(i)));
        }
        for _ in 0..4 {
            p = double(&p);
        }
        for i in (0..64).step_by(2) {
            p = add_niels(&p, &select(&table[i / 2], digit(i)));
        }
        compress8(&p[0], &p[1], &p[2])
    }

    /// The signed radix-16 digits of a reduced scalar, as dalek's
    /// `as_radix_16`: nibbles, then recentred from `[0, 16)` to `[-8, 8)`
    /// with carries (the last digit, of a scalar below 2^255, is at most 8),
    /// in the same steps for every value.
    fn radix_16(s: &Scalar) -> [i8; 64] {
        let bytes = s.as_bytes();
        debug_assert!(bytes[31] < 0x80, "a reduced scalar is below 2^255");
        let mut e = [0i8; 64];
        for i in 0..32 {
            e[2 * i] = (bytes[i] & 15) as i8;
            e[2 * i + 1] = (bytes[i] >> 4) as i8;
        }
        for i in 0..63 {
            let carry = (e[i] + 8) >> 4;
            e[i] -= carry << 4;
            e[i + 1] += carry;
        }
        e
    }

    /// `sign(d)·table[|d| - 1]` in each lane (the identity `(1, 1, 0)` for
    /// a zero digit): every entry is read, and a lane keeps the one its
    /// mask picks.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn select(entries: &[Niels; 8], digit: __m512i) -> [F8; 3] {
        let negative = _mm512_cmplt_epi64_mask(digit, _mm512_setzero_si512());
        let magnitude = _mm512_abs_epi64(digit);
        let (zero, one) = (constant(&[0; 4]), constant(&[1, 0, 0, 0]));
        let mut q = [one, one, zero];
        for (k, entry) in entries.iter().enumerate() {
            let pick = _mm512_cmpeq_epi64_mask(magnitude, splat(k as u64 + 1));
            for f in 0..3 {
                for l in 0..5 {
                    q[f].0[l] = _mm512_mask_mov_epi64(q[f].0[l], pick, splat(entry[f][l]));
                }
            }
        }
        let [ypx, ymx, t2d] = &mut q;
        negate_where(negative, ypx, ymx, t2d);
        q
    }

    /// The Niels forms negated in the lanes of `negative`: `-(x, y) =
    /// (-x, y)`, so `y + x` and `y - x` trade places and the `T` term
    /// (`2d·x·y`, `2d·T`) changes sign.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn negate_where(negative: __mmask8, ypx: &mut F8, ymx: &mut F8, t: &mut F8) {
        let minus_t = sub(&constant(&[0; 4]), t);
        let (plus, minus) = (*ypx, *ymx);
        for l in 0..5 {
            ypx.0[l] = _mm512_mask_mov_epi64(plus.0[l], negative, minus.0[l]);
            ymx.0[l] = _mm512_mask_mov_epi64(minus.0[l], negative, plus.0[l]);
            t.0[l] = _mm512_mask_mov_epi64(t.0[l], negative, minus_t.0[l]);
        }
    }

    /// `p + q` for `q` in affine Niels form (dalek's mixed addition, through
    /// the completed point back to extended coordinates).
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn add_niels(p: &Point8, q: &[F8; 3]) -> Point8 {
        let [x, y, z, t] = p;
        let pp = mul(&add(y, x), &q[0]);
        let mm = mul(&sub(y, x), &q[1]);
        let txy2d = mul(t, &q[2]);
        let z2 = add(z, z);
        completed(&sub(&pp, &mm), &add(&pp, &mm), &add(&z2, &txy2d), &sub(&z2, &txy2d))
    }

    /// `2p` (dalek's doubling of the projective point).
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn double(p: &Point8) -> Point8 {
        let [x, y, z, _] = p;
        let (xx, yy, zz) = (square(x), square(y), square(z));
        let x_plus_y_sq = square(&add(x, y));
        let (yy_plus_xx, yy_minus_xx) = (add(&yy, &xx), sub(&yy, &xx));
        completed(&sub(&x_plus_y_sq, &yy_plus_xx), &yy_plus_xx, &yy_minus_xx, &sub(&add(&zz, &zz), &yy_minus_xx))
    }

    /// The completed point `((X : Z), (Y : T))` in extended coordinates.
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn completed(x: &F8, y: &F8, z: &F8, t: &F8) -> Point8 {
        [mul(x, t), mul(y, z), mul(z, t), mul(x, y)]
    }

    /// dalek's `compress` of eight points `(X : Y : Z)`: `x = X/Z`,
    /// `y = Y/Z`, the bytes of `y` with the parity of `x` in the top bit;
    /// `1/Z` as `Z^(p-2) = (Z^(2^252-3))^8 · Z^3`.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn compress8(x: &F8, y: &F8, z: &F8) -> [[u8; 32]; 8] {
        let z_inv = mul(&square_n(&pow_p58(z), 3), &mul(&square(z), z));
        let (x, y) = (store(&mul(x, &z_inv)), store(&mul(y, &z_inv)));
        std::array::from_fn(|j| {
            let (x, y) = (canonical::from_limbs52(&x[j]), canonical::from_limbs52(&y[j]));
            let mut b = [0u8; 32];
            for (i, w) in y.iter().enumerate() {
                b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
            }
            b[31] |= ((x[0] & 1) as u8) << 7;
            b
        })
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn decompress_all(encodings: &[[u8; 32]]) -> Vec<Option<EdwardsPoint>> {
        let mut out = Vec::with_capacity(encodings.len());
        for chunk in encodings.chunks(8) {
            let mut lanes = [[0u8; 32]; 8];
            lanes[..chunk.len()].copy_from_slice(chunk);
            for lane in &mut lanes[chunk.len()..] {
                *lane = ED25519_BASEPOINT_POINT.compress().to_bytes();
            }
            let points = decompress8(&lanes);
            out.extend_from_slice(&points[..chunk.len()]);
        }
        out
    }

    const M52: i64 = (1 << 52) - 1;
    const M47: i64 = (1 << 47) - 1;

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn splat(x: u64) -> __m512i {
        _mm512_set1_epi64(x as i64)
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn load(lanes: &[[u64; 5]; 8]) -> F8 {
        F8(std::array::from_fn(|i| {
            let col: [u64; 8] = std::array::from_fn(|j| lanes[j][i]);
            _mm512_loadu_si512(col.as_ptr() as *const _)
        }))
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn store(a: &F8) -> [[u64; 5]; 8] {
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
    unsafe fn normalize(mut t: [__m512i; 5]) -> F8 {
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
    unsafe fn mul(a: &F8, b: &F8) -> F8 {
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
    unsafe fn reduce(mut z: [__m512i; 10]) -> F8 {
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
    unsafe fn square(a: &F8) -> F8 {
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
    unsafe fn square_n(a: &F8, n: u32) -> F8 {
        let mut x = *a;
        for _ in 0..n {
            x = square(&x);
        }
        x
    }

    /// `a - b`, as `a + 4p - b` (4p's limbs exceed any limb of `b`).
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn sub(a: &F8, b: &F8) -> F8 {
        let four_p: [u64; 5] = [(1 << 54) - 76, (1 << 54) - 4, (1 << 54) - 4, (1 << 54) - 4, (1 << 49) - 4];
        normalize(std::array::from_fn(|i| _mm512_sub_epi64(_mm512_add_epi64(a.0[i], splat(four_p[i])), b.0[i])))
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn add(a: &F8, b: &F8) -> F8 {
        normalize(std::array::from_fn(|i| _mm512_add_epi64(a.0[i], b.0[i])))
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn add_one(a: &F8) -> F8 {
        let mut t = a.0;
        t[0] = _mm512_add_epi64(t[0], splat(1));
        normalize(t)
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn constant(c: &[u64; 4]) -> F8 {
        let l = canonical::limbs52(c);
        F8(std::array::from_fn(|i| splat(l[i])))
    }

    /// `x^(2^252 - 3)`, the addition chain of RFC 8032's square root.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn pow_p58(x: &F8) -> F8 {
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

    pub fn multiscalar(scalars: &[Scalar], points: &[EdwardsPoint]) -> EdwardsPoint {
        // SAFETY: only called once usable() has seen the CPU features.
        unsafe { multiscalar_lanes(scalars, points) }
    }

    /// Projective Niels coordinates `(Y + X, Y - X, Z, 2d·T)` of eight points.
    type PNiels8 = [F8; 4];

    /// The multiscalar sum: row `r` holds points `8r..8r+8` (the identity
    /// with a zero scalar past the end); from the highest digit position
    /// down, the accumulator is multiplied by 16 and each row whose lanes
    /// have a digit there adds its table entries, lane by lane. The eight
    /// lanes' sums are added at the end.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn multiscalar_lanes(scalars: &[Scalar], points: &[EdwardsPoint]) -> EdwardsPoint {
        use curve25519_dalek::traits::Identity;
        let rows = points.len().div_ceil(8);
        let identity = EdwardsPoint::identity();
        let two_d = mul(&constant(&D), &constant(&[2, 0, 0, 0]));
        let mut tables: Vec<[PNiels8; 8]> = Vec::with_capacity(rows);
        let mut digits: Vec<[[i64; 8]; 64]> = Vec::with_capacity(rows);
        // One past the highest position with a digit in any lane.
        let mut top = 0;
        for row in 0..rows {
            let mut d = [[0i64; 8]; 64];
            for (j, s) in scalars.iter().skip(8 * row).take(8).enumerate() {
                for (i, x) in radix_16(s).into_iter().enumerate() {
                    d[i][j] = x as i64;
                    if x != 0 {
                        top = top.max(i + 1);
                    }
                }
            }
            digits.push(d);
            let lanes: [EdwardsPoint; 8] = std::array::from_fn(|j| points.get(8 * row + j).copied().unwrap_or(identity));
            tables.push(pniels_multiples(&to_lanes(&lanes), &two_d));
        }
        let (zero, one) = (constant(&[0; 4]), constant(&[1, 0, 0, 0]));
        let mut acc: Point8 = [zero, one, one, zero];
        let mut started = false;
        for pos in (0..top).rev() {
            if started {
                for _ in 0..4 {
                    acc = double(&acc);
                }
            }
            for (table, d) in tables.iter().zip(&digits) {
                if d[pos] == [0; 8] {
                    continue;
                }
                let digit = _mm512_loadu_si512(d[pos].as_ptr() as *const _);
                acc = add_pniels(&acc, &select_lanes(table, digit));
                started = true;
            }
        }
        from_lanes(&acc).iter().fold(identity, |sum, p| sum + p)
    }

    /// `[1..=8]·P` of each lane's point, in projective Niels form.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn pniels_multiples(p: &Point8, two_d: &F8) -> [PNiels8; 8] {
        let first = to_pniels(p, two_d);
        let mut multiples = [first; 8];
        let mut current = *p;
        for multiple in multiples.iter_mut().skip(1) {
            current = add_pniels(&current, &first);
            *multiple = to_pniels(&current, two_d);
        }
        multiples
    }

    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn to_pniels(p: &Point8, two_d: &F8) -> PNiels8 {
        let [x, y, z, t] = p;
        [add(y, x), sub(y, x), *z, mul(t, two_d)]
    }

    /// `p + q` for `q` in projective Niels form (dalek's addition).
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn add_pniels(p: &Point8, q: &PNiels8) -> Point8 {
        let [x, y, z, t] = p;
        let pp = mul(&add(y, x), &q[0]);
        let mm = mul(&sub(y, x), &q[1]);
        let tt2d = mul(t, &q[3]);
        let zz = mul(z, &q[2]);
        let zz2 = add(&zz, &zz);
        completed(&sub(&pp, &mm), &add(&pp, &mm), &add(&zz2, &tt2d), &sub(&zz2, &tt2d))
    }

    /// `sign(d)·table[|d| - 1]` in each lane (the identity for a zero
    /// digit). Variable time: the inputs are public.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn select_lanes(table: &[PNiels8; 8], digit: __m512i) -> PNiels8 {
        let negative = _mm512_cmplt_epi64_mask(digit, _mm512_setzero_si512());
        let magnitude = _mm512_abs_epi64(digit);
        let (zero, one) = (constant(&[0; 4]), constant(&[1, 0, 0, 0]));
        let mut q = [one, one, one, zero];
        for (k, entry) in table.iter().enumerate() {
            let pick = _mm512_cmpeq_epi64_mask(magnitude, splat(k as u64 + 1));
            if pick == 0 {
                continue;
            }
            for f in 0..4 {
                for l in 0..5 {
                    q[f].0[l] = _mm512_mask_mov_epi64(q[f].0[l], pick, entry[f].0[l]);
                }
            }
        }
        if negative != 0 {
            let [ypx, ymx, _, t2d] = &mut q;
            negate_where(negative, ypx, ymx, t2d);
        }
        q
    }

    /// Eight dalek points into the lanes (each coordinate reduced and
    /// re-cut into 52-bit limbs).
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn to_lanes(points: &[EdwardsPoint; 8]) -> Point8 {
        // SAFETY: `EdwardsPoint` is four 5×u64 field elements (X, Y, Z, T),
        // as `decompress8` writes them; `self_test` checks it (its
        // multiscalar sums read every coordinate).
        let coords: [[u64; 20]; 8] = std::array::from_fn(|j| std::mem::transmute::<EdwardsPoint, [u64; 20]>(points[j]));
        std::array::from_fn(|f| {
            load(&std::array::from_fn(|j| {
                let l: [u64; 5] = std::array::from_fn(|i| coords[j][5 * f + i]);
                canonical::limbs52(&canonical::from_limbs51(&l))
            }))
        })
    }

    /// The lanes' points as dalek's.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn from_lanes(p: &Point8) -> [EdwardsPoint; 8] {
        let coords: [[[u64; 5]; 8]; 4] = std::array::from_fn(|f| store(&p[f]));
        std::array::from_fn(|j| {
            let limbs: [[u64; 5]; 4] = std::array::from_fn(|f| canonical::limbs51(&canonical::from_limbs52(&coords[f][j])));
            let flat: [u64; 20] = std::array::from_fn(|i| limbs[i / 5][i % 5]);
            // SAFETY: as in `decompress8`: every bit pattern of the four
            // field elements is a value, and the layout is self-tested.
            std::mem::transmute::<[u64; 20], EdwardsPoint>(flat)
        })
    }

    /// The affine `x` of eight encodings, fully reduced, whether each
    /// decodes, and their `y` (the low 255 bits): `(ok, x) =
    /// sqrt_ratio_i(y² - 1, d·y² + 1)`, `x` made non-negative and then given
    /// the sign bit.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn recover_x8(encodings: &[[u8; 32]; 8]) -> ([[u64; 4]; 8], [bool; 8], F8) {
        let y = load(&std::array::from_fn(|j| canonical::limbs52_from_bytes(&encodings[j])));
        let one = constant(&[1, 0, 0, 0]);
        let yy = square(&y);
        let u = sub(&yy, &one);
        let v = add_one(&mul(&yy, &constant(&D)));
        let v3 = mul(&square(&v), &v);
        let v7 = mul(&square(&v3), &v);
        let uv3 = mul(&u, &v3);
        let r = mul(&uv3, &pow_p58(&mul(&u, &v7)));
        let check = mul(&v, &square(&r));
        let r_i = mul(&r, &constant(&SQRT_M1));

        let (u, check, r, r_i) = (store(&u), store(&check), store(&r), store(&r_i));
        let mut xs = [[0u64; 4]; 8];
        let mut valid = [false; 8];
        for j in 0..8 {
            let u = canonical::from_limbs52(&u[j]);
            let check = canonical::from_limbs52(&check[j]);
            let mut x = if check == u {
                canonical::from_limbs52(&r[j])
            } else if check == canonical::neg(&u) {
                canonical::from_limbs52(&r_i[j])
            } else {
                continue;
            };
            valid[j] = true;
            if x[0] & 1 == 1 {
                x = canonical::neg(&x); // the non-negative root
            }
            if encodings[j][31] >> 7 == 1 {
                x = canonical::neg(&x);
            }
            xs[j] = x;
        }
        (xs, valid, y)
    }

    /// dalek's `decompress` of eight encodings: `None` where `recover_x8`
    /// finds no square root.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn decompress8(encodings: &[[u8; 32]; 8]) -> [Option<EdwardsPoint>; 8] {
        let (xs, valid, y) = recover_x8(encodings);
        let xv = load(&std::array::from_fn(|j| canonical::limbs52(&xs[j])));
        let t = store(&mul(&xv, &y));
        let y = store(&y);
        std::array::from_fn(|j| {
            if !valid[j] {
                return None;
            }
            let coords = [
                canonical::limbs51(&xs[j]),
                canonical::limbs51(&canonical::from_limbs52(&y[j])),
                [1, 0, 0, 0, 0],
                canonical::limbs51(&canonical::from_limbs52(&t[j])),
            ];
            let flat: [u64; 20] = std::array::from_fn(|i| coords[i / 5][i % 5]);
            // SAFETY: `EdwardsPoint` is four 5×u64 field elements (X, Y, Z,
            // T), every bit pattern of which is a value; the transmute
            // cannot read out of bounds (sizes are checked at compile time).
            // That the fields sit in this order is not promised by dalek,
            // and is checked by `self_test` before this path is used.
            Some(std::mem::transmute::<[u64; 20], EdwardsPoint>(flat))
        })
    }

    #[cfg(test)]
    pub(super) fn field_checks() {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
    use curve25519_dalek::scalar::Scalar;
    use rand::{Rng, SeedableRng};

    fn same(a: &Option<EdwardsPoint>, b: &Option<EdwardsPoint>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a == b && a.compress() == b.compress() && (a + a).compress() == (b + b).compress() && (a + ED25519_BASEPOINT_POINT).compress() == (b + ED25519_BASEPOINT_POINT).compress()
            }
            _ => false,
        }
    }

    #[test]
    fn field_constants_and_products() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512ifma") {
            ifma::field_checks();
            assert!(accelerated(), "the self-test passes on a CPU with IFMA");
        }
    }

    /// `[r]B` compressed, for scalars with extreme digits (all 0, all 15
    /// before recentring, the largest scalar) and random ones, in batches
    /// of every length around a multiple of eight.
    #[test]
    fn multiplies_the_basepoint_as_dalek_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut scalars = vec![Scalar::ZERO, Scalar::ONE, -Scalar::ONE, Scalar::from(8u8), Scalar::from(0x88u8), Scalar::from_bytes_mod_order([0xff; 32]), Scalar::from_bytes_mod_order([0x88; 32]), Scalar::from_bytes_mod_order([0x77; 32])];
        scalars.extend((0..300).map(|_| Scalar::from_bytes_mod_order_wide(&std::array::from_fn(|_| rng.gen()))));
        for n in [0, 1, 7, 8, 9, scalars.len()] {
            let want: Vec<[u8; 32]> = scalars[..n].iter().map(|r| EdwardsPoint::mul_base(r).compress().to_bytes()).collect();
            assert_eq!(mul_base_many(&scalars[..n]), want, "{n} scalars");
        }
    }

    /// Multiscalar sums as batch verification makes them (128-bit and
    /// full-width scalars, points with torsion parts, negated points) in
    /// sizes around the lanes' threshold and rows of eight, equal in value
    /// to dalek's.
    #[test]
    fn multiscalar_sums_equal_dalek() {
        use curve25519_dalek::traits::VartimeMultiscalarMul;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut points: Vec<EdwardsPoint> = Vec::new();
        let mut scalars: Vec<Scalar> = Vec::new();
        for i in 0..300usize {
            let p = EdwardsPoint::mul_base(&Scalar::from_bytes_mod_order_wide(&std::array::from_fn(|_| rng.gen())));
            points.push(match i % 4 {
                0 => p,
                1 => -p,
                2 => p + curve25519_dalek::constants::EIGHT_TORSION[i % 8],
                _ => decompress_many(&[p.compress().to_bytes()])[0].expect("a point decompresses"),
            });
            let mut b: [u8; 32] = rng.gen();
            if i % 3 != 0 {
                b[16..].fill(0); // a 128-bit coefficient
            }
            scalars.push(match i % 11 {
                0 => Scalar::ZERO,
                1 => -Scalar::ONE,
                _ => Scalar::from_bytes_mod_order(b),
            });
        }
        for n in [0, 1, 15, 16, 17, 24, 66, 129, 300] {
            let want = EdwardsPoint::vartime_multiscalar_mul(&scalars[..n], &points[..n]);
            assert_eq!(vartime_multiscalar_mul(&scalars[..n], &points[..n]).compress(), want.compress(), "{n} points");
        }
        // All scalars zero: the identity.
        let zeros = vec![Scalar::ZERO; 40];
        assert_eq!(vartime_multiscalar_mul(&zeros, &points[..40]).compress(), EdwardsPoint::default().compress());
    }

    #[test]
    fn equals_dalek_on_points_and_garbage() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut encodings: Vec<[u8; 32]> = Vec::new();
        for _ in 0..400 {
            let p = ED25519_BASEPOINT_POINT * Scalar::from(rng.gen::<u64>());
            encodings.push(p.compress().to_bytes());
            encodings.push((-p).compress().to_bytes());
            let mut b: [u8; 32] = rng.gen();
            encodings.push(b);
            b[31] ^= 0x80;
            encodings.push(b);
        }
        // Edge encodings: y = 0, 1, -1, p, p+1, 2^255-1, each with both signs,
        // and the eight small-order points.
        let p = canonical::P;
        let bytes_of = |w: [u64; 4]| -> [u8; 32] {
            let mut b = [0u8; 32];
            for i in 0..4 {
                b[8 * i..8 * i + 8].copy_from_slice(&w[i].to_le_bytes());
            }
            b
        };
        for w in [[0, 0, 0, 0], [1, 0, 0, 0], canonical::neg(&[1, 0, 0, 0]), p, [p[0] + 1, p[1], p[2], p[3]], [u64::MAX, u64::MAX, u64::MAX, u64::MAX >> 1]] {
            let b = bytes_of(w);
            encodings.push(b);
            let mut s = b;
            s[31] |= 0x80;
            encodings.push(s);
        }
        for t in curve25519_dalek::constants::EIGHT_TORSION {
            encodings.push(t.compress().to_bytes());
        }
        // Odd lengths exercise the padded last group.
        for n in [encodings.len(), 1, 7, 9, 17] {
            let fast = decompress_many(&encodings[..n]);
            assert_eq!(fast.len(), n);
            for (b, f) in encodings[..n].iter().zip(&fast) {
                assert!(same(&CompressedEdwardsY(*b).decompress(), f), "differs from dalek on {}", hex::encode(b));
            }
        }
        let valid = encodings.iter().filter(|b| CompressedEdwardsY(**b).decompress().is_some()).count();
        assert!(valid > 800 && valid < encodings.len(), "both kinds are covered: {valid}");
    }
}
