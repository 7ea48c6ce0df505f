//! `dagfold export`: one scope's applied ops, in an order that applies in
//! one pass, and the key deliveries this node made for that scope, as the
//! frames `dagfold import` reads (`u32` LE length, then `borsh(Message)`).
//!
//! Offline, like `inspect`: it opens the store, which RocksDB's lock refuses
//! while a node runs on it. The ops table has no index by scope, so the
//! export reads all of it once, keeping only each op's id, dependencies and
//! `hlc` in memory; the op bytes are read again as they are written out.
//! An op stored by reference to its parents (`core::oprecord`) has them
//! resolved among the scope's ops, and its id checked as it is written.
//!
//! The order: every op after its dependencies (its parents, and for a data
//! op its cut), ready ops by (`hlc`, id). The genesis comes first (every
//! other op of the scope depends on it), then the deliveries: a key is
//! self-certifying (SPEC §9), so a delivery ahead of the op that makes its
//! key current blocks nothing, and the keys then wait for no op.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::cli::{open, OpenError};
use crate::core::{oprecord, Cf, ColdOps, Config, OpState, META_DELIVERY_PREFIX};
use crate::protocol::{Hash, OpKind, MESSAGE_KEY, MESSAGE_OP};
use crate::store::StoreError;

/// Delivery records read from `Cf::Meta` per store read.
const DELIVERY_SCAN_PAGE: usize = 1024;

/// Why `dagfold export` wrote nothing, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("--scope takes 64 hex characters, got {0:?}")]
    Scope(String),
    #[error("no scope {0} with an applied genesis in this data directory")]
    NoScope(String),
    #[error("reading the store: {0}")]
    Store(#[from] StoreError),
    /// The store holds what cannot be: an applied op that does not decode,
    /// or one whose dependency is not an applied op of the scope.
    #[error("the store is inconsistent: {0}")]
    Inconsistent(String),
    #[error("cannot write {}: {source}", out.display())]
    Write { out: PathBuf, source: std::io::Error },
}

/// What must come before one op in an export.
#[derive(Clone, Debug)]
pub struct OpDeps {
    pub id: Hash,
    /// Its parents, and for a data op its cut.
    pub deps: Vec<Hash>,
    pub hlc: u64,
}

