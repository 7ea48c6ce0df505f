//! The compact sparse Merkle tree of SPEC §8, as a crit-bit (Patricia) trie
//! over 256-bit cell paths with cached hashes.
//!
//! A branch node sits at the first bit where the paths below it differ; its
//! hash is `H(0x01 || left || right)` at that depth. Seen from a
//! shallower depth `d`, every level where all its paths share a bit wraps it
//! once more (`H(0x01 || h || ZERO)` or `H(0x01 || ZERO || h)`), exactly as the
//! recursive definition of §8 does, so `up` caches the hash as the parent sees
//! it. Updates only mark nodes dirty (leaf to root, stopping at the first node
//! already dirty); `root()` rehashes the dirty nodes once, so a batch of
//! changes shares the upper levels. A change costs O(log n) hashes; nothing
//! ever rescans the tree. Cells are never removed (§8: a cell exists once
//! touched), so the trie only grows.

use crate::protocol::crypto::sha256_tag_pair;
use crate::protocol::{Hash, ZERO};

const NONE: u32 = u32::MAX;
const LEAF: u16 = 256;

/// What a rehash touches, kept to 48 bytes so that a walk costs about one
/// cache line per level (the walks are cache-miss bound: the tree of a
/// large scope does not fit in cache); paths live apart, in `paths`.
#[derive(Clone)]
struct Node {
    /// Leaf: the leaf hash (a leaf is its own hash seen from any depth).
    /// Branch: its hash as seen from the parent (depth `parent.bit + 1`,
    /// or 0), i.e. `H(0x01 || left || right)` at depth `bit`, wrapped.
    up: Hash,
    parent: u32,
    children: [u32; 2],
    /// LEAF for a leaf, else the bit (0..=255) at which the children differ.
    bit: u16,
    dirty: bool,
}

#[derive(Clone)]
pub struct Smt {
    nodes: Vec<Node>,
    /// Per node: a leaf's path; for a branch, the path of one of its leaves
    /// (all share the bits above `bit`, which is all `wrap` reads).
    paths: Vec<Hash>,
    root: u32,
    leaves: u64,
}

/// Bit `i` of a path, bit 0 being the most significant bit of byte 0.
pub fn bit_of(path: &Hash, i: u16) -> usize {
    ((path[(i / 8) as usize] >> (7 - (i % 8))) & 1) as usize
}

fn first_diff_bit(a: &Hash, b: &Hash) -> u16 {
    for i in 0..32 {
        let x = a[i] ^ b[i];
        if x != 0 {
            return (i as u16) * 8 + x.leading_zeros() as u16;
        }
    }
    unreachable!("first_diff_bit of equal paths")
}

fn branch_hash(left: &Hash, right: &Hash) -> Hash {
    sha256_tag_pair(1, left, right)
}

/// A subtree whose paths all share bits `from..to`, hashed at depth `to`,
/// seen from depth `from`.
fn wrap(mut h: Hash, path: &Hash, from: u16, to: u16) -> Hash {
    for level in (from..to).rev() {
        h = if bit_of(path, level) == 0 { branch_hash(&h, &ZERO) } else { branch_hash(&ZERO, &h) };
    }
    h
}

/// A handle to a leaf, kept by the caller to update it without a walk.
pub type LeafId = u32;

impl Default for Smt {
    fn default() -> Self {
        Smt::new()
    }
}

impl Smt {
    pub fn new() -> Self {
        Smt { nodes: Vec::new(), paths: Vec::new(), root: NONE, leaves: 0 }
    }

    pub fn len(&self) -> u64 {
        self.leaves
    }

    pub fn is_empty(&self) -> bool {
        self.leaves == 0
    }

    fn mark_dirty_up(&mut self, mut i: u32) {
        while i != NONE && !self.nodes[i as usize].dirty {
            self.nodes[i as usize].dirty = true;
            i = self.nodes[i as usize].parent;
        }
    }

    /// Sets the leaf hash of an existing leaf.
    pub fn update(&mut self, leaf: LeafId, leaf_hash: Hash) {
        let n = &mut self.nodes[leaf as usize];
        assert_eq!(n.bit, LEAF, "update takes a leaf");
        if n.up != leaf_hash {
            n.up = leaf_hash;
            self.mark_dirty_up(leaf);
        }
    }

