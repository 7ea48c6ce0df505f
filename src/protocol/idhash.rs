//! The hasher of the node's maps keyed by 32-byte ids (SHA-256 outputs,
//! public keys): foldhash, seeded per process, with the 32 bytes mixed in
//! as two 128-bit words.
//!
//! foldhash hashes a slice longer than 16 bytes in `hash_bytes_long`, a
//! function it marks cold and never inlines; an id's 32 bytes went there on
//! every lookup, and it was 9.5% of the order stage in `shuffled` (`cargo
//! bench --bench stages -- "order stage"`, `perf`). Two of foldhash's
//! `write_u128` (one folded multiply each, inlined) take all 32 bytes
//! under the same secret seeds, so a peer still cannot aim ids at one
//! bucket; any other write goes to foldhash unchanged.

use std::hash::{BuildHasher, Hasher};

/// A `BuildHasher` for maps keyed by ids (`core::IdMap`): per-process
/// random seeds, as `foldhash::fast::RandomState`.
#[derive(Clone, Debug, Default)]
pub struct IdState(foldhash::fast::RandomState);

impl BuildHasher for IdState {
    type Hasher = IdHasher;

    #[inline(always)]
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0.build_hasher())
    }
}

/// foldhash's hasher, with a 32-byte write taken inline (module docs).
#[derive(Clone)]
pub struct IdHasher(foldhash::fast::FoldHasher<'static>);

impl Hasher for IdHasher {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        if let Ok(id) = <&[u8; 32]>::try_from(bytes) {
            let (lo, hi) = id.split_at(16);
            self.0.write_u128(u128::from_le_bytes(lo.try_into().expect("16 bytes")));
            self.0.write_u128(u128::from_le_bytes(hi.try_into().expect("16 bytes")));
        } else {
            self.0.write(bytes);
        }
    }

    #[inline(always)]
    fn write_u8(&mut self, i: u8) {
        self.0.write_u8(i)
    }

    #[inline(always)]
    fn write_u16(&mut self, i: u16) {
        self.0.write_u16(i)
    }

    #[inline(always)]
    fn write_u32(&mut self, i: u32) {
        self.0.write_u32(i)
    }

    #[inline(always)]
    fn write_u64(&mut self, i: u64) {
        self.0.write_u64(i)
    }

    #[inline(always)]
    fn write_u128(&mut self, i: u128) {
        self.0.write_u128(i)
    }

    #[inline(always)]
    fn write_usize(&mut self, i: usize) {
        self.0.write_usize(i)
    }

    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Every byte of an id moves its hash (the seeds are secret, but a
    /// hash that ignored a byte would let a peer vary it freely and land
    /// in one bucket).
    #[test]
    fn every_byte_of_an_id_counts() {
        let s = IdState::default();
        let id = [7u8; 32];
        let h = s.hash_one(id);
        for i in 0..32 {
            for bit in [1u8, 0x80] {
                let mut other = id;
                other[i] ^= bit;
                assert_ne!(s.hash_one(other), h, "byte {i}, bit {bit:#x}");
            }
        }
        assert_eq!(s.hash_one(id), h, "the same id, the same hash");
    }

    /// Ids that differ only in two adjacent bytes (within a half, and
    /// across the halves' border) spread over a table's buckets as random
    /// ones do: of 4,096 such ids, the low 12 bits (a table of 4,096
    /// slots) take at least half of the values (random: ~63%).
    #[test]
    fn ids_that_differ_little_spread() {
        let s = IdState::default();
        for at in [0usize, 15, 16, 31] {
            let mut buckets = std::collections::HashSet::new();
            for n in 0..4096u32 {
                let mut id = [0u8; 32];
                id[at] = n as u8;
                id[(at + 1) % 32] = (n >> 8) as u8;
                buckets.insert(s.hash_one(id) & 4095);
            }
            assert!(buckets.len() >= 2048, "varying byte {at}: {} buckets of 4096", buckets.len());
        }
    }

    /// Other keys than ids hash as foldhash does them: a map of them works.
    #[test]
    fn other_keys_still_hash() {
        let mut m: std::collections::HashMap<(u8, [u8; 32]), u32, IdState> = Default::default();
        let mut s: std::collections::HashMap<String, u32, IdState> = Default::default();
        for i in 0..1000u32 {
            m.insert((i as u8, [(i >> 8) as u8; 32]), i);
            s.insert(i.to_string(), i);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(s.len(), 1000);
        assert_eq!(m[&(5, [0; 32])], 5);
        assert_eq!(s["999"], 999);
    }
}
