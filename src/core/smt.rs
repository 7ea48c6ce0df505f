//! The compact sparse Merkle tree of SPEC §8, as a crit-bit (Patricia) trie
//! over 256-bit cell paths with cached hashes.
//!
//! A branch sits at the first bit where the paths below it differ; its hash
//! is `H(0x01 || left || right)` at that depth. Seen from a shallower depth
//! `d`, every level where all its paths share a bit wraps it once more
//! (`H(0x01 || h || ZERO)` or `H(0x01 || ZERO || h)`), exactly as the
//! recursive definition of §8 does. A leaf is its own hash at any depth.
//!
//! Each branch keeps the hashes of its two children as it sees them, in one
//! cache line (`Kids`); the shape of the tree (`Topo`, 16 bytes a branch)
//! lives apart. The tree of a large scope does not fit in the core's cache,
//! so the work is arranged for independent memory accesses, which the core
//! overlaps, rather than chains of them:
//! - an update is queued; `root()` applies the queue in one loop: the leaf
//!   hash into its parent's line, then branches marked dirty up to the first
//!   one already dirty, each newly dirty branch listed;
//! - the rehash takes the listed branches by their bit, deepest first (a
//!   branch's children sit at deeper bits, so branches of one bit are
//!   independent) and hashes each bit's branches together, four at a time
//!   through SHA-NI (`sha_lanes`). It reads each dirty branch's line and
//!   writes one slot of its parent's, never a clean sibling, and never walks
//!   the tree.
//!
//! A batch of changes shares the upper levels. A change costs O(log n)
//! hashes; nothing ever rescans the tree. Cells are never removed (§8: a
//! cell exists once touched), so the trie only grows.

use crate::protocol::crypto::sha256_tag_pair;
use crate::protocol::sha_lanes::sha256_tag_pairs;
use crate::protocol::{Hash, ZERO};

const NONE: u32 = u32::MAX;
/// In a child or root reference: the index is a leaf's, not a branch's.
const LEAF: u32 = 1 << 31;
/// In a parent link (branch index | side << 31): the side taken below it.
const SIDE: u32 = 1 << 31;
/// Queued updates applied at once, at most: the queue costs 36 bytes each.
const PENDING_MAX: usize = 4096;

/// A branch's children's hashes, as seen from depth `bit + 1`.
#[derive(Clone)]
#[repr(C, align(64))]
struct Kids([Hash; 2]);

#[derive(Clone, Copy)]
struct Topo {
    /// Parent link, NONE at the root.
    parent: u32,
    /// Child references (LEAF flag for leaves).
    children: [u32; 2],
    /// The bit (0..=255) at which the paths below differ.
    bit: u16,
    /// The depth its parent sees it from: the parent's bit + 1 (at most
    /// 255: a child's bit is deeper), 0 at the root.
    seen: u8,
    /// Its hash as its parent sees it is stale (and it is listed).
    dirty: bool,
}

/// A dirty branch whose own hash is being wrapped up to the depth its
/// parent sees it from.
#[derive(Clone)]
struct Wrap {
    /// Index into the bit's list.
    at: u32,
    /// The next level to wrap at is `level - 1`, down to `until`.
    level: u16,
    until: u16,
    /// A path under the branch: its bits above `bit` are the shared ones.
    path: Hash,
}

/// Buffers a rehash reuses.
#[derive(Clone, Default)]
struct Scratch {
    starts: Vec<u32>,
    order: Vec<u32>,
    pairs: Vec<(Hash, Hash)>,
    out: Vec<Hash>,
    wrapped: Vec<Hash>,
    wraps: Vec<Wrap>,
}