    /// Inserts a new leaf; the path must not be in the tree yet.
    pub fn insert(&mut self, path: Hash, leaf_hash: Hash) -> LeafId {
        let leaf = self.nodes.len() as u32;
        self.nodes.push(Node { bit: LEAF, dirty: false, parent: NONE, children: [NONE; 2], up: leaf_hash });
        self.paths.push(path);
        self.leaves += 1;
        if self.root == NONE {
            self.root = leaf;
            self.mark_dirty_up(leaf);
            return leaf;
        }
        // Find the leaf the new path would meet, then where it diverges.
        let mut i = self.root;
        while self.nodes[i as usize].bit != LEAF {
            let n = &self.nodes[i as usize];
            i = n.children[bit_of(&path, n.bit)];
        }
        let other = self.paths[i as usize];
        assert_ne!(other, path, "insert of a path already in the tree");
        let diff = first_diff_bit(&path, &other);
        // Walk again to the first node that sits deeper than the divergence.
        let mut parent = NONE;
        let mut i = self.root;
        while self.nodes[i as usize].bit != LEAF && self.nodes[i as usize].bit < diff {
            parent = i;
            let n = &self.nodes[i as usize];
            i = n.children[bit_of(&path, n.bit)];
        }
        let branch = self.nodes.len() as u32;
        let side = bit_of(&path, diff);
        let mut children = [NONE; 2];
        children[side] = leaf;
        children[1 - side] = i;
        self.nodes.push(Node { bit: diff, dirty: false, parent, children, up: ZERO });
        self.paths.push(path);
        self.nodes[leaf as usize].parent = branch;
        self.nodes[i as usize].parent = branch;
        if parent == NONE {
            self.root = branch;
        } else {
            let p = &mut self.nodes[parent as usize];
            let slot = if p.children[0] == i { 0 } else { 1 };
            p.children[slot] = branch;
        }
        // `i` is now seen from a new depth: its `up` must be recomputed
        // (a leaf's does not change; a branch's is rehashed from its
        // children, which are clean).
        self.nodes[i as usize].dirty = true;
        self.mark_dirty_up(leaf);
        self.mark_dirty_up(branch);
        leaf
    }

    /// The scope root: ZERO when empty. Rehashes what changed since last time.
    pub fn root(&mut self) -> Hash {
        if self.root == NONE {
            return ZERO;
        }
        if self.nodes[self.root as usize].dirty {
            self.rehash();
        }
        self.nodes[self.root as usize].up
    }

    /// Post-order over the dirty nodes with an explicit stack (no recursion:
    /// the trie can be 256 deep).
    fn rehash(&mut self) {
        let mut stack: Vec<(u32, u16, bool)> = vec![(self.root, 0, false)];
        while let Some((i, depth, expanded)) = stack.pop() {
            let n = &self.nodes[i as usize];
            if n.bit == LEAF {
                self.nodes[i as usize].dirty = false;
                continue;
            }
            if !expanded {
                stack.push((i, depth, true));
                let bit = n.bit;
                for c in n.children {
                    if self.nodes[c as usize].dirty {
                        stack.push((c, bit + 1, false));
                    }
                }
                continue;
            }
            let [l, r] = n.children;
            let own = branch_hash(&self.nodes[l as usize].up, &self.nodes[r as usize].up);
            let bit = self.nodes[i as usize].bit;
            let up = if depth < bit { wrap(own, &self.paths[i as usize], depth, bit) } else { own };
            let n = &mut self.nodes[i as usize];
            n.up = up;
            n.dirty = false;
        }
    }

    /// Bytes of memory held, for the buffer and memory metrics.
    pub fn heap_bytes(&self) -> u64 {
        (self.nodes.capacity() * std::mem::size_of::<Node>() + self.paths.capacity() * 32) as u64
    }
}

/// The root of a set of (path, leaf) by the recursive definition of §8, for
/// tests: quadratic-free but rebuilds everything.
pub fn reference_root(cells: &mut [(Hash, Hash)]) -> Hash {
    cells.sort();
    fn go(cells: &[(Hash, Hash)], d: u16) -> Hash {
        match cells.len() {
            0 => ZERO,
            1 => cells[0].1,
            _ => {
                let split = cells.partition_point(|(p, _)| bit_of(p, d) == 0);
                branch_hash(&go(&cells[..split], d + 1), &go(&cells[split..], d + 1))
            }
        }
    }
    go(cells, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crypto::sha256;

    #[test]
    fn incremental_equals_reference() {
        let mut smt = Smt::new();
        let mut cells: Vec<(Hash, Hash)> = Vec::new();
        let mut ids = Vec::new();
        assert_eq!(smt.root(), ZERO);
        for i in 0u32..300 {
            let mut path = sha256(&i.to_le_bytes());
            if i % 7 == 0 {
                // Long shared prefixes.
                path[..3].copy_from_slice(&[0xAB, 0xCD, 0xEF]);
            }
            let leaf = sha256(&path);
            ids.push(smt.insert(path, leaf));
            cells.push((path, leaf));
            if i % 13 == 0 {
                assert_eq!(smt.root(), reference_root(&mut cells.clone()));
            }
        }
        for (k, id) in ids.iter().enumerate().step_by(5) {
            let h = sha256(&[k as u8, 9]);
            smt.update(*id, h);
            let pos = cells.iter().position(|(p, _)| *p == smt.paths[*id as usize]).unwrap();
            cells[pos].1 = h;
        }
        assert_eq!(smt.root(), reference_root(&mut cells.clone()));
        assert_eq!(std::mem::size_of::<Node>(), 48);
    }
}
