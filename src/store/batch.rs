//! A commit's writes encoded as RocksDB encodes a write batch, in Rust and
//! on a thread of their own (`pipeline::committer`'s encoder), so that the
//! committer, one thread for all scopes, only hands the bytes to RocksDB.
//!
//! Building the batch through RocksDB's C API (one call per write, each
//! appending to the batch's `std::string`) and sorting its writes were 28%
//! of the committer's thread in `causal` (`perf record`, 2026-12-06): on a
//! machine of many cores that thread is the node's cap (ARCHITECTURE.md,
//! "Cost per stage").
//!
//! The encoding is RocksDB's write batch, which is also its WAL record
//! (`db/write_batch.cc`): a 12-byte header, a sequence number that RocksDB
//! sets at the write and the record count (fixed32, little endian), then
//! one record per write: `0x05` (a put into a column family), the family's
//! id, the key and the value, each length a varint32; or `0x04` (a
//! delete), the id and the key. Batches encoded apart are joined as
//! RocksDB's `WriteBatchInternal::Append` joins them: one header, their
//! counts summed, their records in order.
//!
//! This module knows no RocksDB: the store learns each table's id from
//! RocksDB's own encoding of a write, and checks this encoder against it
//! on every kind of record before using it (`store::rocks`), else builds
//! its batches through the C API as before.

use crate::core::{Cf, Write};

/// Bytes before the first record: the sequence number and the count.
pub const HEADER_BYTES: usize = 12;
/// The record tags of a put and a delete in a column family other than
/// the default.
pub const TAG_PUT: u8 = 0x05;
pub const TAG_DELETE: u8 = 0x04;

const TABLES: usize = Cf::ALL.len();

/// Encodes writes into the store's batches: its tables' ids, and which
/// tables' writes go in key order.
#[derive(Clone, Debug)]
pub struct BatchEncoder {
    ids: [u32; TABLES],
    in_key_order: [bool; TABLES],
}

/// One commit's writes as a batch, ready for `Store::write_encoded`.
#[derive(Debug)]
pub struct Encoded {
    rep: Vec<u8>,
    per_table: [u32; TABLES],
}

impl Encoded {
    /// The batch's records.
    pub fn records(&self) -> u32 {
        u32::from_le_bytes(self.rep[8..HEADER_BYTES].try_into().expect("a header"))
    }

    /// The batch as RocksDB reads it.
    pub fn bytes(&self) -> &[u8] {
        &self.rep
    }

    /// Writes per table, in the order of `Cf::ALL`.
    pub fn per_table(&self) -> &[u32; TABLES] {
        &self.per_table
    }
}

impl BatchEncoder {
    /// `ids[i]`: the column family id of `Cf::ALL[i]`; `in_key_order(cf)`:
    /// whether that table's writes are sorted by key (a skip-list memtable
    /// inserts them faster so; a write to one key keeps its order).
    pub fn new(ids: [u32; TABLES], in_key_order: impl Fn(Cf) -> bool) -> Self {
        BatchEncoder { ids, in_key_order: Cf::ALL.map(in_key_order) }
    }

    /// `writes` as one batch, in `in_batch_order`.
    pub fn encode(&self, writes: &[Write]) -> Encoded {
        let order = in_batch_order(writes, |cf| self.in_key_order[cf as usize]);
        self.encode_in_order(order.into_iter(), writes.len())
    }

    /// `writes` as one batch, in the order given; `n` of them.
    pub fn encode_in_order<'a>(&self, writes: impl Iterator<Item = &'a Write> + Clone, n: usize) -> Encoded {
        // Sized up front: a varint32 is at most five bytes.
        let bytes: usize = writes
            .clone()
            .map(|w| match w {
                Write::Put(_, k, v) => 11 + k.len() + v.len(),
                Write::Delete(_, k) => 6 + k.len(),
            })
            .sum();
        let mut rep = Vec::with_capacity(HEADER_BYTES + bytes + 5 * n);
        rep.extend_from_slice(&[0; HEADER_BYTES]);
        let mut per_table = [0u32; TABLES];
        let mut count: u32 = 0;
        for w in writes {
            let (t, key) = table_and_key(w);
            per_table[t as usize] += 1;
            count += 1;
            match w {
                Write::Put(..) => rep.push(TAG_PUT),
                Write::Delete(..) => rep.push(TAG_DELETE),
            }
            varint32(&mut rep, self.ids[t as usize]);
            slice(&mut rep, key);
            if let Write::Put(_, _, v) = w {
                slice(&mut rep, v);
            }
        }
        rep[8..HEADER_BYTES].copy_from_slice(&count.to_le_bytes());
        Encoded { rep, per_table }
    }
}

