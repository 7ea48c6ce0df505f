//! Signature validity (SPEC §1): the shared vectors, Wycheproof, and a
//! property test that batch and single verdicts agree item by item.

use curve25519_dalek::constants::EIGHT_TORSION;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use dagfold::protocol::sig::{
    is_canonical_encoding, is_small_order_encoding, public_key_from_seed, sign, verify, verify_batch,
    verify_batch_messages, verify_message,
};
use proptest::prelude::*;
use sha2::{Digest, Sha512};

type Item = ([u8; 32], [u8; 32], [u8; 64]);

// ---------------------------------------------------------------------------
// Helpers

fn hex32(s: &str) -> [u8; 32] {
    hex::decode(s).unwrap().try_into().unwrap()
}

fn hex64(s: &str) -> [u8; 64] {
    hex::decode(s).unwrap().try_into().unwrap()
}

fn sha512(parts: &[&[u8]]) -> [u8; 64] {
    let mut h = Sha512::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// A deterministic honest item: seed and message derived from `i`.
fn honest(i: u64) -> Item {
    let seed: [u8; 32] = sha512(&[b"seed", &i.to_le_bytes()])[..32]
        .try_into()
        .unwrap();
    let msg: [u8; 32] = sha512(&[b"msg", &i.to_le_bytes()])[..32]
        .try_into()
        .unwrap();
    (public_key_from_seed(&seed), msg, sign(&seed, &msg))
}

/// Assert that `verify_batch(items)` equals `verify` on each item, and return
/// the verdicts.
fn assert_batch_agrees(items: &[Item]) -> Vec<bool> {
    let batch = verify_batch(items);
    assert_eq!(batch.len(), items.len());
    for (i, ((pk, msg, sig), got)) in items.iter().zip(&batch).enumerate() {
        assert_eq!(
            *got,
            verify(pk, msg, sig),
            "batch and single disagree on item {i}"
        );
    }
    batch
}

/// A deterministic Fisher-Yates shuffle (splitmix64), so failures reproduce.
fn shuffle<T>(v: &mut [T], mut state: u64) {
    for i in (1..v.len()).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        v.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

// ---------------------------------------------------------------------------
// 1. The shared vectors (../shared/vectors/primitives.json)

struct Vector {
    name: String,
    item: Item,
    valid: bool,
    cofactorless_valid: bool,
}

fn load_primitives() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/vectors/primitives.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn signature_vectors() -> Vec<Vector> {
    let json = load_primitives();
    let vectors: Vec<Vector> = json["signatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| Vector {
            name: v["name"].as_str().unwrap().to_string(),
            item: (
                hex32(v["public_key"].as_str().unwrap()),
                hex32(v["message"].as_str().unwrap()),
                hex64(v["signature"].as_str().unwrap()),
            ),
            valid: v["valid"].as_bool().unwrap(),
            cofactorless_valid: v["cofactorless_valid"].as_bool().unwrap(),
        })
        .collect();
    assert!(!vectors.is_empty());
    vectors
}

#[test]
fn spec_vectors_single() {
    let vectors = signature_vectors();
    for v in &vectors {
        let (pk, msg, sig) = &v.item;
        assert_eq!(verify(pk, msg, sig), v.valid, "vector {}", v.name);
    }
    // The five vectors the two equations decide differently are all here.
    let differing = vectors
        .iter()
        .filter(|v| v.valid && !v.cofactorless_valid)
        .count();
    assert_eq!(differing, 5);
}

#[test]
fn spec_vectors_batch_alone_together_and_mixed() {
    let vectors = signature_vectors();
    let expected: Vec<bool> = vectors.iter().map(|v| v.valid).collect();
    let items: Vec<Item> = vectors.iter().map(|v| v.item).collect();

    // Each vector alone, and each vector in a batch of two with an honest one.
    for (i, v) in vectors.iter().enumerate() {
        assert_eq!(
            verify_batch(&[v.item]),
            vec![v.valid],
            "vector {} alone",
            v.name
        );
        let pair = [honest(i as u64), v.item];
        assert_eq!(
            verify_batch(&pair),
            vec![true, v.valid],
            "vector {} with one",
            v.name
        );
    }

    // All vectors together, in file order and reversed.
    assert_eq!(assert_batch_agrees(&items), expected);
    let mut reversed = items.clone();
    reversed.reverse();
    let mut expected_reversed = expected.clone();
    expected_reversed.reverse();
    assert_eq!(assert_batch_agrees(&reversed), expected_reversed);

    // Mixed with honest signatures, in several shuffles, at sizes that take
    // both Straus (< 190 points) and Pippenger (>= 190 points).
    for (round, honest_count) in [(0u64, 3usize), (1, 40), (2, 120), (3, 300)] {
        let mut tagged: Vec<(Item, bool, String)> = vectors
            .iter()
            .map(|v| (v.item, v.valid, v.name.clone()))
            .chain(
                (0..honest_count as u64)
                    .map(|i| (honest(1000 + round * 1000 + i), true, format!("honest {i}"))),
            )
            .collect();
        shuffle(&mut tagged, round);
        let items: Vec<Item> = tagged.iter().map(|t| t.0).collect();
        let got = assert_batch_agrees(&items);
        for ((_, valid, name), got) in tagged.iter().zip(got) {
            assert_eq!(got, *valid, "vector {name} in mixed batch round {round}");
        }
    }

    // The invalid vectors only, repeated: every bisection path is taken.
    let invalid: Vec<Item> = vectors
        .iter()
        .filter(|v| !v.valid)
        .flat_map(|v| [v.item, v.item])
        .collect();
    assert!(assert_batch_agrees(&invalid).iter().all(|&b| !b));
}

/// An item that passes every per-item test and fails only the equation: an
/// honest signature presented with another message.
fn equation_failure(i: u64) -> Item {
    let (pk, msg, sig) = honest(i);
    let mut other = msg;
    other[0] ^= 1;
    (pk, other, sig)
}

/// Every bisection path: one equation failure at each position, and every
/// pair of positions, in batches of several sizes; an empty batch.
#[test]
fn bisection_finds_every_invalid_position() {
    assert!(verify_batch(&[]).is_empty());
    for n in [2usize, 3, 5, 8, 17, 64] {
        let base: Vec<Item> = (0..n as u64).map(|i| honest(5000 + i)).collect();
        for bad in 0..n {
            let mut items = base.clone();
            items[bad] = equation_failure(9000 + bad as u64);
            let got = assert_batch_agrees(&items);
            assert!(
                got.iter().enumerate().all(|(i, &v)| v == (i != bad)),
                "n {n} bad {bad}"
            );
        }
        if n <= 17 {
            for a in 0..n {
                for b in a + 1..n {
                    let mut items = base.clone();
                    items[a] = equation_failure(9000 + a as u64);
                    items[b] = equation_failure(9000 + b as u64);
                    let got = assert_batch_agrees(&items);
                    assert_eq!(got.iter().filter(|&&v| !v).count(), 2, "n {n} bad {a} {b}");
                }
            }
        }
        // All invalid.
        let items: Vec<Item> = (0..n as u64).map(equation_failure).collect();
        assert!(assert_batch_agrees(&items).iter().all(|&v| !v));
    }
}

/// `S ± 1`, reduced modulo L: the residue `[S]B - R - [k]A` becomes `±B`.
fn shift_s(item: Item, by: Scalar) -> Item {
    let (pk, msg, mut sig) = item;
    let s = Scalar::from_canonical_bytes(sig[32..].try_into().unwrap()).unwrap() + by;
    sig[32..].copy_from_slice(s.as_bytes());
    (pk, msg, sig)
}

/// Two invalid signatures whose residues cancel (`+B` and `-B`): a batch
/// with equal (or absent) coefficients would accept both. The coefficients
/// derived from the batch tell them apart.
#[test]
fn cancelling_residues_are_rejected() {
    for i in 0..32u64 {
        let plus = shift_s(honest(7000 + i), Scalar::ONE);
        let minus = shift_s(honest(8000 + i), -Scalar::ONE);
        assert!(!verify(&plus.0, &plus.1, &plus.2) && !verify(&minus.0, &minus.1, &minus.2));
        assert_eq!(verify_batch(&[plus, minus]), vec![false, false]);
        let mut items: Vec<Item> = (0..6).map(|j| honest(7500 + 8 * i + j)).collect();
        items.insert(2, plus);
        items.push(minus);
        let got = assert_batch_agrees(&items);
        assert_eq!(got.iter().filter(|&&v| !v).count(), 2);
    }
}

/// Informative: `ed25519_dalek::verify_strict` implements the cofactorless
/// rule, so it rejects exactly the vectors the README says the two rules
/// decide differently. This proves those vectors test what they claim.
#[test]
fn spec_vectors_that_split_the_rules_fail_verify_strict() {
    for v in signature_vectors()
        .iter()
        .filter(|v| v.valid != v.cofactorless_valid)
    {
        let (pk, msg, sig) = &v.item;
        let strict = ed25519_dalek::VerifyingKey::from_bytes(pk)
            .map(|vk| {
                vk.verify_strict(msg, &ed25519_dalek::Signature::from_bytes(sig))
                    .is_ok()
            })
            .unwrap_or(false);
        assert_eq!(strict, v.cofactorless_valid, "verify_strict on {}", v.name);
    }
}

/// The signatures of the op vectors (over their `delta_id`) are valid.
#[test]
fn op_vector_signatures_verify() {
    let json = load_primitives();
    let ops = json["ops"].as_array().unwrap();
    assert!(!ops.is_empty());
    let mut items = Vec::new();
    for op in ops {
        let pk = hex32(op["public_key"].as_str().unwrap());
        let delta_id = hex32(op["delta_id"].as_str().unwrap());
        let op_bytes = hex::decode(op["op_hex"].as_str().unwrap()).unwrap();
        let sig: [u8; 64] = op_bytes[op_bytes.len() - 64..].try_into().unwrap();
        let seed = hex32(op["secret_seed"].as_str().unwrap());
        assert_eq!(public_key_from_seed(&seed), pk);
        assert_eq!(
            sign(&seed, &delta_id),
            sig,
            "RFC 8032 signing is deterministic"
        );
        assert!(verify(&pk, &delta_id, &sig));
        items.push((pk, delta_id, sig));
    }
    assert!(verify_batch(&items).iter().all(|&b| b));
}

/// The byte-level canonical test equals "decompress, compress, compare" on
/// every encoding that decompresses, around every boundary of the encoding;
/// on canonical ones, the byte-level small-order test equals dalek's.
#[test]
fn canonical_encoding_test_is_the_round_trip() {
    let check = |bytes: [u8; 32]| {
        if let Some(point) = CompressedEdwardsY(bytes).decompress() {
            assert_eq!(
                is_canonical_encoding(&bytes),
                point.compress().to_bytes() == bytes,
                "encoding {}",
                hex::encode(bytes)
            );
            if is_canonical_encoding(&bytes) {
                assert_eq!(is_small_order_encoding(&bytes), point.is_small_order(), "small order of {}", hex::encode(bytes));
            }
        }
    };
    let mut tried = 0u32;
    for sign_bit in [0u8, 0x80] {
        // y = 0..256 (small values, the identity, the order-4 points).
        for low in 0..=255u8 {
            let mut b = [0u8; 32];
            b[0] = low;
            b[31] = sign_bit;
            check(b);
            tried += 1;
        }
        // y = 2^255 - 256 ..= 2^255 - 1: p - 1, p .. p + 18 and their neighbours.
        for low in 0..=255u8 {
            let mut b = [0xffu8; 32];
            b[0] = low;
            b[31] = 0x7f | sign_bit;
            check(b);
            tried += 1;
        }
    }
    // Every torsion point, both signs, and y + p where it fits.
    for t in EIGHT_TORSION {
        let c = t.compress().to_bytes();
        check(c);
        let mut flipped = c;
        flipped[31] ^= 0x80;
        check(flipped);
    }
    // Points with a torsion component, and without.
    for (i, t) in EIGHT_TORSION.iter().enumerate() {
        let p = curve25519_dalek::constants::ED25519_BASEPOINT_POINT * Scalar::from(1000 + i as u64);
        check((p + t).compress().to_bytes());
        check(p.compress().to_bytes());
    }
    // Pseudo-random encodings.
    for i in 0u64..4096 {
        check(
            sha512(&[b"enc", &i.to_le_bytes()])[..32]
                .try_into()
                .unwrap(),
        );
    }
    assert!(tried > 1000);
}

// ---------------------------------------------------------------------------
// 2. Wycheproof

/// Wycheproof cases where SPEC §1 deliberately decides otherwise than
/// Wycheproof's expected result, by tcId, with the reason. (Wycheproof's
/// Ed25519 set is the cofactorless-strict RFC 8032 / OpenSSL behaviour.)
const WYCHEPROOF_DIFFERENCES: &[(usize, &str)] = &[];

#[test]
fn wycheproof_ed25519() {
    use wycheproof::eddsa::{TestName, TestSet};
    use wycheproof::TestResult;

    let set = TestSet::load(TestName::Ed25519).unwrap();
    let mut cases = Vec::new(); // (tcId, expected, key, msg, sig, comment)
    let mut unrepresentable = 0;
    for group in &set.test_groups {
        let pk: Option<[u8; 32]> = group.key.pk.as_slice().try_into().ok();
        for test in &group.tests {
            let sig: Option<[u8; 64]> = test.sig.as_slice().try_into().ok();
            let (Some(pk), Some(sig)) = (pk, sig) else {
                // A key or signature of the wrong length cannot reach our
                // API: it is invalid, and Wycheproof must agree.
                assert!(
                    test.result.must_fail(),
                    "tcId {} has a bad length but passes",
                    test.tc_id
                );
                unrepresentable += 1;
                continue;
            };
            cases.push((
                test.tc_id,
                test.result,
                pk,
                test.msg.to_vec(),
                sig,
                test.comment.clone(),
            ));
        }
    }

    // The single path.
    let single: Vec<bool> = cases
        .iter()
        .map(|(_, _, pk, msg, sig, _)| verify_message(pk, msg, sig))
        .collect();

    // The batch path: all cases at once, and each case alone.
    let items: Vec<([u8; 32], Vec<u8>, [u8; 64])> = cases
        .iter()
        .map(|(_, _, pk, msg, sig, _)| (*pk, msg.clone(), *sig))
        .collect();
    let batch = verify_batch_messages(&items);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(
            batch[i], single[i],
            "tcId {}: batch of all vs single",
            cases[i].0
        );
        assert_eq!(
            verify_batch_messages(std::slice::from_ref(item)),
            vec![single[i]],
            "tcId {}: batch of one vs single",
            cases[i].0
        );
    }
    // Each case next to every other in pairs would be quadratic; a shuffled
    // batch of everything is a different set of coefficients.
    let mut order: Vec<usize> = (0..items.len()).collect();
    shuffle(&mut order, 7);
    let shuffled: Vec<_> = order.iter().map(|&i| items[i].clone()).collect();
    for (pos, verdict) in verify_batch_messages(&shuffled).into_iter().enumerate() {
        assert_eq!(
            verdict, single[order[pos]],
            "tcId {}: shuffled batch",
            cases[order[pos]].0
        );
    }

    // Against Wycheproof's expectations.
    let mut differences = Vec::new();
    let (mut valid, mut invalid, mut acceptable) = (0, 0, 0);
    for ((tc_id, expected, _, _, _, comment), got) in cases.iter().zip(&single) {
        let agrees = match expected {
            TestResult::Valid => *got,
            TestResult::Invalid => !*got,
            TestResult::Acceptable => true,
        };
        match expected {
            TestResult::Valid => valid += 1,
            TestResult::Invalid => invalid += 1,
            TestResult::Acceptable => acceptable += 1,
        }
        if !agrees {
            differences.push((*tc_id, *got, comment.clone()));
        }
    }
    eprintln!(
        "wycheproof: {} cases ({valid} valid, {invalid} invalid, {acceptable} acceptable), \
         {unrepresentable} of a bad length, {} differ",
        cases.len() + unrepresentable,
        differences.len()
    );
    for (tc_id, got, comment) in &differences {
        eprintln!("  tcId {tc_id}: ours {got}, comment {comment:?}");
    }
    let listed: Vec<usize> = WYCHEPROOF_DIFFERENCES.iter().map(|d| d.0).collect();
    let found: Vec<usize> = differences.iter().map(|d| d.0).collect();
    assert_eq!(
        found, listed,
        "differences from Wycheproof other than the listed ones"
    );
}

