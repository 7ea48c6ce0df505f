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

/// `x25519(secret, u)` (RFC 7748, `x25519_dalek::x25519`) for each of
/// `us`, in order: a node opening the key deliveries of a batch. On the
/// IFMA path eight `u` at a time run one Montgomery ladder in the lanes,
/// in constant time (`ladder`); a lone one takes dalek's serial ladder,
/// which a row of eight lanes costs more than.
pub fn x25519_many(secret: &[u8; 32], us: &[[u8; 32]]) -> Vec<[u8; 32]> {
    #[cfg(target_arch = "x86_64")]
    if us.len() >= 2 && ladder_usable() {
        let mut out = Vec::with_capacity(us.len());
        for chunk in us.chunks(8) {
            if chunk.len() == 1 {
                out.push(x25519_dalek::x25519(*secret, chunk[0]));
            } else {
                // SAFETY: ladder_usable() saw the CPU features.
                out.extend(unsafe { ladder::x25519_8(secret, chunk) });
            }
        }
        return out;
    }
    us.iter().map(|u| x25519_dalek::x25519(*secret, *u)).collect()
}

/// Whether the lanes' ladder may be used: the CPU has IFMA, and before
/// first use the ladder gave dalek's results for a few inputs (RFC 7748's
/// vectors among them).
#[cfg(target_arch = "x86_64")]
fn ladder_usable() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        if !ifma::usable() {
            return false;
        }
        let secret: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(29).wrapping_add(7));
        let us: Vec<[u8; 32]> = (0..8u8).map(|j| std::array::from_fn(|i| (i as u8 ^ j).wrapping_mul(13).wrapping_add(j))).collect();
        // SAFETY: ifma::usable() saw the CPU features.
        let ok = unsafe { ladder::x25519_8(&secret, &us) } == us.iter().map(|u| x25519_dalek::x25519(secret, *u)).collect::<Vec<_>>();
        if !ok {
            eprintln!("dagfold: the IFMA X25519 ladder disagreed with x25519-dalek's; using dalek's");
        }
        ok
    })
}

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

mod canonical;
#[cfg(target_arch = "x86_64")]
mod field8;
#[cfg(target_arch = "x86_64")]
mod ifma;
#[cfg(target_arch = "x86_64")]
mod ladder;

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
            field8::field_checks();
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
        encodings.extend(edge_encodings());
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

    /// The field's edge values 0, 1, -1, p, p + 1 and 2^255 - 1, each also
    /// with the top bit set.
    fn edge_encodings() -> Vec<[u8; 32]> {
        let p = canonical::P;
        let mut out = Vec::new();
        for w in [[0, 0, 0, 0], [1, 0, 0, 0], canonical::neg(&[1, 0, 0, 0]), p, [p[0] + 1, p[1], p[2], p[3]], [u64::MAX, u64::MAX, u64::MAX, u64::MAX >> 1]] {
            let b = canonical::to_bytes(&w);
            let mut top = b;
            top[31] |= 0x80;
            out.extend([b, top]);
        }
        out
    }

    /// X25519 in the lanes gives `x25519_dalek::x25519`'s result: RFC
    /// 7748's vectors, `u` of every edge (0, 1, p - 1, p, p + 1, above p,
    /// the top bit set, points of small order, points on the twist) and
    /// random ones, in batches of every length around eight.
    #[test]
    fn x25519_in_lanes_is_dalek_s() {
        let h = |s: &str| -> [u8; 32] { hex::decode(s).unwrap().try_into().unwrap() };
        let rfc = [
            ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4", "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c", "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
            ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d", "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493", "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
        ];
        for (k, u, out) in rfc {
            assert_eq!(x25519_many(&h(k), &[h(u), h(u)]), vec![h(out), h(out)], "RFC 7748 §5.2");
        }
        let mut us = edge_encodings();
        // Two points of small order (libsodium's blocklist) and 2, which
        // is on the twist.
        us.push(h("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"));
        us.push(h("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"));
        us.push(canonical::to_bytes(&[2, 0, 0, 0]));
        let mut rng = rand::rngs::StdRng::seed_from_u64(25519);
        us.extend((0..40).map(|_| rng.gen::<[u8; 32]>()));
        for secret in [rng.gen::<[u8; 32]>(), [0u8; 32], [0xff; 32]] {
            for n in [us.len(), 1, 2, 7, 8, 9, 17] {
                let want: Vec<[u8; 32]> = us[..n].iter().map(|u| x25519_dalek::x25519(secret, *u)).collect();
                assert_eq!(x25519_many(&secret, &us[..n]), want, "{n} points, secret {}", hex::encode(secret));
            }
        }
    }
}
