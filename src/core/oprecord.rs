//! An applied data op's record in the ops table (`Cf::Ops`), kept smaller
//! than it was signed: its parents, applied ops themselves and so in the
//! same table, by the first [`PARENT_REF_BYTES`] bytes of their ids. A
//! parent id is 32 random bytes that LZ4 cannot shorten, and the ops of a
//! wide scope name two or three each (`docs/ARCHITECTURE.md`, "Storage").
//!
//! The record is the op's encoding with a tag in front and each parent cut
//! to its reference: `COMPACT_TAG ‖ op[..70] ‖ (parent[..16])* ‖ op[70 + 32n..]`
//! (`op[66..70]` is the parents' count, SPEC §3). Any other record is the
//! op as signed, whose first byte is its version (1): every governance op,
//! a data op without parents, and an op buffered on a missing dependency
//! (its parents may never arrive), whose encoding is written once when it
//! is buffered and stays as it is once applied.
//!
//! Reading an op back ([`expand`]) looks each reference up in the table,
//! and the op is taken only if its id, recomputed from the bytes so made,
//! is the key it is stored under: a reference that matches more than one
//! id (two ids sharing their first 16 bytes, a 2^64 search) is tried each
//! way, a bounded number of ways. Applied ops are never deleted, so a
//! reference always finds its parent.

use crate::protocol::codec::{decode_op, op_body, DecodeError};
use crate::protocol::crypto::delta_id_of_body;
use crate::protocol::{Hash, Op, PLANE_DATA};

/// The first byte of a compact record (an op as signed starts with 1).
pub const COMPACT_TAG: u8 = 0x81;
/// The bytes of a parent's id kept in a compact record.
pub const PARENT_REF_BYTES: usize = 16;
/// Where an encoded op's parents' count starts: after version (1), scope
/// (32), plane (1) and author (32).
const PARENTS_AT: usize = 66;
/// The ways of reading ambiguous references tried before giving up.
const WAYS_MAX: usize = 64;

/// The compact record of an applied op, or `None` when it is stored as
/// signed (a governance op, a data op without parents, or one whose
/// parents' references would not be distinct).
pub fn compact(op: &Op, bytes: &[u8]) -> Option<Vec<u8>> {
    let n = op.parents.len();
    if op.plane != PLANE_DATA || n == 0 {
        return None;
    }
    if op.parents.windows(2).any(|w| w[0][..PARENT_REF_BYTES] == w[1][..PARENT_REF_BYTES]) {
        return None;
    }
    let at = PARENTS_AT + 4;
    debug_assert_eq!(bytes[PARENTS_AT..at], (n as u32).to_le_bytes());
    let mut out = Vec::with_capacity(bytes.len() + 1 - n * (32 - PARENT_REF_BYTES));
    out.push(COMPACT_TAG);
    out.extend_from_slice(&bytes[..at]);
    for p in &op.parents {
        out.extend_from_slice(&p[..PARENT_REF_BYTES]);
    }
    out.extend_from_slice(&bytes[at + 32 * n..]);
    Some(out)
}

/// Whether a record of the ops table is compact (else it is the op as
/// signed).
pub fn is_compact(record: &[u8]) -> bool {
    record.first() == Some(&COMPACT_TAG)
}

/// A compact record's parts: the encoding up to the parents, the
/// references, and the encoding after the parents.
fn parts(record: &[u8]) -> Result<(&[u8], &[u8], &[u8]), RecordError> {
    let body = &record[1..];
    let at = PARENTS_AT + 4;
    let n = body.get(PARENTS_AT..at).ok_or(RecordError::Malformed)?;
    let n = u32::from_le_bytes(n.try_into().expect("four bytes")) as usize;
    let end = n.checked_mul(PARENT_REF_BYTES).and_then(|r| r.checked_add(at)).ok_or(RecordError::Malformed)?;
    if n == 0 || body.len() < end + 64 {
        return Err(RecordError::Malformed);
    }
    Ok((&body[..at], &body[at..end], &body[end..]))
}

