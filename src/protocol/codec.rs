//! Strict borsh decoding (SPEC §1): no trailing bytes, no unknown variant, only
//! UTF-8 strings, and every length prefix checked against its limit and against
//! the bytes that remain *before* anything is allocated for it, so a hostile
//! 4 GiB prefix costs nothing.

use super::crypto::delta_id_of_body;
use super::types::*;
use crate::limits::{OP_CUT_MAX, OP_PARENTS_MAX, OP_PAYLOAD_BYTES_MAX};

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("input ends early")]
    Truncated,
    #[error("trailing bytes after the value")]
    TrailingBytes,
    #[error("unknown enum variant {0}")]
    BadVariant(u8),
    #[error("string is not UTF-8")]
    BadUtf8,
    #[error("length {0} is past its limit")]
    OverLimit(u32),
    #[error("shape rule broken: {0}")]
    Shape(&'static str),
}

/// A cursor over a byte slice. Every read is bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A `u32` item count, checked against `max` and against the bytes left
    /// (each item takes at least `item_bytes_min`), before any allocation.
    pub fn count(&mut self, max: u32, item_bytes_min: usize) -> Result<usize, DecodeError> {
        let n = self.u32()?;
        if n > max {
            return Err(DecodeError::OverLimit(n));
        }
        if (n as u64) * (item_bytes_min as u64) > self.remaining() as u64 {
            return Err(DecodeError::Truncated);
        }
        Ok(n as usize)
    }

    pub fn bytes(&mut self, max: u32) -> Result<Vec<u8>, DecodeError> {
        let n = self.count(max, 1)?;
        Ok(self.take(n)?.to_vec())
    }

    pub fn string(&mut self, max: u32) -> Result<String, DecodeError> {
        let n = self.count(max, 1)?;
        let raw = self.take(n)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadUtf8)
    }

    pub fn option_tag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadVariant(v)),
        }
    }

    pub fn hashes(&mut self, max: u32) -> Result<Vec<Hash>, DecodeError> {
        let n = self.count(max, 32)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.array()?);
        }
        Ok(out)
    }

    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.remaining() != 0 {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(())
    }
}

/// Lengths inside a payload are bounded by the payload itself (§7).
const IN_PAYLOAD_MAX: u32 = OP_PAYLOAD_BYTES_MAX;

fn strictly_ascending(ids: &[Hash]) -> bool {
    ids.windows(2).all(|w| w[0] < w[1])
}

/// Decodes an `Op` and checks the shape rules of SPEC §3 and the limits of §7.
pub fn read_op(r: &mut Reader<'_>) -> Result<Op, DecodeError> {
    let version = r.u8()?;
    let scope = r.array()?;
    let plane = r.u8()?;
    let author = r.array()?;
    let parents = r.hashes(OP_PARENTS_MAX)?;
    let cut = r.hashes(OP_CUT_MAX)?;
    let hlc = r.u64()?;
    let key_id = r.array()?;
    let nonce = r.array()?;
    let payload = r.bytes(OP_PAYLOAD_BYTES_MAX)?;
    let signature = r.array()?;
    let op = Op { version, scope, plane, author, parents, cut, hlc, key_id, nonce, payload, signature };
    check_shape(&op)?;
    Ok(op)
}