// ---------------------------------------------------------------------------
// 3. Property: batch and single agree item by item on crafted mixes

/// How to build one item of a random batch.
#[derive(Clone, Debug)]
enum Kind {
    /// An RFC 8032 signature.
    Honest,
    /// An honest signature with one bit of R flipped.
    FlipR(usize),
    /// An honest signature with one bit of S flipped.
    FlipS(usize),
    /// An honest signature, one bit of the message flipped.
    FlipMessage(usize),
    /// An honest signature, one bit of the key flipped.
    FlipKey(usize),
    /// `R = [r]B + T`, `S = r + k·a`: valid.
    MixedR(usize),
    /// `A = [a]B + T`, signed honestly with that A in the hash: valid.
    MixedA(usize),
    /// Both of the above: valid.
    MixedAAndR(usize, usize),
    /// `R = T` of small order (the identity included), `S = k·a`: the
    /// cofactored equation holds, the small-order test refuses it.
    SmallR(usize),
    /// An honest signature with `S + L`.
    NonCanonicalS,
    /// A mixed-order R with `S + L`.
    MixedRNonCanonicalS(usize),
}

impl Kind {
    fn expected(&self) -> bool {
        matches!(
            self,
            Kind::Honest | Kind::MixedR(_) | Kind::MixedA(_) | Kind::MixedAAndR(..)
        )
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Honest),
        1 => (0..256usize).prop_map(Kind::FlipR),
        1 => (0..256usize).prop_map(Kind::FlipS),
        1 => (0..256usize).prop_map(Kind::FlipMessage),
        1 => (0..256usize).prop_map(Kind::FlipKey),
        2 => (1..8usize).prop_map(Kind::MixedR),
        2 => (1..8usize).prop_map(Kind::MixedA),
        1 => (1..8usize, 1..8usize).prop_map(|(a, r)| Kind::MixedAAndR(a, r)),
        1 => (0..8usize).prop_map(Kind::SmallR),
        1 => Just(Kind::NonCanonicalS),
        1 => (1..8usize).prop_map(Kind::MixedRNonCanonicalS),
    ]
}

