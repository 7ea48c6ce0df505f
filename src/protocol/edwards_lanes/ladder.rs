//! X25519 (RFC 7748) of one secret with eight `u`-coordinates at a time,
//! one per lane of `field8`: the Montgomery ladder of the RFC, whose
//! conditional swaps follow the secret's bits, which are the same in
//! every lane, so a swap is a masked exchange of whole registers. Neither
//! the time nor the memory touched depends on the secret or the points:
//! no branch or index on them, the final reduction by masks too.

use super::canonical;
use super::field8::{add, constant, load, mul, pow_p58, splat, square, square_n, store, sub, F8};
use core::arch::x86_64::*;

/// `x25519(secret, u)` for each of `us` (up to eight; the rest of the
/// lanes repeat the first), as `x25519_dalek`'s `diffie_hellman` gives it.
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) unsafe fn x25519_8(secret: &[u8; 32], us: &[[u8; 32]]) -> Vec<[u8; 32]> {
    debug_assert!(!us.is_empty() && us.len() <= 8);
    let mut k = *secret;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    let lanes: [[u64; 5]; 8] = std::array::from_fn(|j| canonical::limbs52_from_bytes(&us[j.min(us.len() - 1)]));
    let x1 = load(&lanes);
    let one = constant(&[1, 0, 0, 0]);
    let zero = constant(&[0, 0, 0, 0]);
    let a24 = constant(&[121_665, 0, 0, 0]);
    let (mut x2, mut z2, mut x3, mut z3) = (one, zero, x1, one);
    let mut swap = 0u64;
    for t in (0..255).rev() {
        let bit = ((k[t / 8] >> (t % 8)) & 1) as u64;
        swap ^= bit;
        cswap(&mut x2, &mut x3, swap);
        cswap(&mut z2, &mut z3, swap);
        swap = bit;
        let a = add(&x2, &z2);
        let aa = square(&a);
        let b = sub(&x2, &z2);
        let bb = square(&b);
        let e = sub(&aa, &bb);
        let c = add(&x3, &z3);
        let d = sub(&x3, &z3);
        let da = mul(&d, &a);
        let cb = mul(&c, &b);
        x3 = square(&add(&da, &cb));
        z3 = mul(&x1, &square(&sub(&da, &cb)));
        x2 = mul(&aa, &bb);
        z2 = mul(&e, &add(&aa, &mul(&a24, &e)));
    }
    cswap(&mut x2, &mut x3, swap);
    cswap(&mut z2, &mut z3, swap);
    // z2^(p-2) = (z2^(2^252-3))^8 · z2^3; z2 = 0 gives 0, as the RFC's does.
    let z_inv = mul(&square_n(&pow_p58(&z2), 3), &mul(&square(&z2), &z2));
    let out = store(&mul(&x2, &z_inv));
    (0..us.len())
        .map(|j| {
            let w = reduce_ct(&out[j]);
            let mut b = [0u8; 32];
            for (i, x) in w.iter().enumerate() {
                b[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
            }
            b
        })
        .collect()
}

/// Exchanges `a` and `b` when `swap` is 1, by masks.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn cswap(a: &mut F8, b: &mut F8, swap: u64) {
    let mask = splat(swap.wrapping_neg());
    for i in 0..5 {
        let t = _mm512_and_si512(mask, _mm512_xor_si512(a.0[i], b.0[i]));
        a.0[i] = _mm512_xor_si512(a.0[i], t);
        b.0[i] = _mm512_xor_si512(b.0[i], t);
    }
}

/// The reduced value of limbs in `field8`'s invariant (below 2^256, so
/// below 3p), with two masked subtractions of `p`: the shared secret's
/// reduction takes the same time whatever its value.
fn reduce_ct(l: &[u64; 5]) -> [u64; 4] {
    let mut w = [l[0] | l[1] << 52, l[1] >> 12 | l[2] << 40, l[2] >> 24 | l[3] << 28, l[3] >> 36 | l[4] << 16];
    for _ in 0..2 {
        let mut d = [0u64; 4];
        let mut borrow = 0u64;
        for i in 0..4 {
            let (x, b1) = w[i].overflowing_sub(canonical::P[i]);
            let (x, b2) = x.overflowing_sub(borrow);
            d[i] = x;
            borrow = (b1 | b2) as u64;
        }
        // No borrow: w ≥ p, take w - p.
        let take = borrow.wrapping_sub(1);
        for i in 0..4 {
            w[i] = (d[i] & take) | (w[i] & !take);
        }
    }
    w
}