/// SPEC §3 shape rules.
pub fn check_shape(op: &Op) -> Result<(), DecodeError> {
    use DecodeError::Shape;
    if op.version != 1 {
        return Err(Shape("version must be 1"));
    }
    if op.plane > PLANE_DATA {
        return Err(Shape("plane must be 0 or 1"));
    }
    if !strictly_ascending(&op.parents) {
        return Err(Shape("parents not strictly ascending"));
    }
    if !strictly_ascending(&op.cut) {
        return Err(Shape("cut not strictly ascending"));
    }
    match op.kind() {
        OpKind::Genesis => {
            if op.plane != PLANE_GOVERNANCE {
                return Err(Shape("genesis must be on the governance plane"));
            }
            if !op.parents.is_empty() || !op.cut.is_empty() {
                return Err(Shape("genesis has no parents and no cut"));
            }
            if op.key_id != ZERO || op.nonce != [0u8; 12] {
                return Err(Shape("genesis key_id and nonce are zero"));
            }
        }
        OpKind::Governance => {
            if op.parents.is_empty() {
                return Err(Shape("governance op needs 1..=32 parents"));
            }
            if !op.cut.is_empty() {
                return Err(Shape("governance op has an empty cut"));
            }
            if op.key_id == ZERO {
                return Err(Shape("governance key_id is not ZERO"));
            }
        }
        OpKind::Data => {
            if op.cut.is_empty() {
                return Err(Shape("data op needs 1..=32 cut entries"));
            }
            if op.key_id == ZERO {
                return Err(Shape("data key_id is not ZERO"));
            }
        }
    }
    Ok(())
}

pub fn decode_op(bytes: &[u8]) -> Result<Op, DecodeError> {
    let mut r = Reader::new(bytes);
    let op = read_op(&mut r)?;
    r.finish()?;
    Ok(op)
}

pub fn read_key_delivery(r: &mut Reader<'_>) -> Result<KeyDelivery, DecodeError> {
    Ok(KeyDelivery {
        scope: r.array()?,
        key_id: r.array()?,
        recipient: r.array()?,
        ephemeral: r.array()?,
        // Bounded only by the frame (§7 names no limit for it).
        sealed: r.bytes(u32::MAX)?,
    })
}

/// Decodes a wire `Message` of variant 0 or 1 (SPEC §10). Anything else,
/// the reserved 255 included, is malformed here; the node's own variants
/// (2..=254) are recognised by the transport before this is called.
pub fn decode_message(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader::new(bytes);
    let msg = match r.u8()? {
        MESSAGE_OP => Message::Op(read_op(&mut r)?),
        MESSAGE_KEY => Message::Key(read_key_delivery(&mut r)?),
        v => return Err(DecodeError::BadVariant(v)),
    };
    r.finish()?;
    Ok(msg)
}

fn read_role(r: &mut Reader<'_>) -> Result<Role, DecodeError> {
    match r.u8()? {
        0 => Ok(Role::Reader),
        1 => Ok(Role::Writer),
        2 => Ok(Role::Admin),
        v => Err(DecodeError::BadVariant(v)),
    }
}

fn read_gov_action(r: &mut Reader<'_>) -> Result<GovAction, DecodeError> {
    Ok(match r.u8()? {
        0 => GovAction::Genesis { name: r.string(IN_PAYLOAD_MAX)?, first_key_id: r.array()? },
        1 => GovAction::AddMember { member: r.array()?, role: read_role(r)?, kem: r.array()? },
        2 => GovAction::RemoveMember { member: r.array()? },
        3 => GovAction::SetRole { member: r.array()?, role: read_role(r)? },
        4 => GovAction::RotateKey { key_id: r.array()? },
        v => return Err(DecodeError::BadVariant(v)),
    })
}

/// Decodes a `GovPayload` (borsh only; the rules of §4 are the engine's: `genesis_payload_ok`, `governance_payload_ok`).
pub fn decode_gov_payload(bytes: &[u8]) -> Result<GovPayload, DecodeError> {
    let mut r = Reader::new(bytes);
    // The smallest action (RemoveMember / RotateKey) is 33 bytes.
    let n = r.count(IN_PAYLOAD_MAX, 33)?;
    let mut actions = Vec::with_capacity(n);
    for _ in 0..n {
        actions.push(read_gov_action(&mut r)?);
    }
    r.finish()?;
    Ok(GovPayload { actions })
}