/// The order of `writes` in a batch: those to tables not `in_key_order` as
/// they come, then the others sorted by table and key. Inserting in key
/// order keeps each skip list's search path in cache (the profile names
/// FindSpliceForLevel); a vector memtable sorts once at flush, so only
/// skip-list writes are sorted (out of order, buffer records and cells are
/// most of the writes, and sorting them all, the sort and its memcmp, was
/// up to 15% of the committer). The partition and the sort are stable:
/// writes to one key keep their order.
///
/// The sort compares each write's table and the first eight bytes of its
/// key, held beside its position, and reads the whole keys only when those
/// tie: comparing the keys through the writes, a pointer and a `memcmp`
/// each time, was 38% of the encoder's thread in `scopes_10k`.
pub fn in_batch_order(writes: &[Write], in_key_order: impl Fn(Cf) -> bool) -> Vec<&Write> {
    let mut order: Vec<&Write> = Vec::with_capacity(writes.len());
    let mut keyed: Vec<(u8, u64, u32)> = Vec::new();
    for (i, w) in writes.iter().enumerate() {
        let (t, k) = table_and_key(w);
        if in_key_order(Cf::ALL[t as usize]) {
            keyed.push((t, key_prefix(k), u32::try_from(i).expect("a commit's writes fit a u32")));
        } else {
            order.push(w);
        }
    }
    // (table, prefix, position) with the whole key between the last two:
    // a total order, so the unstable sort keeps writes to one key in order.
    let key = |i: u32| table_and_key(&writes[i as usize]).1;
    keyed.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| key(a.2).cmp(key(b.2))).then(a.2.cmp(&b.2)));
    order.extend(keyed.iter().map(|&(_, _, i)| &writes[i as usize]));
    order
}

/// A key's first eight bytes, zero-padded, big-endian: where two keys'
/// prefixes differ, they order as the keys do (a shorter key padded with
/// zeros never sorts after a longer one it begins).
fn key_prefix(k: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = k.len().min(8);
    b[..n].copy_from_slice(&k[..n]);
    u64::from_be_bytes(b)
}

/// Batches as one, in order: one header, their records after it.
pub fn join(batches: &[&Encoded]) -> Vec<u8> {
    let bytes: usize = batches.iter().map(|b| b.rep.len() - HEADER_BYTES).sum();
    let mut rep = Vec::with_capacity(HEADER_BYTES + bytes);
    rep.extend_from_slice(&[0; HEADER_BYTES]);
    let mut count: u32 = 0;
    for b in batches {
        count += b.records();
        rep.extend_from_slice(&b.rep[HEADER_BYTES..]);
    }
    rep[8..HEADER_BYTES].copy_from_slice(&count.to_le_bytes());
    rep
}

fn table_and_key(w: &Write) -> (u8, &[u8]) {
    match w {
        Write::Put(cf, k, _) | Write::Delete(cf, k) => (*cf as u8, k.as_slice()),
    }
}