#[derive(Clone)]
pub struct Smt {
    kids: Vec<Kids>,
    topo: Vec<Topo>,
    /// Per branch: one leaf under it.
    below: Vec<u32>,
    /// Per leaf: its parent link, NONE when the leaf is the whole tree.
    leaf_parent: Vec<u32>,
    /// Per leaf: its path.
    paths: Vec<Hash>,
    /// NONE, a leaf (with LEAF) or a branch.
    root: u32,
    /// The root's hash seen from depth 0, current unless the root branch
    /// is dirty.
    root_hash: Hash,
    /// Leaf updates not applied yet.
    pending: Vec<(LeafId, Hash)>,
    /// The dirty branches, each once.
    dirty: Vec<u32>,
    scratch: Scratch,
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

fn link(branch: u32, side: usize) -> u32 {
    branch | ((side as u32) << 31)
}

fn unlink(l: u32) -> (usize, usize) {
    ((l & !SIDE) as usize, (l >> 31) as usize)
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
        Smt {
            kids: Vec::new(),
            topo: Vec::new(),
            below: Vec::new(),
            leaf_parent: Vec::new(),
            paths: Vec::new(),
            root: NONE,
            root_hash: ZERO,
            pending: Vec::new(),
            dirty: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    pub fn len(&self) -> u64 {
        self.paths.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Marks one branch dirty and lists it; false if it already was.
    fn mark_dirty(&mut self, b: u32) -> bool {
        let t = &mut self.topo[b as usize];
        if t.dirty {
            return false;
        }
        t.dirty = true;
        self.dirty.push(b);
        // The rehash reads this line: start the load now, overlapped with
        // the rest of the walk.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch has no effect on memory; the address is in bounds.
        unsafe {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(self.kids.as_ptr().add(b as usize) as *const i8);
        }
        true
    }

    fn mark_dirty_up(&mut self, mut b: u32) {
        while b != NONE && self.mark_dirty(b) {
            let parent = self.topo[b as usize].parent;
            b = if parent == NONE { NONE } else { parent & !SIDE };
        }
    }

    /// The hash held for the child behind a parent link (the root's own
    /// hash for NONE).
    fn slot(&self, parent: u32) -> Hash {
        if parent == NONE {
            self.root_hash
        } else {
            let (p, s) = unlink(parent);
            self.kids[p].0[s]
        }
    }

    /// Sets the hash held for the child behind a parent link.
    fn store(&mut self, parent: u32, hash: Hash) {
        if parent == NONE {
            self.root_hash = hash;
        } else {
            let (p, s) = unlink(parent);
            self.kids[p].0[s] = hash;
        }
    }

    /// Sets the leaf hash of an existing leaf (queued: inserts in between
    /// may move the leaf, and the queue finds it where it is then).
    pub fn update(&mut self, leaf: LeafId, leaf_hash: Hash) {
        assert!((leaf as usize) < self.paths.len(), "update takes a leaf of this tree");
        self.pending.push((leaf, leaf_hash));
        if self.pending.len() >= PENDING_MAX {
            self.apply_pending();
        }
    }

    /// The queued updates, in order (a later one of a leaf wins).
    fn apply_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        for &(leaf, leaf_hash) in &pending {
            let parent = self.leaf_parent[leaf as usize];
            if self.slot(parent) != leaf_hash {
                self.store(parent, leaf_hash);
                if parent != NONE {
                    self.mark_dirty_up(parent & !SIDE);
                }
            }
        }
        self.pending = pending;
        self.pending.clear();
    }

    /// Inserts a new leaf; the path must not be in the tree yet.
    pub fn insert(&mut self, path: Hash, leaf_hash: Hash) -> LeafId {
        let leaf = self.paths.len() as u32;
        assert!(leaf < LEAF - 1 && self.topo.len() < (LEAF - 1) as usize, "tree of 2^31 cells");
        self.paths.push(path);
        self.leaf_parent.push(NONE);
        if self.root == NONE {
            self.root = leaf | LEAF;
            self.root_hash = leaf_hash;
            return leaf;
        }
        // Find the leaf the new path would meet, then where it diverges.
        let mut r = self.root;
        while r & LEAF == 0 {
            let t = &self.topo[r as usize];
            r = t.children[bit_of(&path, t.bit)];
        }
        let other = self.paths[(r & !LEAF) as usize];
        assert_ne!(other, path, "insert of a path already in the tree");
        let diff = first_diff_bit(&path, &other);
        // Walk again to the first node that sits deeper than the divergence.
        let mut parent = NONE;
        let mut r = self.root;
        while r & LEAF == 0 && self.topo[r as usize].bit < diff {
            let t = &self.topo[r as usize];
            let s = bit_of(&path, t.bit);
            parent = link(r, s);
            r = t.children[s];
        }
        let branch = self.topo.len() as u32;
        let side = bit_of(&path, diff);
        let mut children = [NONE; 2];
        children[side] = leaf | LEAF;
        children[1 - side] = r;
        let mut kids = [ZERO; 2];
        kids[side] = leaf_hash;
        if r & LEAF != 0 {
            // A leaf moves with its hash, the same at any depth.
            let l = (r & !LEAF) as usize;
            kids[1 - side] = self.slot(self.leaf_parent[l]);
            self.leaf_parent[l] = link(branch, 1 - side);
        } else {
            // A branch is now seen from a new depth: its hash as the new
            // branch sees it is rehashed from its children, which are intact.
            let t = &mut self.topo[r as usize];
            t.parent = link(branch, 1 - side);
            t.seen = (diff + 1) as u8;
            self.mark_dirty(r);
        }
        self.leaf_parent[leaf as usize] = link(branch, side);
        let seen = if parent == NONE { 0 } else { (self.topo[unlink(parent).0].bit + 1) as u8 };
        self.topo.push(Topo { parent, children, bit: diff, seen, dirty: false });
        self.kids.push(Kids(kids));
        self.below.push(leaf);
        if parent == NONE {
            self.root = branch;
        } else {
            let (p, s) = unlink(parent);
            self.topo[p].children[s] = branch;
        }
        self.mark_dirty_up(branch);
        leaf
    }

    /// The scope root: ZERO when empty. Rehashes what changed since last time.
    pub fn root(&mut self) -> Hash {
        if self.root == NONE {
            return ZERO;
        }
        self.apply_pending();
        if !self.dirty.is_empty() {
            self.rehash();
        }
        self.root_hash
    }

    /// The dirty branches, by bit from the deepest, each bit's hashes
    /// together; a bit with one dirty branch (every bit, after one change)
    /// hashes it alone.
    fn rehash(&mut self) {
        let mut sc = std::mem::take(&mut self.scratch);
        sc.order.clear();
        if self.dirty.len() <= 64 {
            sc.order.extend_from_slice(&self.dirty);
            let topo = &self.topo;
            sc.order.sort_unstable_by_key(|&b| std::cmp::Reverse(topo[b as usize].bit));
        } else {
            // A counting sort over the 256 bits.
            sc.starts.clear();
            sc.starts.resize(257, 0);
            for &b in &self.dirty {
                sc.starts[255 - self.topo[b as usize].bit as usize + 1] += 1;
            }
            for i in 1..sc.starts.len() {
                sc.starts[i] += sc.starts[i - 1];
            }
            sc.order.resize(self.dirty.len(), 0);
            for &b in &self.dirty {
                let k = 255 - self.topo[b as usize].bit as usize;
                sc.order[sc.starts[k] as usize] = b;
                sc.starts[k] += 1;
            }
        }
        self.dirty.clear();
        let mut start = 0;
        while start < sc.order.len() {
            let bit = self.topo[sc.order[start] as usize].bit;
            let mut end = start + 1;
            while end < sc.order.len() && self.topo[sc.order[end] as usize].bit == bit {
                end += 1;
            }
            let nodes = &sc.order[start..end];
            start = end;
            if let [b] = nodes {
                let t = self.topo[*b as usize];
                let k = &self.kids[*b as usize].0;
                let mut h = sha256_tag_pair(1, &k[0], &k[1]);
                if (t.seen as u16) < t.bit {
                    let path = &self.paths[self.below[*b as usize] as usize];
                    for level in (t.seen as u16..t.bit).rev() {
                        h = if bit_of(path, level) == 0 { sha256_tag_pair(1, &h, &ZERO) } else { sha256_tag_pair(1, &ZERO, &h) };
                    }
                }
                self.topo[*b as usize].dirty = false;
                self.store(t.parent, h);
                continue;
            }
            sc.pairs.clear();
            sc.pairs.extend(nodes.iter().map(|&b| {
                let k = &self.kids[b as usize].0;
                (k[0], k[1])
            }));
            sha256_tag_pairs(1, &sc.pairs, &mut sc.out);
            // Wrap up to the depth each is seen from: one level per round,
            // the rounds' hashes again together.
            sc.wraps.clear();
            for (at, &b) in nodes.iter().enumerate() {
                let t = &self.topo[b as usize];
                if (t.seen as u16) < t.bit {
                    let path = self.paths[self.below[b as usize] as usize];
                    sc.wraps.push(Wrap { at: at as u32, level: t.bit, until: t.seen as u16, path });
                }
            }
            while !sc.wraps.is_empty() {
                sc.pairs.clear();
                for w in &mut sc.wraps {
                    w.level -= 1;
                    let h = sc.out[w.at as usize];
                    sc.pairs.push(if bit_of(&w.path, w.level) == 0 { (h, ZERO) } else { (ZERO, h) });
                }
                sha256_tag_pairs(1, &sc.pairs, &mut sc.wrapped);
                for (w, h) in sc.wraps.iter().zip(&sc.wrapped) {
                    sc.out[w.at as usize] = *h;
                }
                sc.wraps.retain(|w| w.level > w.until);
            }
            for (&b, hash) in nodes.iter().zip(&sc.out) {
                let t = &mut self.topo[b as usize];
                t.dirty = false;
                let parent = t.parent;
                self.store(parent, *hash);
            }
        }
        self.scratch = sc;
    }

    /// Bytes of memory held, for the buffer and memory metrics.
    pub fn heap_bytes(&self) -> u64 {
        (self.kids.capacity() * std::mem::size_of::<Kids>()
            + self.topo.capacity() * std::mem::size_of::<Topo>()
            + (self.below.capacity() + self.leaf_parent.capacity() + self.dirty.capacity()) * 4
            + self.pending.capacity() * std::mem::size_of::<(LeafId, Hash)>()
            + self.paths.capacity() * 32) as u64
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
                sha256_tag_pair(1, &go(&cells[..split], d + 1), &go(&cells[split..], d + 1))
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
        assert_eq!(std::mem::size_of::<Topo>(), 16);
        assert_eq!(std::mem::size_of::<Kids>(), 64);
    }

    /// Inserts and updates in random order, the root taken after random
    /// stretches (a few to hundreds of changes), against the reference.
    /// Paths drawn from a few prefixes make long shared runs, so wraps,
    /// inserts above a dirty branch and inserts above a clean one all occur.
    #[test]
    fn random_changes_between_roots_equal_reference() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..6 {
            let mut smt = Smt::new();
            let mut cells: Vec<(Hash, Hash)> = Vec::new();
            let mut ids: Vec<LeafId> = Vec::new();
            let mut since = 0;
            let mut stretch = 1 + next() % 300;
            for step in 0..2500u32 {
                if cells.is_empty() || next() % 3 == 0 {
                    let mut path = sha256(&[round as u8, (step >> 8) as u8, step as u8, 1]);
                    match next() % 4 {
                        0 => path[..4].copy_from_slice(&[0x55; 4]),
                        1 => path[..2].copy_from_slice(&[0x00, 0x01]),
                        _ => {}
                    }
                    if cells.iter().any(|(p, _)| *p == path) {
                        continue;
                    }
                    let leaf = sha256(&path);
                    ids.push(smt.insert(path, leaf));
                    cells.push((path, leaf));
                } else {
                    let k = (next() % cells.len() as u64) as usize;
                    let h = sha256(&[step as u8, (step >> 8) as u8, 7]);
                    smt.update(ids[k], h);
                    cells[k].1 = h;
                }
                since += 1;
                if since >= stretch {
                    assert_eq!(smt.root(), reference_root(&mut cells.clone()), "round {round} step {step}");
                    since = 0;
                    stretch = 1 + next() % 300;
                }
            }
            assert_eq!(smt.root(), reference_root(&mut cells.clone()));
            assert_eq!(smt.len(), cells.len() as u64);
            // More updates than the queue holds, then one root.
            for step in 0..(PENDING_MAX as u32 * 2 + 17) {
                let k = (next() % cells.len() as u64) as usize;
                let h = sha256(&[step as u8, (step >> 8) as u8, (step >> 16) as u8, 9]);
                smt.update(ids[k], h);
                cells[k].1 = h;
            }
            assert_eq!(smt.root(), reference_root(&mut cells.clone()));
        }
    }

    #[test]
    fn a_lone_leaf_is_the_root_and_updates_in_place() {
        let mut smt = Smt::new();
        let p = sha256(b"p");
        let id = smt.insert(p, sha256(b"v1"));
        assert_eq!(smt.root(), sha256(b"v1"));
        smt.update(id, sha256(b"v2"));
        assert_eq!(smt.root(), sha256(b"v2"));
        // Moving under a branch keeps its current hash.
        let q = sha256(b"q");
        smt.insert(q, sha256(b"w"));
        assert_eq!(smt.root(), reference_root(&mut [(p, sha256(b"v2")), (q, sha256(b"w"))]));
    }
}