fn read_action(r: &mut Reader<'_>) -> Result<Action, DecodeError> {
    Ok(match r.u8()? {
        0 => Action::Put {
            entity: r.string(IN_PAYLOAD_MAX)?,
            key: r.bytes(IN_PAYLOAD_MAX)?,
            value: r.bytes(IN_PAYLOAD_MAX)?,
        },
        1 => Action::Delete { entity: r.string(IN_PAYLOAD_MAX)?, key: r.bytes(IN_PAYLOAD_MAX)? },
        2 => Action::Add {
            entity: r.string(IN_PAYLOAD_MAX)?,
            key: r.bytes(IN_PAYLOAD_MAX)?,
            amount: r.i64()?,
        },
        v => return Err(DecodeError::BadVariant(v)),
    })
}

pub fn decode_data_payload(bytes: &[u8]) -> Result<DataPayload, DecodeError> {
    let mut r = Reader::new(bytes);
    let root_hash = r.array()?;
    // The smallest action (Delete with empty strings) is 9 bytes.
    let n = r.count(IN_PAYLOAD_MAX, 9)?;
    let mut actions = Vec::with_capacity(n);
    for _ in 0..n {
        actions.push(read_action(&mut r)?);
    }
    let n = r.count(IN_PAYLOAD_MAX, 8)?;
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(Event { kind: r.string(IN_PAYLOAD_MAX)?, data: r.bytes(IN_PAYLOAD_MAX)? });
    }
    r.finish()?;
    Ok(DataPayload { root_hash, actions, events })
}

pub fn decode_cell(bytes: &[u8]) -> Result<Cell, DecodeError> {
    let mut r = Reader::new(bytes);
    let lww = if r.option_tag()? {
        let hlc = r.u64()?;
        let author = r.array()?;
        let index = r.u32()?;
        let value = if r.option_tag()? { Some(r.bytes(u32::MAX)?) } else { None };
        Some(Lww { hlc, author, index, value })
    } else {
        None
    };
    let counter = r.i64()?;
    r.finish()?;
    Ok(Cell { lww, counter })
}

/// The `body` of an op: its encoding less the trailing 64-byte signature.
pub fn op_body(encoded_op: &[u8]) -> &[u8] {
    assert!(encoded_op.len() >= 64, "an encoded op ends with its signature");
    &encoded_op[..encoded_op.len() - 64]
}

/// Decodes a frame's content; for an op, also returns its encoding and id.
pub enum Decoded {
    Op { id: Hash, op: Op, bytes: Vec<u8> },
    Key(KeyDelivery),
}

/// Decode step of SPEC §6 step 1 (before the signature check).
pub fn decode_frame(frame: &[u8]) -> Result<Decoded, DecodeError> {
    match decode_message(frame)? {
        Message::Op(op) => {
            let bytes = frame[1..].to_vec();
            let id = delta_id_of_body(op_body(&bytes));
            Ok(Decoded::Op { id, op, bytes })
        }
        Message::Key(kd) => Ok(Decoded::Key(kd)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_length_prefix_is_rejected_before_allocation() {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(Reader::new(&bytes[1..]).bytes(u32::MAX), Err(DecodeError::Truncated)));
        assert!(matches!(Reader::new(&bytes[1..]).hashes(32), Err(DecodeError::OverLimit(_))));
        assert!(decode_gov_payload(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_data_payload(&[0u8; 32].iter().chain(&[0xff; 4]).copied().collect::<Vec<_>>()).is_err());
    }

    #[test]
    fn cell_round_trip() {
        let c = Cell { lww: Some(Lww { hlc: 7, author: [3; 32], index: 2, value: Some(b"x".to_vec()) }), counter: -5 };
        assert_eq!(decode_cell(&encode(&c)).unwrap(), c);
        let c = Cell { lww: Some(Lww { hlc: 7, author: [3; 32], index: 2, value: None }), counter: 0 };
        assert_eq!(decode_cell(&encode(&c)).unwrap(), c);
        assert_eq!(decode_cell(&encode(&Cell::default())).unwrap(), Cell::default());
    }
}
