//! X25519 (RFC 7748) of one secret with eight `u`-coordinates at a time,
//! one per lane of `field8`: the Montgomery ladder of the RFC, whose
//! conditional swaps follow the secret's bits, which are the same in
//! every lane, so a swap is a masked exchange of whole registers. Neither
//! the time nor the memory touched depends on the secret or the points:
//! no branch or index on them, the final reduction by masks too
//! (`canonical::from_limbs52_ct`).

use super::canonical;
use super::field8::{add, constant, invert, load, mul, splat, square, store, sub, F8};
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
    // z2 = 0 (u of small order) gives 0, as the RFC's ladder does.
    let out = store(&mul(&x2, &invert(&z2)));
    (0..us.len()).map(|j| canonical::to_bytes(&canonical::from_limbs52_ct(&out[j]))).collect()
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