fn flip(bytes: &mut [u8], bit: usize) {
    bytes[bit / 8] ^= 1 << (bit % 8);
}

/// `S + L` as 32 little-endian bytes (fits: S < L < 2^253).
fn add_l(s: &[u8]) -> [u8; 32] {
    const L: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];
    let mut out = [0u8; 32];
    let mut carry = 0u16;
    for i in 0..32 {
        let sum = s[i] as u16 + L[i] as u16 + carry;
        out[i] = sum as u8;
        carry = sum >> 8;
    }
    assert_eq!(carry, 0);
    out
}

fn challenge(r: &[u8; 32], a: &[u8; 32], m: &[u8; 32]) -> Scalar {
    Scalar::from_bytes_mod_order_wide(&sha512(&[r, a, m]))
}

/// A hand-made signature: key `[a]B + t_a`, nonce point `[r]B + t_r`,
/// `S = r + k·a` (or `k·a` when `r` is zero, i.e. R = t_r alone).
fn crafted(a: Scalar, t_a: EdwardsPoint, r: Scalar, t_r: EdwardsPoint, msg: [u8; 32]) -> Item {
    let a_bytes = (EdwardsPoint::mul_base(&a) + t_a).compress().to_bytes();
    let r_bytes = (EdwardsPoint::mul_base(&r) + t_r).compress().to_bytes();
    let k = challenge(&r_bytes, &a_bytes, &msg);
    let s = r + k * a;
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(&r_bytes);
    sig[32..].copy_from_slice(s.as_bytes());
    (a_bytes, msg, sig)
}

