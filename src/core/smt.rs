//! The compact sparse Merkle tree of SPEC §8, as a crit-bit (Patricia) trie
//! over 256-bit cell paths with cached hashes.
//!
//! (Over 800 lines on purpose: one data structure, its invariants at the
//! top and its tests against the reference root at the bottom, which
//! STYLE.md holds up as the model of a file; splitting the versions of the
//! branches from the tree would put one invariant in two places.)
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
//!
//! Roots of intermediate states (the convergence check of every op of a
//! chain, §8) are asked for with `checkpoint` and computed together by
//! `take_checkpoint_roots`: each branch on a changed path gets one version
//! per checkpoint that changed below it, the versions' child hashes are
//! resolved from the deeper bits first, and then every version of every
//! branch of one bit is independent of the others, so they too go four at
//! a time through SHA-NI, the root's versions included (`settle_marks`).
//!
//! The root the tree *would* have with a few leaves changed or added (an
//! author's own op, §8: its payload carries the root with the op folded) is
//! `root_with`, which changes nothing: after `root()` every cached hash is
//! clean, and it recurses over the trie with the changes sorted by path,
//! taking a subtree with no change below it as its cached hash and
//! rehashing only the branches on the changes' paths, O(changes × depth)
//! hashes. Where a change leaves a branch's common prefix above the
//! branch's bit, the what-if has a split the tree has not: that branch is
//! seen from a new depth, its hash rebuilt from its (clean) children and
//! wrapped down to it, as `insert` does. The recursion goes a bit deeper
//! each call, so it is at most 257 calls deep.

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
/// Checkpoints whose roots are computed together, at most. Each holds a
/// version of every branch on its changed paths (~17 at 40k cells, 88
/// bytes each): 64 checkpoints of two changes keep the versions within
/// ~200 KB, in the core's L2, and give every bit of the tree dozens of
/// independent hashes for the four SHA lanes.
const MARKS_MAX: usize = 64;

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

/// Wraps each of `out` named in `wraps` up to its `until` level: one
/// level per round, the rounds' hashes again together.
fn wrap_outs(wraps: &mut Vec<Wrap>, pairs: &mut Vec<(Hash, Hash)>, out: &mut [Hash], wrapped: &mut Vec<Hash>) {
    while !wraps.is_empty() {
        pairs.clear();
        for w in wraps.iter_mut() {
            w.level -= 1;
            let h = out[w.at as usize];
            pairs.push(if bit_of(&w.path, w.level) == 0 { (h, ZERO) } else { (ZERO, h) });
        }
        sha256_tag_pairs(1, pairs, wrapped);
        for (w, h) in wraps.iter().zip(wrapped.iter()) {
            out[w.at as usize] = *h;
        }
        wraps.retain(|w| w.level > w.until);
    }
}

/// A branch inserted while checkpoints are outstanding: in the states of
/// the checkpoints before `mark` it does not exist yet, and its parent sees
/// its `old_side` child in its place (see `rehash_versions`).
#[derive(Clone, Copy)]
struct Birth {
    branch: u32,
    /// The checkpoint whose state first has it.
    mark: u32,
    old_side: u8,
    /// The child on `old_side` when it was inserted (a branch or a leaf).
    old: u32,
}

/// A branch as of one checkpoint (see `settle_marks`).
#[derive(Clone)]
struct Version {
    branch: u32,
    /// The same branch's version at an earlier checkpoint, or NONE.
    prev: u32,
    /// The parent's version at the same checkpoint, NONE at the root.
    up: u32,
    /// The checkpoint, from 0.
    mark: u32,
    /// The branch's `bit` and `seen`, and its side below its parent, read
    /// once with the walk up (the tree's lines are not read again).
    bit: u16,
    seen: u8,
    side: u8,
    /// Which children's hashes are set in `kids` (bit per side) before
    /// they are resolved; all of them after.
    set: u8,
    /// Which of `kids` are a leaf's hash (bit per side): a leaf is its own
    /// hash at any depth, a branch's hash is as seen from `bit + 1`.
    leafy: u8,
    /// 0: the branch exists at this checkpoint; 1 + side: it does not yet
    /// (a `Birth`), and passes on its child on that side.
    pass: u8,
    kids: [Hash; 2],
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
    versions: Vec<Version>,
    /// Per branch: its latest version, NONE outside `settle_marks`.
    latest: Vec<u32>,
    /// Per checkpoint: the root's version's hash, if it has one.
    roots: Vec<Option<Hash>>,
    /// `root_with`'s changes, sorted by path, each path once.
    changes: Vec<(Hash, Hash)>,
}

