//! The points, eight at a time on AVX-512 IFMA (`field8`): decompression,
//! `[r]B` compressed, multiscalar sums; the self-test that gates them all.

use super::canonical;
use super::field8::*;
use core::arch::x86_64::*;
use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use std::sync::OnceLock;

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
            base *= Scalar::from(256u16);
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
    let z_inv = invert(z);
    let (x, y) = (store(&mul(x, &z_inv)), store(&mul(y, &z_inv)));
    std::array::from_fn(|j| {
        let (x, y) = (canonical::from_limbs52(&x[j]), canonical::from_limbs52(&y[j]));
        let mut b = canonical::to_bytes(&y);
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
    // as `dalek_point` writes them; `self_test` checks it (its
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
    std::array::from_fn(|j| dalek_point(std::array::from_fn(|f| canonical::from_limbs52(&coords[f][j]))))
}

/// dalek's point of the reduced coordinates `(X, Y, Z, T)`.
fn dalek_point(coords: [[u64; 4]; 4]) -> EdwardsPoint {
    let limbs: [[u64; 5]; 4] = coords.map(|c| canonical::limbs51(&c));
    let flat: [u64; 20] = std::array::from_fn(|i| limbs[i / 5][i % 5]);
    // SAFETY: `EdwardsPoint` is four 5×u64 field elements (X, Y, Z, T),
    // every bit pattern of which is a value; the transmute cannot read out
    // of bounds (sizes are checked at compile time). That the fields sit in
    // this order is not promised by dalek, and is checked by `self_test`
    // before any of this module is used.
    unsafe { std::mem::transmute::<[u64; 20], EdwardsPoint>(flat) }
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
        Some(dalek_point([xs[j], canonical::from_limbs52(&y[j]), [1, 0, 0, 0], canonical::from_limbs52(&t[j])]))
    })
}