fn varint32(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-prefixed slice. Keys and values are bounded far below 4 GiB
/// (`limits`); RocksDB's own encoding has the same prefix.
fn slice(out: &mut Vec<u8>, s: &[u8]) {
    varint32(out, u32::try_from(s.len()).expect("a key or value under 4 GiB"));
    out.extend_from_slice(s);
}

/// Reads a varint32 at the start of `b`: its value and its length.
pub fn read_varint32(b: &[u8]) -> Option<(u32, usize)> {
    let mut v: u32 = 0;
    for (i, byte) in b.iter().take(5).enumerate() {
        v |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoder() -> BatchEncoder {
        BatchEncoder::new(std::array::from_fn(|i| i as u32 + 1), |cf| matches!(cf, Cf::Ops | Cf::Meta))
    }

    #[test]
    fn a_record_is_tag_id_and_length_prefixed_key_and_value() {
        let e = encoder();
        let long = vec![7u8; 300];
        let b = e.encode(&[Write::Put(Cf::Pending, b"k".to_vec(), long.clone()), Write::Delete(Cf::Keys, vec![])]);
        let mut want = vec![0u8; 8];
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&[TAG_PUT, Cf::Pending as u8 + 1, 1, b'k', 0xAC, 0x02]);
        want.extend_from_slice(&long);
        want.extend_from_slice(&[TAG_DELETE, Cf::Keys as u8 + 1, 0]);
        assert_eq!(b.bytes(), want.as_slice());
        assert_eq!(b.records(), 2);
        assert_eq!(b.per_table()[Cf::Pending as usize], 1);
        assert_eq!(b.per_table()[Cf::Keys as usize], 1);
    }

    #[test]
    fn tables_in_key_order_follow_the_others_sorted_and_stable() {
        let e = encoder();
        let put = |cf, k: &[u8], v: &[u8]| Write::Put(cf, k.to_vec(), v.to_vec());
        let writes = [
            put(Cf::Meta, b"b", b"1"),
            put(Cf::Pending, b"z", b""),
            put(Cf::Ops, b"c", b""),
            put(Cf::Meta, b"a", b""),
            put(Cf::Meta, b"b", b"2"),
            Write::Delete(Cf::Pending, b"a".to_vec()),
        ];
        let order = [&writes[1], &writes[5], &writes[2], &writes[3], &writes[0], &writes[4]];
        assert_eq!(e.encode(&writes).bytes(), e.encode_in_order(order.into_iter(), 6).bytes());
    }

    /// Against the plain stable sort by table and whole key, over keys that
    /// share long prefixes, are prefixes of one another, end in zeros, and
    /// repeat (writes to one key keep their order).
    #[test]
    fn the_order_is_the_stable_sort_by_table_and_key() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let in_key_order = |cf| matches!(cf, Cf::Ops | Cf::Meta | Cf::Items);
        for round in 0..200 {
            let writes: Vec<Write> = (0..rng.gen_range(0..300))
                .map(|i: u32| {
                    let cf = [Cf::Ops, Cf::Meta, Cf::Items, Cf::Pending][rng.gen_range(0..4)];
                    let mut k = vec![0xAB; rng.gen_range(0..12)];
                    if let Some(last) = k.last_mut() {
                        *last = [0u8, 1, 0xAB, 0xFF][rng.gen_range(0..4)];
                    }
                    if rng.gen_bool(0.5) {
                        k.extend(std::iter::repeat_n(0u8, rng.gen_range(0..3)));
                    }
                    if rng.gen_bool(0.5) {
                        Write::Put(cf, k, i.to_le_bytes().to_vec())
                    } else {
                        Write::Delete(cf, k)
                    }
                })
                .collect();
            let (mut want, rest): (Vec<&Write>, Vec<&Write>) = writes.iter().partition(|w| in_key_order(Cf::ALL[table_and_key(w).0 as usize]));
            want.sort_by(|a, b| table_and_key(a).cmp(&table_and_key(b)));
            let want: Vec<*const Write> = rest.into_iter().chain(want).map(|w| w as *const Write).collect();
            let got: Vec<*const Write> = in_batch_order(&writes, in_key_order).into_iter().map(|w| w as *const Write).collect();
            assert_eq!(got, want, "round {round}");
        }
    }

    #[test]
    fn joined_batches_are_one_batch_of_their_writes_in_order() {
        let e = encoder();
        let w = |i: u8| Write::Put(Cf::Pending, vec![i], vec![i; i as usize]);
        let (a, b, c) = (e.encode(&[w(1), w(2)]), e.encode(&[]), e.encode(&[w(3)]));
        assert_eq!(join(&[&a, &b, &c]), e.encode(&[w(1), w(2), w(3)]).bytes());
        assert_eq!(join(&[]), e.encode(&[]).bytes());
    }

    #[test]
    fn varints_read_back() {
        for v in [0u32, 1, 127, 128, 300, 16_383, 16_384, u32::MAX] {
            let mut b = Vec::new();
            varint32(&mut b, v);
            assert_eq!(read_varint32(&b), Some((v, b.len())));
        }
        assert_eq!(read_varint32(&[0x80, 0x80]), None);
    }
}