/// `Smt::roots_together`'s lists, kept between calls: the dirty
/// branches of all the trees (bit, tree, branch), and one bit's hashes.
#[derive(Default)]
pub struct TogetherScratch {
    order: Vec<(u16, u32, u32)>,
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
    /// Checkpoints not computed yet: the length of `pending` at each.
    marks: Vec<u32>,
    /// Roots of checkpoints computed before they were asked for (a full
    /// queue comes after them), in order.
    ready: Vec<Hash>,
    /// Branches inserted while checkpoints were outstanding, in order
    /// (consecutive branch indices).
    births: Vec<Birth>,
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

/// Leading bits two paths share: 256 when they are equal.
fn common_bits(a: &Hash, b: &Hash) -> u16 {
    if a == b {
        256
    } else {
        first_diff_bit(a, b)
    }
}

/// Wraps a hash seen from depth `from` up to depth `until`: once a level,
/// on the side `path` takes there (all paths below share those bits).
fn wrap(mut h: Hash, path: &Hash, from: u16, until: u16) -> Hash {
    for level in (until..from).rev() {
        h = if bit_of(path, level) == 0 { sha256_tag_pair(1, &h, &ZERO) } else { sha256_tag_pair(1, &ZERO, &h) };
    }
    h
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
            marks: Vec::new(),
            ready: Vec::new(),
            births: Vec::new(),
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
        super::prefetch(&self.kids[b as usize]);
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
            self.settle_marks();
            if self.pending.len() >= PENDING_MAX {
                self.apply_pending();
            }
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
        if self.root == NONE {
            // The states before a tree's first leaf have no shape to pass
            // anything through: compute them first.
            self.settle_marks();
        }
        // With checkpoints outstanding the new branch is recorded as a
        // birth instead of marked dirty: the checkpoints before it are
        // computed on this shape with it passed through.
        let open = !self.marks.is_empty();
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
            if !open {
                self.mark_dirty(r);
            }
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
        if open {
            debug_assert!(self.births.last().is_none_or(|b| b.branch + 1 == branch), "births are consecutive branches");
            self.births.push(Birth { branch, mark: self.marks.len() as u32, old_side: (1 - side) as u8, old: r });
        } else {
            self.mark_dirty_up(branch);
        }
        leaf
    }

    /// The scope root: ZERO when empty. Rehashes what changed since last time.
    pub fn root(&mut self) -> Hash {
        if self.root == NONE {
            return ZERO;
        }
        self.settle_marks();
        self.apply_pending();
        if !self.dirty.is_empty() {
            self.rehash();
        }
        self.root_hash
    }