/// The positions of `ops` in an order that applies in one pass: each op
/// after every one of its dependencies, ready ops by (`hlc`, id). A
/// dependency outside `ops` is an error (it names the op and the id).
pub fn apply_order(ops: &[OpDeps]) -> Result<Vec<usize>, String> {
    let index: HashMap<Hash, usize> = ops.iter().enumerate().map(|(i, o)| (o.id, i)).collect();
    let mut waiting_on = vec![0u32; ops.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    for (i, op) in ops.iter().enumerate() {
        for dep in &op.deps {
            let Some(&d) = index.get(dep) else {
                return Err(format!("op {} depends on {}, which is not an applied op of the scope", hex::encode(op.id), hex::encode(dep)));
            };
            waiting_on[i] += 1;
            dependents[d].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<(u64, Hash, usize)>> =
        (0..ops.len()).filter(|&i| waiting_on[i] == 0).map(|i| Reverse((ops[i].hlc, ops[i].id, i))).collect();
    let mut order = Vec::with_capacity(ops.len());
    while let Some(Reverse((_, _, i))) = ready.pop() {
        order.push(i);
        for &j in &dependents[i] {
            waiting_on[j] -= 1;
            if waiting_on[j] == 0 {
                ready.push(Reverse((ops[j].hlc, ops[j].id, j)));
            }
        }
    }
    // Ids are hashes of the ops' contents, which name their dependencies:
    // a cycle would need a hash collision.
    if order.len() != ops.len() {
        return Err(format!("{} ops wait on each other", ops.len() - order.len()));
    }
    Ok(order)
}

/// `dagfold export`: writes the frames to `out` (a file, made owner-only)
/// or to standard output, and answers a JSON summary.
pub fn export(data_dir: &Path, scope_hex: &str, out: Option<&Path>, cfg: Config) -> Result<serde_json::Value, ExportError> {
    let scope = crate::protocol::parse_hash_hex(scope_hex).ok_or_else(|| ExportError::Scope(scope_hex.to_owned()))?;
    let mut node = open(data_dir, cfg)?;
    let status = node.engine.status(&scope).ok_or_else(|| ExportError::NoScope(scope_hex.to_owned()))?;
    let reader = node.store.reader();

    let mut ops = Vec::new();
    // A compact record (`core::oprecord`) names its parents by the first
    // bytes of their ids: resolved below among the scope's ops, which the
    // scan gives in id order, without a read of the store.
    let mut refs: Vec<(usize, Vec<[u8; oprecord::PARENT_REF_BYTES]>)> = Vec::new();
    let mut bad: Option<String> = None;
    let read = ColdOps::scan(&reader, &mut |id, bytes| {
        if bad.is_some() {
            return;
        }
        let op = match oprecord::decode_without_parents(bytes) {
            Ok(op) => op,
            Err(e) => {
                bad = Some(format!("op {} does not decode: {e:?}", hex::encode(id)));
                return;
            }
        };
        let in_scope = if op.kind() == OpKind::Genesis { *id == scope } else { op.scope == scope };
        if !in_scope || node.engine.op_state(id) != OpState::Applied {
            return;
        }
        if oprecord::is_compact(bytes) {
            match oprecord::references(bytes) {
                Ok(r) => refs.push((ops.len(), r)),
                Err(e) => {
                    bad = Some(format!("op {}: {e}", hex::encode(id)));
                    return;
                }
            }
        }
        let is_data = op.kind() == OpKind::Data;
        let mut deps = op.parents;
        if is_data {
            deps.extend_from_slice(&op.cut);
        }
        ops.push(OpDeps { id: *id, deps, hlc: op.hlc });
    });
    read.map_err(|e| ExportError::Store(e.into()))?;
    if let Some(why) = bad {
        return Err(ExportError::Inconsistent(why));
    }
    // An op whose state could not be read is not left out silently.
    if let Some(e) = node.engine.cold_failed() {
        return Err(ExportError::Store(e.clone().into()));
    }
    if ops.len() as u64 != status.applied {
        return Err(ExportError::Inconsistent(format!("{} applied ops stored for the scope, its status counts {}", ops.len(), status.applied)));
    }
    debug_assert!(ops.windows(2).all(|w| w[0].id < w[1].id), "the scan is in id order");
    let in_scope = |r: &[u8]| -> Vec<Hash> {
        let from = ops.partition_point(|o| o.id[..r.len()] < *r);
        ops[from..].iter().take_while(|o| o.id.starts_with(r)).map(|o| o.id).collect()
    };
    let mut parents: Vec<(usize, Vec<Hash>)> = Vec::with_capacity(refs.len());
    for (i, rs) in &refs {
        let mut ps = Vec::with_capacity(rs.len());
        for r in rs {
            match in_scope(r).as_slice() {
                [p] => ps.push(*p),
                // No applied op of the scope, or two: read back whole (the
                // store's lookup, the id checked), which says which.
                _ => {
                    let id = ops[*i].id;
                    let bytes = reader.op(&id)?.ok_or_else(|| ExportError::Inconsistent(format!("op {} left the ops table", hex::encode(id))))?;
                    let op = crate::protocol::codec::decode_op(&bytes).map_err(|e| ExportError::Inconsistent(format!("op {}: {e:?}", hex::encode(id))))?;
                    ps = op.parents;
                    break;
                }
            }
        }
        parents.push((*i, ps));
    }
    drop(refs);
    for (i, ps) in parents {
        ops[i].deps.splice(0..0, ps);
    }
    let order = apply_order(&ops).map_err(ExportError::Inconsistent)?;
    let deliveries = deliveries_of(&reader, &scope)?;

    let target = out.map_or_else(|| PathBuf::from("<standard output>"), Path::to_path_buf);
    let write_error = |source| ExportError::Write { out: target.clone(), source };
    let sink: Box<dyn std::io::Write> = match out {
        Some(path) => Box::new(create_private(path).map_err(write_error)?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut sink = std::io::BufWriter::with_capacity(1 << 20, sink);
    for &i in &order {
        let id = &ops[i].id;
        let record = reader
            .get(Cf::Ops, id)?
            .ok_or_else(|| ExportError::Inconsistent(format!("op {} left the ops table during the export", hex::encode(id))))?;
        // Its parents are among its dependencies (found above): the op as
        // signed, its id checked.
        let deps = &ops[i].deps;
        let bytes = oprecord::expand(id, record, |r| Ok(deps.iter().filter(|d| d.starts_with(r)).copied().collect()))
            .map_err(|why| StoreError::OpRecord { id: hex::encode(id), why })?;
        write_frame(&mut sink, MESSAGE_OP, &bytes).map_err(write_error)?;
        if *id == scope {
            for kd in &deliveries {
                write_frame(&mut sink, MESSAGE_KEY, kd).map_err(write_error)?;
            }
        }
    }
    sink.flush().map_err(write_error)?;
    Ok(json!({
        "scope": hex::encode(scope),
        "ops": ops.len(),
        "deliveries": deliveries.len(),
        "out": target.display().to_string(),
    }))
}

/// The deliveries this node made for `scope` (`Cf::Meta`, `delivery/` ‖
/// recipient ‖ scope ‖ key_id → borsh(KeyDelivery)), each as stored.
fn deliveries_of(reader: &crate::store::rocks::StoreReader, scope: &Hash) -> Result<Vec<Vec<u8>>, ExportError> {
    // Keys without the prefix: recipient ‖ scope ‖ key_id.
    let mut found = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = reader.records_after(Cf::Meta, META_DELIVERY_PREFIX, after.as_deref(), DELIVERY_SCAN_PAGE)?;
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        found.extend(page.into_iter().filter(|(k, _)| k.get(32..64) == Some(&scope[..])).map(|(_, v)| v));
    }
    Ok(found)
}

fn write_frame(sink: &mut impl std::io::Write, tag: u8, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len() + 1).expect("a stored op or delivery is far below 4 GiB");
    sink.write_all(&len.to_le_bytes())?;
    sink.write_all(&[tag])?;
    sink.write_all(body)
}

/// Creates (or truncates) `path`, readable by its owner only: an export
/// holds a scope's whole history (sealed, but its shape shows).
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(n: u8, deps: &[u8], hlc: u64) -> OpDeps {
        OpDeps { id: [n; 32], deps: deps.iter().map(|d| [*d; 32]).collect(), hlc }
    }

    fn ids(ops: &[OpDeps]) -> Vec<u8> {
        apply_order(ops).unwrap().into_iter().map(|i| ops[i].id[0]).collect()
    }

    #[test]
    fn every_op_comes_after_its_dependencies_whatever_their_clocks() {
        // 1 genesis; 2, 3 governance; 4, 5 data cut on 3; 6 a data op whose
        // hlc is below its parent's (a dependency wins over the clock).
        let ops = [op(6, &[5, 3], 1), op(5, &[4, 3], 9), op(4, &[3], 8), op(3, &[2], 3), op(2, &[1], 2), op(1, &[], 7)];
        assert_eq!(ids(&ops), vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn ready_ops_go_by_clock_then_id() {
        let ops = [op(1, &[], 0), op(4, &[1], 5), op(3, &[1], 5), op(2, &[1], 6)];
        assert_eq!(ids(&ops), vec![1, 3, 4, 2]);
    }

    #[test]
    fn a_dependency_outside_the_set_is_named() {
        let err = apply_order(&[op(1, &[], 0), op(2, &[9], 1)]).unwrap_err();
        assert!(err.contains(&hex::encode([9u8; 32])), "{err}");
    }
}