/// The op of a record, for what needs its scope, plane, author, hlc, cut
/// or payload: a compact record's parents are left out (`parents` empty);
/// [`expand`] gives them.
pub fn decode_without_parents(record: &[u8]) -> Result<Op, DecodeError> {
    if !is_compact(record) {
        return decode_op(record);
    }
    let Ok((head, _, tail)) = parts(record) else { return Err(DecodeError::Truncated) };
    let mut bytes = Vec::with_capacity(head.len() + tail.len());
    bytes.extend_from_slice(&head[..PARENTS_AT]);
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(tail);
    decode_op(&bytes)
}

/// A compact record's parent references, in the order of the parents
/// (ascending).
pub fn references(record: &[u8]) -> Result<Vec<[u8; PARENT_REF_BYTES]>, RecordError> {
    let (_, refs, _) = parts(record)?;
    Ok(refs.chunks_exact(PARENT_REF_BYTES).map(|r| r.try_into().expect("a whole reference")).collect())
}

/// Why a record could not be read back as its op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("a compact op record is cut short")]
    Malformed,
    #[error("no op in the table for the parent reference {0}")]
    NoParent(String),
    #[error("the parent references resolve to no op with the record's id ({0} ways tried)")]
    NoMatch(usize),
    #[error("the parent references are ambiguous past {WAYS_MAX} ways")]
    Ambiguous,
    #[error("{0}")]
    Lookup(String),
}