    /// The root the tree would have with each `(path, leaf_hash)` of
    /// `changes` set: the leaf at `path` replaced, or a new leaf added where
    /// there is none. The tree is left as it was (only its queue applied and
    /// its hashes refreshed, as by `root()`). The changes may come in any
    /// order; of several of one path, the last wins.
    pub fn root_with(&mut self, changes: &[(Hash, Hash)]) -> Hash {
        let root = self.root();
        if changes.is_empty() {
            return root;
        }
        debug_assert!(self.pending.is_empty() && self.dirty.is_empty() && self.marks.is_empty(), "clean after root()");
        let mut sorted = std::mem::take(&mut self.scratch.changes);
        sorted.clear();
        sorted.extend_from_slice(changes);
        // Stable, so a path's changes stay in order and the last is kept.
        sorted.sort_by_key(|c| c.0);
        sorted.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = later.1;
            }
            same
        });
        let h = self.merged_hash(self.root, 0, &sorted);
        self.scratch.changes = sorted;
        h
    }

    /// The hash seen from depth `d` of the leaves under `r` (NONE: none)
    /// with `changes` (sorted, distinct paths) set among them; every path
    /// of both shares its first `d` bits. Reads only clean hashes.
    fn merged_hash(&self, r: u32, d: u16, changes: &[(Hash, Hash)]) -> Hash {
        let (Some(first), Some(last)) = (changes.first(), changes.last()) else {
            return self.hash_from(r, d);
        };
        // A path under `r`, and the bit where its paths differ (256: one).
        let (path, bit) = if r == NONE {
            (first.0, 256)
        } else if r & LEAF != 0 {
            (self.paths[(r & !LEAF) as usize], 256)
        } else {
            (self.paths[self.below[r as usize] as usize], self.topo[r as usize].bit)
        };
        // The first bit where the merged set differs: a sorted run's
        // common prefix with a path is the shorter of its ends'.
        let split = bit.min(common_bits(&first.0, &last.0)).min(common_bits(&path, &first.0)).min(common_bits(&path, &last.0));
        if split == 256 {
            // One path: the change, replacing the leaf if `r` is one.
            return first.1;
        }
        let at = changes.partition_point(|(p, _)| bit_of(p, split) == 0);
        let halves = [&changes[..at], &changes[at..]];
        let mut kids = [ZERO; 2];
        if split == bit {
            // A side with no change is the hash the branch holds for it (not
            // the child's own lines: one load fewer a level).
            let children = self.topo[r as usize].children;
            for side in 0..2 {
                kids[side] = if halves[side].is_empty() {
                    self.kids[r as usize].0[side]
                } else {
                    self.merged_hash(children[side], split + 1, halves[side])
                };
            }
        } else {
            // A split the tree does not have: `r` whole on its side, only
            // changes on the other.
            let side = bit_of(&path, split);
            kids[side] = self.merged_hash(r, split + 1, halves[side]);
            kids[1 - side] = self.merged_hash(NONE, split + 1, halves[1 - side]);
        }
        wrap(sha256_tag_pair(1, &kids[0], &kids[1]), &path, split, d)
    }

    /// The clean hash of `r` (NONE: none) seen from depth `d`, at most its
    /// bit: held by its parent when `d` is where the parent sees it from,
    /// else rebuilt from its children's.
    fn hash_from(&self, r: u32, d: u16) -> Hash {
        if r == NONE {
            return ZERO;
        }
        if r & LEAF != 0 {
            return self.slot(self.leaf_parent[(r & !LEAF) as usize]);
        }
        let t = self.topo[r as usize];
        debug_assert!(t.seen as u16 <= d && d <= t.bit, "a branch is seen from between its parent and its bit");
        if d == t.seen as u16 {
            return self.slot(t.parent);
        }
        let k = &self.kids[r as usize].0;
        wrap(sha256_tag_pair(1, &k[0], &k[1]), &self.paths[self.below[r as usize] as usize], t.bit, d)
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
                    h = wrap(h, &self.paths[self.below[*b as usize] as usize], t.bit, t.seen as u16);
                }
                self.topo[*b as usize].dirty = false;
                self.store(t.parent, h);
                continue;
            }
            Smt::hash_bit(
                &mut [&mut *self],
                nodes.iter().map(|&b| (0, b)),
                &mut sc.pairs,
                &mut sc.out,
                &mut sc.wraps,
                &mut sc.wrapped,
            );
        }
        self.scratch = sc;
    }

    /// Hashes one bit's dirty branches together (four at a time through
    /// SHA-NI), wraps each up to the depth its parent sees it from (one
    /// level per round, the rounds' hashes again together), and stores each
    /// in its parent. `nodes` names each branch by its tree in `trees` and
    /// its index there; they are independent, a bit's branches being.
    fn hash_bit(
        trees: &mut [&mut Smt],
        nodes: impl Iterator<Item = (usize, u32)> + Clone,
        pairs: &mut Vec<(Hash, Hash)>,
        out: &mut Vec<Hash>,
        wraps: &mut Vec<Wrap>,
        wrapped: &mut Vec<Hash>,
    ) {
        pairs.clear();
        pairs.extend(nodes.clone().map(|(i, b)| {
            let k = &trees[i].kids[b as usize].0;
            (k[0], k[1])
        }));
        sha256_tag_pairs(1, pairs, out);
        wraps.clear();
        for (at, (i, b)) in nodes.clone().enumerate() {
            let t = &trees[i];
            let topo = &t.topo[b as usize];
            if (topo.seen as u16) < topo.bit {
                let path = t.paths[t.below[b as usize] as usize];
                wraps.push(Wrap { at: at as u32, level: topo.bit, until: topo.seen as u16, path });
            }
        }
        wrap_outs(wraps, pairs, out, wrapped);
        for ((i, b), hash) in nodes.zip(out.iter()) {
            let t = &mut trees[i];
            let topo = &mut t.topo[b as usize];
            topo.dirty = false;
            let parent = topo.parent;
            t.store(parent, *hash);
        }
    }

    /// `root()` of each tree, into `out` in order, the rehash of all of
    /// them done together: the dirty branches of every tree taken by their
    /// bit, deepest first, and each bit's branches of all the trees hashed
    /// together, four at a time through SHA-NI. A small tree has one or
    /// two dirty branches a bit, which its own `rehash` hashes one at a
    /// time; a commit touching thousands of small scopes asks for a root
    /// of each (their statuses), and those single hashes were a quarter of
    /// the fold (`cargo bench --bench stages -- "fold many scopes"`).
    /// The trees are independent, and within one tree the order is
    /// `rehash`'s, so each root is the one `root()` gives.
    pub fn roots_together(trees: &mut [&mut Smt], sc: &mut TogetherScratch, out: &mut Vec<Hash>) {
        sc.order.clear();
        for (i, t) in trees.iter_mut().enumerate() {
            if t.root == NONE {
                continue;
            }
            t.settle_marks();
            t.apply_pending();
            for &b in &t.dirty {
                sc.order.push((t.topo[b as usize].bit, i as u32, b));
            }
            t.dirty.clear();
        }
        sc.order.sort_unstable_by_key(|&(bit, _, _)| std::cmp::Reverse(bit));
        let mut start = 0;
        while start < sc.order.len() {
            let bit = sc.order[start].0;
            let mut end = start + 1;
            while end < sc.order.len() && sc.order[end].0 == bit {
                end += 1;
            }
            let nodes = &sc.order[start..end];
            start = end;
            Smt::hash_bit(trees, nodes.iter().map(|&(_, i, b)| (i as usize, b)), &mut sc.pairs, &mut sc.out, &mut sc.wraps, &mut sc.wrapped);
        }
        out.extend(trees.iter().map(|t| if t.root == NONE { ZERO } else { t.root_hash }));
    }

    /// Asks for the root of the current state, to be returned in order by
    /// `take_checkpoint_roots`; the updates after it stay queued.
    pub fn checkpoint(&mut self) {
        self.marks.push(self.pending.len() as u32);
        if self.marks.len() >= MARKS_MAX {
            self.settle_marks();
        }
    }

    /// The roots of the checkpoints since the last call, in order.
    pub fn take_checkpoint_roots(&mut self, out: &mut Vec<Hash>) {
        self.settle_marks();
        out.append(&mut self.ready);
    }

    /// Computes the roots of the outstanding checkpoints into `ready`,
    /// leaving the tree as of the last one (later updates stay queued).
    fn settle_marks(&mut self) {
        if self.marks.is_empty() {
            return;
        }
        if self.births.is_empty() && (self.marks.len() == 1 || self.root & LEAF != 0) {
            // One state (or a tree of one leaf): the plain rehash.
            let marks = std::mem::take(&mut self.marks);
            let mut pending = std::mem::take(&mut self.pending);
            let mut done = 0;
            for &m in &marks {
                self.pending.extend_from_slice(&pending[done..m as usize]);
                done = m as usize;
                self.apply_pending();
                if !self.dirty.is_empty() {
                    self.rehash();
                }
                self.ready.push(self.root_hash);
            }
            pending.drain(..done);
            self.pending = pending;
            self.marks = marks;
            self.marks.clear();
            return;
        }
        self.rehash_versions();
    }

    /// The roots of several checkpoints at once (see the module's doc).
    ///
    /// Branches inserted among the checkpoints (`births`) are in the shape
    /// already; in the states before its birth such a branch does not
    /// exist, and its version there passes its old child's hash on to its
    /// parent, wrapped over its own levels (the levels where, without its
    /// new leaf, every path below it agrees), or as it is for a leaf's.
    fn rehash_versions(&mut self) {
        let mut sc = std::mem::take(&mut self.scratch);
        if sc.latest.len() < self.topo.len() {
            sc.latest.resize(self.topo.len(), NONE);
        }
        sc.versions.clear();
        let marks = self.marks.len() as u32;
        let births = std::mem::take(&mut self.births);
        let born_base = births.first().map_or(u32::MAX, |b| b.branch);
        // Versions: the branches already dirty belong to the first
        // checkpoint; each birth and each queued update to the checkpoint
        // it precedes, taken in checkpoint order.
        let dirty = std::mem::take(&mut self.dirty);
        let last = *self.marks.last().expect("marks to settle") as usize;
        self.warm_paths(self.pending[..last].iter().map(|&(leaf, _)| self.leaf_parent[leaf as usize] & !SIDE));
        for &b in &dirty {
            self.version_up(&mut sc, &births, born_base, b, 0);
        }
        let mut done = 0;
        let mut next_birth = 0;
        for (mark, &end) in self.marks.iter().enumerate() {
            let mark = mark as u32;
            while next_birth < births.len() && births[next_birth].mark == mark {
                let birth = births[next_birth];
                self.version_up(&mut sc, &births, born_base, birth.branch, mark);
                if birth.old & LEAF == 0 {
                    // Seen from a new depth from here on.
                    self.version_up(&mut sc, &births, born_base, birth.old, mark);
                }
                next_birth += 1;
            }
            for &(leaf, hash) in &self.pending[done..end as usize] {
                let (b, side) = unlink(self.leaf_parent[leaf as usize]);
                let v = self.version_up(&mut sc, &births, born_base, b as u32, mark) as usize;
                sc.versions[v].kids[side] = hash;
                sc.versions[v].set |= 1 << side;
                sc.versions[v].leafy |= 1 << side;
            }
            done = end as usize;
        }
        // By bit from the deepest (a counting sort, stable: a branch's
        // versions stay in checkpoint order).
        sc.starts.clear();
        sc.starts.resize(257, 0);
        for v in &sc.versions {
            sc.starts[255 - v.bit as usize + 1] += 1;
        }
        for i in 1..sc.starts.len() {
            sc.starts[i] += sc.starts[i - 1];
        }
        sc.order.resize(sc.versions.len(), 0);
        for (i, v) in sc.versions.iter().enumerate() {
            let k = 255 - v.bit as usize;
            sc.order[sc.starts[k] as usize] = i as u32;
            sc.starts[k] += 1;
        }
        sc.roots.clear();
        sc.roots.resize(marks as usize, None);
        let mut start = 0;
        while start < sc.order.len() {
            let bit = sc.versions[sc.order[start] as usize].bit;
            let mut end = start + 1;
            while end < sc.order.len() && sc.versions[sc.order[end] as usize].bit == bit {
                end += 1;
            }
            // Children's hashes: those set at this checkpoint, else the
            // branch's previous version's, else its line's (current).
            sc.pairs.clear();
            for &i in &sc.order[start..end] {
                let v = &sc.versions[i as usize];
                let b = v.branch as usize;
                let (base, base_leafy) = if v.prev == NONE {
                    let c = self.topo[b].children;
                    (self.kids[b].0, u8::from(c[0] & LEAF != 0) | u8::from(c[1] & LEAF != 0) << 1)
                } else {
                    let p = &sc.versions[v.prev as usize];
                    (p.kids, p.leafy)
                };
                let mut kids = v.kids;
                let mut leafy = v.leafy;
                for (side, kid) in kids.iter_mut().enumerate() {
                    if v.set & (1 << side) == 0 {
                        *kid = base[side];
                        leafy = (leafy & !(1 << side)) | (base_leafy & (1 << side));
                    }
                }
                if v.pass == 0 {
                    sc.pairs.push((kids[0], kids[1]));
                }
                let v = &mut sc.versions[i as usize];
                v.kids = kids;
                v.leafy = leafy;
                v.set = 3;
            }
            sha256_tag_pairs(1, &sc.pairs, &mut sc.wrapped);
            // Each version's hash as its branch's own (or, not born yet, its
            // old child's), then wrapped up to where its parent sees it.
            sc.out.clear();
            sc.wraps.clear();
            let mut hashed = 0;
            for (at, &i) in sc.order[start..end].iter().enumerate() {
                let v = &sc.versions[i as usize];
                let b = v.branch as usize;
                let (h, from, wrap) = if v.pass == 0 {
                    hashed += 1;
                    (sc.wrapped[hashed - 1], v.bit, true)
                } else {
                    let side = (v.pass - 1) as usize;
                    (v.kids[side], v.bit + 1, v.leafy & (1 << side) == 0)
                };
                sc.out.push(h);
                if wrap && (v.seen as u16) < from {
                    let under = if v.pass == 0 { b } else { self.topo[b].children[(v.pass - 1) as usize] as usize };
                    let path = self.paths[self.below[under] as usize];
                    sc.wraps.push(Wrap { at: at as u32, level: from, until: v.seen as u16, path });
                }
            }
            wrap_outs(&mut sc.wraps, &mut sc.pairs, &mut sc.out, &mut sc.wrapped);
            for (at, &i) in sc.order[start..end].iter().enumerate() {
                let (up, mark, side) = {
                    let v = &sc.versions[i as usize];
                    (v.up, v.mark, v.side as usize)
                };
                let v = &sc.versions[i as usize];
                let leafy = v.pass != 0 && v.leafy & (1 << (v.pass - 1)) != 0;
                let hash = sc.out[at];
                if up == NONE {
                    sc.roots[mark as usize] = Some(hash);
                } else {
                    let u = &mut sc.versions[up as usize];
                    u.kids[side] = hash;
                    u.set |= 1 << side;
                    u.leafy = (u.leafy & !(1 << side)) | (u8::from(leafy) << side);
                }
            }
            start = end;
        }
        // The tree as of the last checkpoint: each branch's latest version.
        for i in 0..sc.versions.len() {
            let b = sc.versions[i].branch as usize;
            if sc.latest[b] == i as u32 {
                sc.latest[b] = NONE;
                self.kids[b].0 = sc.versions[i].kids;
            }
        }
        for &b in &dirty {
            self.topo[b as usize].dirty = false;
        }
        let mut root = self.root_hash;
        for r in &sc.roots {
            root = r.unwrap_or(root);
            self.ready.push(root);
        }
        self.root_hash = root;
        self.dirty = dirty;
        self.dirty.clear();
        self.pending.drain(..done);
        self.marks.clear();
        self.scratch = sc;
        // Branches born after the last checkpoint: dirty, as an insert
        // marks them when no checkpoint is outstanding.
        for birth in births.iter().filter(|b| b.mark == marks) {
            if birth.old & LEAF == 0 {
                self.mark_dirty(birth.old);
            }
            self.mark_dirty_up(birth.branch);
        }
    }

    /// Loads the tree's lines on the paths from these branches up to the
    /// root, many paths at a time: each path is a chain of dependent loads
    /// (a branch's line names its parent), and a walk of one path at a time
    /// waits for each in turn, where walks taken a level each in turn
    /// overlap their loads. Changes nothing.
    fn warm_paths(&self, from: impl Iterator<Item = u32>) {
        const WALKS: usize = 16;
        let mut from = from.filter(|&b| (b as usize) < self.topo.len());
        let mut cur = [NONE; WALKS];
        let mut live = 0;
        for c in cur.iter_mut() {
            if let Some(b) = from.next() {
                *c = b;
                live += 1;
            }
        }
        while live > 0 {
            for c in cur.iter_mut() {
                if *c == NONE {
                    continue;
                }
                let b = *c as usize;
                let t = self.topo[b];
                super::prefetch(&self.kids[b]);
                if (t.seen as u16) < t.bit {
                    super::prefetch(&self.paths[self.below[b] as usize]);
                }
                *c = if t.parent == NONE { NONE } else { t.parent & !SIDE };
                if *c == NONE {
                    match from.next() {
                        Some(b) => *c = b,
                        None => live -= 1,
                    }
                }
            }
        }
    }

    /// The version of branch `b` at checkpoint `mark`, made if it has none,
    /// with those of its ancestors up to one that has it already.
    fn version_up(&self, sc: &mut Scratch, births: &[Birth], born_base: u32, b: u32, mark: u32) -> u32 {
        let mut b = b;
        let mut child = NONE;
        let mut first = NONE;
        loop {
            let latest = sc.latest[b as usize];
            let found = latest != NONE && sc.versions[latest as usize].mark == mark;
            let t = self.topo[b as usize];
            let v = if found {
                latest
            } else {
                let v = sc.versions.len() as u32;
                let side = (t.parent >> 31) as u8;
                let pass = match b.checked_sub(born_base).and_then(|i| births.get(i as usize)) {
                    Some(birth) if mark < birth.mark => 1 + birth.old_side,
                    _ => 0,
                };
                sc.versions.push(Version {
                    branch: b,
                    prev: latest,
                    up: NONE,
                    mark,
                    bit: t.bit,
                    seen: t.seen,
                    side,
                    set: 0,
                    leafy: 0,
                    pass,
                    kids: [ZERO; 2],
                });
                sc.latest[b as usize] = v;
                v
            };
            if child != NONE {
                sc.versions[child as usize].up = v;
            }
            if first == NONE {
                first = v;
            }
            let parent = t.parent;
            if found || parent == NONE {
                return first;
            }
            child = v;
            b = parent & !SIDE;
        }
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

    /// The roots of many trees computed together equal each tree's
    /// reference, round after round of random changes to some of them:
    /// trees of no leaf and of one, trees with nothing changed, long shared
    /// prefixes (wraps), inserts and updates, and checkpoints outstanding
    /// in some (their roots, taken after, still those of their points).
    #[test]
    fn roots_together_equal_each_trees_reference() {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x6A09_E667_F3BC_C909);
        let mut next = move || rand::Rng::gen::<u64>(&mut rng);
        const TREES: usize = 40;
        let mut trees: Vec<Smt> = (0..TREES).map(|_| Smt::new()).collect();
        let mut cells: Vec<Vec<(Hash, Hash)>> = vec![Vec::new(); TREES];
        let mut ids: Vec<Vec<LeafId>> = vec![Vec::new(); TREES];
        let mut sc = TogetherScratch::default();
        let mut n = 0u32;
        for round in 0..60 {
            // Checkpoints asked for in this round, per tree: the reference
            // roots they must come back as.
            let mut wanted: Vec<Vec<Hash>> = vec![Vec::new(); TREES];
            for _ in 0..(next() % 120) {
                // Trees 0 and 1 stay empty; tree 2 keeps one leaf.
                let t = 2 + (next() % (TREES as u64 - 2)) as usize;
                if cells[t].is_empty() || (t != 2 && next() % 3 == 0) {
                    n += 1;
                    let mut path = sha256(&n.to_le_bytes());
                    if next() % 3 == 0 {
                        path[..3].copy_from_slice(&[0x5A, 0xA5, 0x0F]);
                    }
                    let leaf = sha256(&path);
                    ids[t].push(trees[t].insert(path, leaf));
                    cells[t].push((path, leaf));
                } else {
                    let k = (next() % cells[t].len() as u64) as usize;
                    n += 1;
                    let h = sha256(&[n as u8, (n >> 8) as u8, (n >> 16) as u8, 3]);
                    trees[t].update(ids[t][k], h);
                    cells[t][k].1 = h;
                }
                if next() % 5 == 0 {
                    trees[t].checkpoint();
                    wanted[t].push(reference_root(&mut cells[t].clone()));
                }
            }
            let mut roots = Vec::new();
            let mut refs: Vec<&mut Smt> = trees.iter_mut().collect();
            Smt::roots_together(&mut refs, &mut sc, &mut roots);
            assert_eq!(roots.len(), TREES);
            for (t, root) in roots.iter().enumerate() {
                assert_eq!(*root, reference_root(&mut cells[t].clone()), "round {round} tree {t}");
                let mut checkpoints = Vec::new();
                trees[t].take_checkpoint_roots(&mut checkpoints);
                assert_eq!(checkpoints, wanted[t], "round {round} tree {t}: the checkpoints' roots");
                assert_eq!(trees[t].root(), *root, "clean after");
            }
        }
        assert!(cells[0].is_empty() && cells[2].len() == 1);
        assert!(cells.iter().filter(|c| c.len() > 20).count() > TREES / 2);
    }

    /// Roots asked for at checkpoints between changes and computed
    /// together equal the reference at each checkpoint: with inserts among
    /// them (which compute the ones before them first), more checkpoints
    /// than one batch holds, several updates of a leaf between two
    /// checkpoints, checkpoints with no change in between, a root read in
    /// the middle, updates queued after the last checkpoint, and trees of
    /// no leaf and of one.
    #[test]
    fn checkpoint_roots_equal_the_reference_at_each_checkpoint() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..8u8 {
            let mut smt = Smt::new();
            let mut cells: Vec<(Hash, Hash)> = Vec::new();
            let mut ids: Vec<LeafId> = Vec::new();
            let mut want: Vec<Hash> = Vec::new();
            let mut got: Vec<Hash> = Vec::new();
            // Rounds differ in how often the shape changes: from an insert
            // every few steps to none after the first cells.
            let insert_every = [3u64, 10, 40, 1_000_000][round as usize % 4];
            for step in 0..3000u32 {
                let r = next() % 100;
                if r < 30 {
                    want.push(reference_root(&mut cells.clone()));
                    smt.checkpoint();
                } else if cells.len() < 2 || (cells.len() < 400 && next() % insert_every == 0) {
                    let mut path = sha256(&[round, (step >> 8) as u8, step as u8, 3]);
                    if next() % 3 == 0 {
                        path[..3].copy_from_slice(&[0x5A; 3]);
                    }
                    if cells.iter().any(|(p, _)| *p == path) {
                        continue;
                    }
                    let leaf = sha256(&path);
                    ids.push(smt.insert(path, leaf));
                    cells.push((path, leaf));
                } else if r < 98 {
                    let k = (next() % cells.len() as u64) as usize;
                    let h = sha256(&[step as u8, (step >> 8) as u8, round, 5]);
                    smt.update(ids[k], h);
                    cells[k].1 = h;
                } else if r < 99 {
                    assert_eq!(smt.root(), reference_root(&mut cells.clone()), "round {round} step {step}: root");
                } else {
                    smt.take_checkpoint_roots(&mut got);
                    assert_eq!(got, want, "round {round} step {step}");
                }
            }
            smt.take_checkpoint_roots(&mut got);
            assert_eq!(got, want, "round {round}: at the end");
            assert_eq!(smt.root(), reference_root(&mut cells.clone()));
        }
        // No leaf, then one: checkpoints of an empty tree and of a lone leaf.
        let mut smt = Smt::new();
        smt.checkpoint();
        let id = smt.insert(sha256(b"p"), sha256(b"v1"));
        smt.checkpoint();
        smt.update(id, sha256(b"v2"));
        smt.checkpoint();
        smt.checkpoint();
        let mut got = Vec::new();
        smt.take_checkpoint_roots(&mut got);
        assert_eq!(got, vec![ZERO, sha256(b"v1"), sha256(b"v2"), sha256(b"v2")]);
    }

    /// `root_with` against the reference root of the merged set, over
    /// random trees (of 0, 1, 2, a few, hundreds and thousands of leaves)
    /// and random change sets (empty; updates; new paths; new paths one bit
    /// from an existing one, or sharing a long prefix with it; a path twice,
    /// the last winning; mixes). Paths come fully random, differing only in
    /// the last byte or the last bits, or under a short shared prefix, so
    /// new splits fall above, below and at existing branches' bits. After
    /// each, the tree's own root is unchanged; between rounds of change sets
    /// some of them are made for real (with updates left queued and a
    /// checkpoint outstanding when `root_with` is next asked), and the tree
    /// still gives the reference roots.
    #[test]
    fn root_with_equals_the_reference_of_the_merged_set() {
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0xD1B5_4A32_D192_ED03u64);
        let mut next = move || rand::RngCore::next_u64(&mut rng);
        fn random_path(next: &mut impl FnMut() -> u64) -> Hash {
            let mut p = [0u8; 32];
            for chunk in p.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_le_bytes());
            }
            p
        }
        // A path near `base`: random, the same but for the last byte or the
        // last two, under a four-byte prefix, or one bit of it flipped.
        fn path_near(base: &Hash, next: &mut impl FnMut() -> u64) -> Hash {
            let mut p = random_path(next);
            match next() % 6 {
                0 => {}
                1 => p[..31].copy_from_slice(&base[..31]),
                2 => p[..30].copy_from_slice(&base[..30]),
                3 => p[..4].copy_from_slice(&base[..4]),
                _ => {
                    p = *base;
                    let bit = if next().is_multiple_of(2) { 248 + next() % 8 } else { next() % 256 };
                    p[(bit / 8) as usize] ^= 0x80 >> (bit % 8);
                }
            }
            p
        }
        let mut checked = 0u32;
        for (round, &size) in [0usize, 1, 2, 3, 5, 9, 40, 300, 3000, 0, 1, 2, 17, 1000].iter().enumerate() {
            let base = random_path(&mut next);
            let mut smt = Smt::new();
            let mut cells: Vec<(Hash, Hash)> = Vec::new();
            let mut ids: Vec<LeafId> = Vec::new();
            let mut at: std::collections::HashMap<Hash, usize> = std::collections::HashMap::new();
            while cells.len() < size {
                let anchor = if cells.is_empty() || next() % 2 == 0 { base } else { cells[(next() % cells.len() as u64) as usize].0 };
                let path = path_near(&anchor, &mut next);
                if at.contains_key(&path) {
                    continue;
                }
                let leaf = random_path(&mut next);
                at.insert(path, cells.len());
                ids.push(smt.insert(path, leaf));
                cells.push((path, leaf));
            }
            for stage in 0..4 {
                let before = smt.root();
                assert_eq!(before, reference_root(&mut cells.clone()), "round {round} stage {stage}");
                for set in 0..24 {
                    let n = [0u64, 1, 1, 2, 3, 5, 12, 40][(next() % 8) as usize];
                    let mut changes: Vec<(Hash, Hash)> = Vec::new();
                    for _ in 0..n {
                        let path = match next() % 4 {
                            0 if !cells.is_empty() => cells[(next() % cells.len() as u64) as usize].0,
                            1 if !changes.is_empty() => changes[(next() % changes.len() as u64) as usize].0,
                            2 if !cells.is_empty() => path_near(&cells[(next() % cells.len() as u64) as usize].0, &mut next),
                            _ => path_near(&base, &mut next),
                        };
                        changes.push((path, random_path(&mut next)));
                    }
                    let mut merged = cells.clone();
                    for &(path, leaf) in &changes {
                        match merged.iter().position(|(p, _)| *p == path) {
                            Some(i) => merged[i].1 = leaf,
                            None => merged.push((path, leaf)),
                        }
                    }
                    let want = reference_root(&mut merged);
                    assert_eq!(smt.root_with(&changes), want, "round {round} stage {stage} set {set}: {changes:?}");
                    assert_eq!(smt.root(), before, "round {round} stage {stage} set {set}: the tree is unchanged");
                    assert_eq!(smt.len(), cells.len() as u64);
                    checked += 1;
                }
                // Some changes for real: updates and inserts, some of the
                // updates left queued for the next `root_with`, behind a
                // checkpoint.
                let mut checkpoint = None;
                for k in 0..(1 + next() % 20) {
                    let path = if !cells.is_empty() && next() % 2 == 0 {
                        cells[(next() % cells.len() as u64) as usize].0
                    } else {
                        path_near(&base, &mut next)
                    };
                    let leaf = random_path(&mut next);
                    match at.get(&path) {
                        Some(&i) => {
                            smt.update(ids[i], leaf);
                            cells[i].1 = leaf;
                        }
                        None => {
                            at.insert(path, cells.len());
                            ids.push(smt.insert(path, leaf));
                            cells.push((path, leaf));
                        }
                    }
                    if k == 2 {
                        smt.checkpoint();
                        checkpoint = Some(reference_root(&mut cells.clone()));
                    }
                }
                let extra = (path_near(&base, &mut next), random_path(&mut next));
                let mut merged = cells.clone();
                match merged.iter().position(|(p, _)| *p == extra.0) {
                    Some(i) => merged[i].1 = extra.1,
                    None => merged.push(extra),
                }
                assert_eq!(smt.root_with(&[extra]), reference_root(&mut merged), "round {round} stage {stage}: with a queue");
                let mut got = Vec::new();
                smt.take_checkpoint_roots(&mut got);
                assert_eq!(got, checkpoint.into_iter().collect::<Vec<_>>(), "round {round} stage {stage}: checkpoint");
            }
        }
        assert!(checked > 1000);
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