fn build(kind: &Kind, seed: [u8; 32], msg: [u8; 32]) -> Item {
    let id = EdwardsPoint::default();
    let a = Scalar::from_bytes_mod_order_wide(&sha512(&[b"a", &seed]));
    let r = Scalar::from_bytes_mod_order_wide(&sha512(&[b"r", &seed, &msg]));
    let honest = || (public_key_from_seed(&seed), msg, sign(&seed, &msg));
    match *kind {
        Kind::Honest => honest(),
        Kind::FlipR(bit) => {
            let mut it = honest();
            flip(&mut it.2[..32], bit);
            it
        }
        Kind::FlipS(bit) => {
            let mut it = honest();
            flip(&mut it.2[32..], bit);
            it
        }
        Kind::FlipMessage(bit) => {
            let mut it = honest();
            flip(&mut it.1, bit);
            it
        }
        Kind::FlipKey(bit) => {
            let mut it = honest();
            flip(&mut it.0, bit);
            it
        }
        Kind::MixedR(t) => crafted(a, id, r, EIGHT_TORSION[t], msg),
        Kind::MixedA(t) => crafted(a, EIGHT_TORSION[t], r, id, msg),
        Kind::MixedAAndR(ta, tr) => crafted(a, EIGHT_TORSION[ta], r, EIGHT_TORSION[tr], msg),
        Kind::SmallR(t) => crafted(a, id, Scalar::ZERO, EIGHT_TORSION[t], msg),
        Kind::NonCanonicalS => {
            let mut it = honest();
            let s = add_l(&it.2[32..]);
            it.2[32..].copy_from_slice(&s);
            it
        }
        Kind::MixedRNonCanonicalS(t) => {
            let mut it = crafted(a, id, r, EIGHT_TORSION[t], msg);
            let s = add_l(&it.2[32..]);
            it.2[32..].copy_from_slice(&s);
            it
        }
    }
}

