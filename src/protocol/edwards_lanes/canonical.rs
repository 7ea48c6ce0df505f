//! Field elements modulo `p = 2^255 - 19` as four little-endian 64-bit
//! words, fully reduced: the scalar side of the conversions.

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
    sub_borrow(a, b).0
}

/// `a - b` modulo 2^256, and 1 if it borrowed (`a < b`), else 0.
fn sub_borrow(a: &[u64; 4], b: &[u64; 4]) -> ([u64; 4], u64) {
    let mut out = [0u64; 4];
    let mut borrow = 0u64;
    for i in 0..4 {
        let (d, b1) = a[i].overflowing_sub(b[i]);
        let (d, b2) = d.overflowing_sub(borrow);
        out[i] = d;
        borrow = (b1 | b2) as u64;
    }
    (out, borrow)
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
    let mut w = words52(l);
    while geq(&w, &P) {
        w = sub(&w, &P);
    }
    w
}

/// `from_limbs52` in constant time: two masked subtractions of `p`, so a
/// secret (a shared X25519 secret) takes the same time whatever its value.
pub fn from_limbs52_ct(l: &[u64; 5]) -> [u64; 4] {
    let mut w = words52(l);
    for _ in 0..2 {
        let (d, borrow) = sub_borrow(&w, &P);
        // No borrow: w ≥ p, take w - p.
        let take = borrow.wrapping_sub(1);
        w = std::array::from_fn(|i| (d[i] & take) | (w[i] & !take));
    }
    w
}

/// The value of radix-2^52 limbs (limbs 0–3 < 2^52, limb 4 < 2^48) as
/// four words, unreduced.
fn words52(l: &[u64; 5]) -> [u64; 4] {
    debug_assert!(l[..4].iter().all(|x| *x <= M52) && l[4] < 1 << 48);
    [l[0] | l[1] << 52, l[1] >> 12 | l[2] << 40, l[2] >> 24 | l[3] << 28, l[3] >> 36 | l[4] << 16]
}

/// The 32 little-endian bytes of four words.
pub fn to_bytes(w: &[u64; 4]) -> [u8; 32] {
    std::array::from_fn(|i| (w[i / 8] >> (8 * (i % 8))) as u8)
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
