//! Copies of an op already verified skip the curve arithmetic.
//!
//! An op's id hashes its whole body, author included, and its signature is
//! over that id (SPEC §1, §3), so `(id, signature)` fixes the verdict of the
//! signature check: a copy whose id and signature equal those of a copy
//! found valid before is valid, exactly, with no check. That is what a node
//! sees all the time (gossip from several peers, sync overlapping gossip,
//! senders' retries); a copy with another signature is verified as usual,
//! so a forged duplicate is still `bad_signature`.
//!
//! Direct-mapped and fixed in size: each id has one slot, chosen by its
//! first bytes (ids are SHA-256 outputs), and a newer valid op takes the
//! slot over. A miss only costs the verification that would have run anyway.

use std::sync::Mutex;

use crate::protocol::Hash;

/// Slots: at ~100 B each, 26 MB; about four seconds of ops at the node's
/// full rate, longer than gossip copies of one op usually lie apart. At
/// 2^16 slots the shuffled benchmark (10% duplicates placed anywhere in
/// 200k ops) found 9.0k of its 20k copies here and verified the other 11k
/// again; at 2^18 it finds 15.7k (ARCHITECTURE.md).
pub const VERIFIED_SLOTS: usize = 1 << 18;

pub struct VerifiedCache {
    slots: Mutex<Box<[Option<(Hash, [u8; 64])>]>>,
}

fn slot_of(id: &Hash, n: usize) -> usize {
    u64::from_le_bytes(id[..8].try_into().expect("8 bytes")) as usize & (n - 1)
}

impl VerifiedCache {
    pub fn new(slots: usize) -> VerifiedCache {
        assert!(slots.is_power_of_two(), "a power of two");
        VerifiedCache { slots: Mutex::new(vec![None; slots].into_boxed_slice()) }
    }

    /// Bytes of memory the slots hold (fixed), for the memory gauges.
    pub fn heap_bytes(&self) -> u64 {
        let n = self.slots.lock().expect("verified cache lock").len();
        (n * std::mem::size_of::<Option<(Hash, [u8; 64])>>()) as u64
    }

    /// For each `(id, signature)`: true when that pair was recorded valid.
    pub fn known_valid<'a>(&self, items: impl Iterator<Item = (&'a Hash, &'a [u8; 64])>) -> Vec<bool> {
        let slots = self.slots.lock().expect("verified cache lock");
        items.map(|(id, sig)| slots[slot_of(id, slots.len())].as_ref().is_some_and(|(i, s)| i == id && s == sig)).collect()
    }

    /// Records pairs whose signature was found valid.
    pub fn record<'a>(&self, valid: impl Iterator<Item = (&'a Hash, &'a [u8; 64])>) {
        let mut slots = self.slots.lock().expect("verified cache lock");
        let n = slots.len();
        for (id, sig) in valid {
            slots[slot_of(id, n)] = Some((*id, *sig));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_id_and_signature_are_known() {
        let c = VerifiedCache::new(4);
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let (s, t) = ([7u8; 64], [8u8; 64]);
        assert_eq!(c.known_valid([(&a, &s)].into_iter()), vec![false]);
        c.record([(&a, &s)].into_iter());
        // The pair recorded; not the same id with another signature, not
        // another id with the same signature.
        assert_eq!(c.known_valid([(&a, &s), (&a, &t), (&b, &s)].into_iter()), vec![true, false, false]);
        // An id mapping to the same slot takes it over.
        let mut a2 = a;
        a2[31] = 9; // same first bytes, so the same slot
        c.record([(&a2, &t)].into_iter());
        assert_eq!(c.known_valid([(&a, &s), (&a2, &t)].into_iter()), vec![false, true]);
    }
}