/// The op stored under `id` as it was signed, from its `record` (one
/// stored as signed is that): `lookup(reference)` answers the ids in the
/// table that start with it, and is called only for a compact record.
pub fn expand(id: &Hash, record: Vec<u8>, mut lookup: impl FnMut(&[u8]) -> Result<Vec<Hash>, String>) -> Result<Vec<u8>, RecordError> {
    if !is_compact(&record) {
        return Ok(record);
    }
    let (head, refs, tail) = parts(&record)?;
    let mut candidates: Vec<Vec<Hash>> = Vec::with_capacity(refs.len() / PARENT_REF_BYTES);
    let mut ways = 1usize;
    for r in refs.chunks_exact(PARENT_REF_BYTES) {
        let mut found = lookup(r).map_err(RecordError::Lookup)?;
        found.retain(|h| h.starts_with(r));
        if found.is_empty() {
            return Err(RecordError::NoParent(hex::encode(r)));
        }
        ways = ways.saturating_mul(found.len());
        candidates.push(found);
    }
    if ways > WAYS_MAX {
        return Err(RecordError::Ambiguous);
    }
    let mut bytes = Vec::with_capacity(head.len() + 32 * candidates.len() + tail.len());
    let mut pick = vec![0usize; candidates.len()];
    for _ in 0..ways {
        bytes.clear();
        bytes.extend_from_slice(head);
        for (c, &i) in candidates.iter().zip(&pick) {
            bytes.extend_from_slice(&c[i]);
        }
        bytes.extend_from_slice(tail);
        if delta_id_of_body(op_body(&bytes)) == *id {
            return Ok(bytes);
        }
        // The next way: the picks as a mixed-radix counter.
        for (p, c) in pick.iter_mut().zip(&candidates) {
            *p += 1;
            if *p < c.len() {
                break;
            }
            *p = 0;
        }
    }
    Err(RecordError::NoMatch(ways))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::crypto::encode_op;

    fn data_op(parents: Vec<Hash>) -> (Op, Vec<u8>, Hash) {
        let mut op = Op {
            version: 1,
            scope: [3; 32],
            plane: PLANE_DATA,
            author: [4; 32],
            parents,
            cut: vec![[5; 32]],
            hlc: 77,
            key_id: [6; 32],
            nonce: [7; 12],
            payload: vec![8; 40],
            signature: [9; 64],
        };
        op.parents.sort();
        let (bytes, id) = encode_op(&op);
        (op, bytes, id)
    }

    #[test]
    fn a_compact_record_reads_back_as_the_op_it_was_signed() {
        let parents: Vec<Hash> = (1..=3u8).map(|i| [i; 32]).collect();
        let (op, bytes, id) = data_op(parents.clone());
        let rec = compact(&op, &bytes).expect("a data op with parents");
        assert_eq!(rec.len(), bytes.len() + 1 - 3 * 16);
        assert!(is_compact(&rec));
        assert_eq!(references(&rec).unwrap(), vec![[1u8; 16], [2; 16], [3; 16]]);
        let table = parents.clone();
        let got = expand(&id, rec.clone(), |r| Ok(table.iter().filter(|h| h.starts_with(r)).copied().collect())).unwrap();
        assert_eq!(got, bytes);
        let mut without = op.clone();
        without.parents.clear();
        assert_eq!(decode_without_parents(&rec).unwrap(), without);
        assert_eq!(decode_without_parents(&bytes).unwrap(), op, "a record as signed decodes whole");
    }

    #[test]
    fn references_shared_by_two_ids_are_resolved_by_the_id() {
        let mut twin = [2u8; 32];
        twin[31] = 9;
        let (op, bytes, id) = data_op(vec![[1; 32], [2; 32]]);
        let rec = compact(&op, &bytes).unwrap();
        let table = [[1u8; 32], twin, [2; 32]];
        let got = expand(&id, rec.clone(), |r| Ok(table.iter().filter(|h| h.starts_with(r)).copied().collect())).unwrap();
        assert_eq!(got, bytes);
        // A parent missing from the table, or only a look-alike of it.
        let missing = expand(&id, rec.clone(), |r| Ok([[1u8; 32]].iter().filter(|h| h.starts_with(r)).copied().collect()));
        assert!(matches!(missing, Err(RecordError::NoParent(_))));
        let wrong = expand(&id, rec.clone(), |r| Ok([[1u8; 32], twin].iter().filter(|h| h.starts_with(r)).copied().collect()));
        assert_eq!(wrong, Err(RecordError::NoMatch(1)));
        // Lookups answering ids that do not start with the reference.
        let stray = expand(&id, rec.clone(), |_| Ok(vec![[0xee; 32]]));
        assert!(matches!(stray, Err(RecordError::NoParent(_))));
    }

    #[test]
    fn only_data_ops_with_parents_are_made_compact() {
        let (op, bytes, _) = data_op(Vec::new());
        assert_eq!(compact(&op, &bytes), None, "no parents");
        let (mut gov, _, _) = data_op(vec![[1; 32]]);
        gov.plane = 0;
        gov.cut.clear();
        let (gov_bytes, _) = encode_op(&gov);
        assert_eq!(compact(&gov, &gov_bytes), None, "a governance op");
        let mut near = [1u8; 32];
        near[20] = 2;
        let (op, bytes, _) = data_op(vec![[1; 32], near]);
        assert_eq!(compact(&op, &bytes), None, "two parents sharing their references");
    }

    #[test]
    fn a_cut_record_is_malformed_not_a_panic() {
        let (op, bytes, id) = data_op(vec![[1; 32]]);
        let rec = compact(&op, &bytes).unwrap();
        for len in [1, 40, 71, 90] {
            assert_eq!(expand(&id, rec[..len].to_vec(), |_| Ok(vec![[1; 32]])), Err(RecordError::Malformed));
            assert!(decode_without_parents(&rec[..len]).is_err());
        }
        // Long enough to be read: the bytes made do not hash to the id.
        let len = rec.len() - 70;
        assert_eq!(expand(&id, rec[..len].to_vec(), |_| Ok(vec![[1; 32]])), Err(RecordError::NoMatch(1)));
        assert!(decode_without_parents(&rec[..len]).is_err());
    }
}
