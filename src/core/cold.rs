//! The cold part of the index of applied ops.
//!
//! The engine keeps the most recently applied ops in memory (`Config::
//! hot_applied_max`); older ones are answered from the store's `ops` table,
//! behind a filter that says "certainly not applied" for almost every id
//! that is not, so that a new op's duplicate check costs one cache line and
//! never a store read. Memory then stays flat however many ops a node holds.
//!
//! The core stays free of I/O of its own: the store is reached through
//! [`ColdOps`], a synchronous read of data that earlier commits made
//! durable. An op leaves the hot index only once the commit that applied it
//! is durable (see `Engine::take_commit`).

use crate::protocol::Hash;

/// Reads an applied op back from the store, by id (the bytes as stored in
/// `Cf::Ops`, which holds the pending ops too: the engine asks only for ids
/// it does not hold, never for one whose record a commit not yet written
/// deletes). Called from the engine's thread; must see every write that
/// has completed.
///
/// A failed read is an error, never "not found": taken for an unknown op,
/// an applied one would be applied again (a second event, a count off by
/// one). The engine stops on it (`Engine::take_commit`).
pub trait ColdOps: Send {
    fn get(&self, id: &Hash) -> Result<Option<Vec<u8>>, ColdReadFailed>;
    /// Every stored op (id, bytes), pending ones too: for the filter at
    /// open (`filter_of_stored_ops`) and reports. A failed read ends it
    /// with an error.
    fn scan(&self, f: &mut dyn FnMut(&Hash, &[u8])) -> Result<(), ColdReadFailed>;
}

/// The cold filter of every op in the store's ops table, in a filter of
/// `bytes` (`Engine::cold_filter_bytes`): what `Engine::complete_cold_filter`
/// takes after a restore. Pending ops go in too; a false positive costs
/// one read, never a wrong answer. The node runs it on a thread of its own
/// while it serves (a read of every op: seconds at 10^7 ops).
pub fn filter_of_stored_ops(cold: &dyn ColdOps, bytes: usize) -> Result<IdFilter, ColdReadFailed> {
    let mut filter = IdFilter::new(bytes);
    cold.scan(&mut |id, _| filter.insert(id))?;
    Ok(filter)
}

/// A read of the cold index failed: whether the op is applied is not known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("reading an applied op back from the store failed: {0}")]
pub struct ColdReadFailed(pub String);

/// A blocked Bloom filter over op ids: each id sets `K` bits within one
/// 64-byte block. Ids are SHA-256 outputs, so their own bytes serve as the
/// hash values. Fixed size: the false-positive rate rises with the count
/// (with 16 MiB: ~1e-9 at 10^6 ids, ~0.5% at 10^7), and a false positive
/// costs one store read, never a wrong answer.
pub struct IdFilter {
    blocks: Vec<[u64; 8]>,
    len: u64,
}

const K: usize = 4;

impl IdFilter {
    /// A filter of about `bytes` bytes (at least one block).
    pub fn new(bytes: usize) -> Self {
        let n = (bytes / 64).max(1);
        // `vec![zero; n]` of a zeroed type is a calloc: pages are mapped
        // lazily, as ids land in them.
        IdFilter { blocks: vec![[0u64; 8]; n], len: 0 }
    }

    fn probe(&self, id: &Hash) -> (usize, [u16; K]) {
        let b = u64::from_le_bytes(id[..8].try_into().unwrap());
        let block = (b % self.blocks.len() as u64) as usize;
        let mut bits = [0u16; K];
        for (i, bit) in bits.iter_mut().enumerate() {
            *bit = u16::from_le_bytes([id[8 + 2 * i], id[9 + 2 * i]]) & 511;
        }
        (block, bits)
    }

    pub fn insert(&mut self, id: &Hash) {
        let (block, bits) = self.probe(id);
        let words = &mut self.blocks[block];
        for bit in bits {
            words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        self.len += 1;
    }

    /// Starts loading the lines `may_contain(id)` reads (a block may span
    /// two: the blocks are aligned to 8 bytes). Changes nothing.
    pub fn prefetch(&self, id: &Hash) {
        let (block, _) = self.probe(id);
        let words = &self.blocks[block];
        super::prefetch(&words[0]);
        super::prefetch(&words[7]);
    }

    /// False: `id` was never inserted. True: it may have been.
    pub fn may_contain(&self, id: &Hash) -> bool {
        let (block, bits) = self.probe(id);
        let words = &self.blocks[block];
        bits.iter().all(|bit| words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    /// Ids inserted (with repeats).
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds every id of `other`, a filter of the same size.
    pub fn union(&mut self, other: &IdFilter) {
        assert_eq!(self.blocks.len(), other.blocks.len(), "filters of one size");
        for (mine, theirs) in self.blocks.iter_mut().zip(&other.blocks) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a |= b;
            }
        }
        self.len += other.len;
    }

    pub fn heap_bytes(&self) -> u64 {
        (self.blocks.len() * 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crypto::sha256;

    #[test]
    fn never_a_false_negative_and_few_false_positives() {
        let mut f = IdFilter::new(1 << 16);
        let ids: Vec<Hash> = (0u32..5_000).map(|i| sha256(&i.to_le_bytes())).collect();
        for id in &ids {
            f.insert(id);
        }
        assert!(ids.iter().all(|id| f.may_contain(id)));
        let others = (5_000u32..105_000).filter(|i| f.may_contain(&sha256(&i.to_le_bytes()))).count();
        // 5,000 ids in 1,024 blocks of 512 bits, 4 bits each: about 0.2%.
        assert!(others < 1_000, "{others} false positives in 100,000");
        assert_eq!(f.len(), 5_000);
    }
}