/// The crafted constructions do what they claim on the curve itself.
#[test]
fn crafted_constructions_are_what_they_claim() {
    let seed = [7u8; 32];
    let msg = [9u8; 32];
    for t in 1..8 {
        // Mixed-order R: valid cofactored, invalid cofactorless (verify_strict).
        let (pk, m, sig) = build(&Kind::MixedR(t), seed, msg);
        assert!(verify(&pk, &m, &sig));
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).unwrap();
        assert!(vk
            .verify_strict(&m, &ed25519_dalek::Signature::from_bytes(&sig))
            .is_err());
        // R really has a torsion component.
        let r = CompressedEdwardsY(sig[..32].try_into().unwrap())
            .decompress()
            .unwrap();
        assert!(!r.is_torsion_free() && !r.is_small_order());
        // Mixed-order key.
        let (pk, m, sig) = build(&Kind::MixedA(t), seed, msg);
        assert!(verify(&pk, &m, &sig));
        let a = CompressedEdwardsY(pk).decompress().unwrap();
        assert!(!a.is_torsion_free() && !a.is_small_order());
    }
    for t in 0..8 {
        let (pk, m, sig) = build(&Kind::SmallR(t), seed, msg);
        // [8]([S]B - R - [k]A) = -[8]T = 0: only the small-order test refuses it.
        let r = CompressedEdwardsY(sig[..32].try_into().unwrap())
            .decompress()
            .unwrap();
        assert!(r.is_small_order());
        assert!(!verify(&pk, &m, &sig));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn batch_and_single_agree_on_crafted_mixes(
        spec in prop::collection::vec((kind(), any::<[u8; 32]>(), any::<[u8; 32]>()), 1..64),
        shared_key in any::<bool>(),
    ) {
        // Optionally give every item the same seed, so that the batch folds
        // one key's signatures into one term.
        let first_seed = spec[0].1;
        let items: Vec<Item> = spec
            .iter()
            .map(|(k, seed, msg)| build(k, if shared_key { first_seed } else { *seed }, *msg))
            .collect();
        let batch = verify_batch(&items);
        for (i, ((kind, _, _), (pk, msg, sig))) in spec.iter().zip(&items).enumerate() {
            let single = verify(pk, msg, sig);
            prop_assert_eq!(batch[i], single, "item {} ({:?}): batch vs single", i, kind);
            prop_assert_eq!(single, kind.expected(), "item {} ({:?}): verdict", i, kind);
        }
    }
}
