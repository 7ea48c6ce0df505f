//! The store's format version (`store::FORMAT_VERSION`): a store of
//! version 1 kept in the repo (`tests/fixtures/store-v1`) that every later
//! binary must open, newer and unknown formats refused with a message, and
//! a damaged store stopping the open with what to do, never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::node::{free_port, loopback};
use dagfold::core::{Cf, Config, Write, META_FORMAT};
use dagfold::durable::InlineDriver;
use dagfold::store::rocks::RocksStore;
use dagfold::store::{Store, StoreError, FORMAT_VERSION};
use dagfold::workload::{generate, WorkloadConfig};

/// The store made by the release of format `version`, kept in the repo.
fn fixture_dir(version: u32) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(format!("store-v{version}"))
}

/// What the fixture holds, written beside it by its generator.
fn fixture_expected(version: u32) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(format!("store-v{version}.json"))
}

/// A copy of a store directory in a fresh private directory (opening
/// writes to a store, and the store must be private).
fn copy_store(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// The statuses and events of every scope, and the records per table.
fn content(node: &mut InlineDriver<RocksStore>) -> serde_json::Value {
    let reader = node.store.reader();
    let scopes: Vec<serde_json::Value> = node
        .engine
        .scope_ids()
        .iter()
        .filter_map(|id| {
            let status = node.engine.status(id)?.to_json();
            let events = reader.events(id, 1, u64::MAX, 100_000).unwrap();
            let first_event_op = events.first().map(|(_, v)| hex::encode(&v[..32]));
            Some(serde_json::json!({ "status": status, "events": events.len(), "first_event_op": first_event_op }))
        })
        .collect();
    let mut records = serde_json::Map::new();
    for cf in Cf::ALL {
        let mut n = 0u64;
        dagfold::core::TableScan::scan(&node.store, cf, &mut |_, _| n += 1).expect("the table reads back");
        records.insert(cf.name().into(), n.into());
    }
    serde_json::json!({
        "format": FORMAT_VERSION,
        "public_key": hex::encode(node.engine.identity().public_key),
        "scopes": scopes,
        "records": records,
    })
}

/// The store of `tests/fixtures/store-v1`, made by this generator on
/// 2026-12-04 (format version 1), and `store-v2`, made on 2026-12-05
/// (version 2: applied data ops stored by reference to their parents),
/// each committed and never made again, since later releases must open
/// the store that release made:
/// `cargo test --release --test store_format -- --ignored make_store_v2_fixture`
/// writes the current version's (and its `.json`, what it holds) where
/// neither exists. One scope with a key rotation, a writer removed
/// (remembered drops), three ops held back (pending records) and events;
/// flushed, so the tables are in table files, and RocksDB's info logs left
/// out.
fn make_fixture(version: u32) {
    assert_eq!(version, FORMAT_VERSION, "only the current version's fixture can be made");
    let dir = fixture_dir(version);
    assert!(!dir.exists(), "the fixture exists: it is never made again");
    let id = dagfold::core::Identity::from_secrets([21; 32], [22; 32]);
    let cfg = WorkloadConfig { seed: 77, data_ops: 40, writers: 3, rotate_at: Some(15), remove_writer_at: Some(30), ..Default::default() };
    let w = generate(&cfg, id.public_key, id.kem_public);
    let data: Vec<usize> = (0..w.messages.len()).filter(|i| w.messages[*i].is_data).collect();
    let held_back = &data[34..37];
    let frames: Vec<Vec<u8>> =
        w.messages.iter().enumerate().filter(|(i, _)| !held_back.contains(i)).map(|(_, m)| m.frame.clone()).collect();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut store = RocksStore::open(&dir).unwrap();
    store.write(&[Write::Put(Cf::Meta, dagfold::core::META_IDENTITY.to_vec(), id.encode())], true).unwrap();
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    for chunk in frames.chunks(8) {
        node.handle_frames(chunk, 0).unwrap();
    }
    let expected = content(&mut node);
    assert!(expected["scopes"][0]["status"]["pending"].as_u64().unwrap() > 0, "{expected}");
    node.store.flush().unwrap();
    drop(node);
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("LOG") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    std::fs::write(fixture_expected(version), format!("{expected:#}\n")).unwrap();
}

#[test]
#[ignore]
fn make_store_v2_fixture() {
    make_fixture(2);
}

/// The store made by the release of format `version` opens with this
/// binary, holding what it held: statuses (roots, heads, counts), events,
/// the cell index, the identity and its format version; every op in its
/// ops table reads back as signed. Answers how many of those were stored
/// by reference to their parents.
fn fixture_opens_with_its_content(version: u32) -> usize {
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture_expected(version)).unwrap()).unwrap();
    let dir = copy_store(&fixture_dir(version));
    let store = RocksStore::open(dir.path()).unwrap();
    assert_eq!(
        store.get(Cf::Meta, META_FORMAT).unwrap(),
        Some(FORMAT_VERSION.to_le_bytes().to_vec()),
        "the fixture of version {version}, given this binary's version at its open"
    );
    let mut compact = 0;
    let mut ids = Vec::new();
    dagfold::core::TableScan::scan(&store, Cf::Ops, &mut |k, v| {
        compact += usize::from(dagfold::core::oprecord::is_compact(v));
        ids.push(<[u8; 32]>::try_from(k).unwrap());
    })
    .unwrap();
    for id in &ids {
        let op = store.op(id).unwrap().expect("an op of the table");
        assert_eq!(dagfold::protocol::crypto::encode_op(&dagfold::protocol::codec::decode_op(&op).unwrap()).1, *id, "read back as signed");
    }
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    let mut got = content(&mut node);
    // The version this binary would write; the store keeps its own.
    got["format"] = expected["format"].clone();
    assert_eq!(got, expected);
    // And it goes on: the held-back ops are not there, the rest is.
    let status = &got["scopes"][0]["status"];
    assert!(status["pending"].as_u64().unwrap() > 0 && status["applied"].as_u64().unwrap() > 0, "{status}");
    // The command line reads it too.
    drop(node);
    let out = Command::new(env!("CARGO_BIN_EXE_dagfold")).args(["inspect", "--data-dir", dir.path().to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected[0], expected["scopes"][0]["status"]);
    compact
}

#[test]
fn the_store_of_format_1_opens_with_its_content() {
    assert_eq!(fixture_opens_with_its_content(1), 0, "version 1 stores every op as signed");
}

#[test]
fn the_store_of_format_2_opens_with_its_content() {
    assert!(fixture_opens_with_its_content(2) > 0, "version 2 stores applied data ops by reference");
}

/// A store written before versions (no format record) holds the layout of
/// version 1: it opens and is given the record of this binary's version,
/// whose records it may hold from then on.
#[test]
fn a_store_without_a_version_is_version_1_and_gets_this_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    assert_eq!(store.get(Cf::Meta, META_FORMAT).unwrap(), Some(FORMAT_VERSION.to_le_bytes().to_vec()), "written at creation");
    store.write(&[Write::Delete(Cf::Meta, META_FORMAT.to_vec())], true).unwrap();
    drop(store);
    let store = RocksStore::open(dir.path()).unwrap();
    assert_eq!(store.get(Cf::Meta, META_FORMAT).unwrap(), Some(FORMAT_VERSION.to_le_bytes().to_vec()));
}

/// Sets a store's format record to `record`.
fn store_with_format_record(record: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    store.write(&[Write::Put(Cf::Meta, META_FORMAT.to_vec(), record.to_vec())], true).unwrap();
    dir
}

/// `dagfold ARGS --data-dir DIR`: its exit status and standard error.
fn dagfold_on(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dagfold")).args(args).args(["--data-dir", dir.to_str().unwrap()]).output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `dagfold node` on `dir`, on free loopback ports: it must stop by
/// itself (the store refused), with its exit status and standard error; a
/// node still running after 30 s opened the store, and fails the test.
fn node_on(dir: &Path) -> (std::process::ExitStatus, String) {
    let (listen, admin) = (loopback(free_port()).to_string(), loopback(free_port()).to_string());
    let mut child = Command::new(env!("CARGO_BIN_EXE_dagfold"))
        .args(["node", "--listen", &listen, "--admin", &admin, "--data-dir", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stopped = common::node::wait_until(std::time::Duration::from_secs(30), || child.try_wait().unwrap().is_some());
    if !stopped {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stopped, "the node opened the store and ran: {stderr}");
    (out.status, stderr)
}

#[test]
fn a_newer_or_unknown_format_is_refused_with_a_message() {
    let newer = store_with_format_record(&(FORMAT_VERSION + 1).to_le_bytes());
    let err = RocksStore::open(newer.path()).err().expect("a newer format is refused");
    assert!(matches!(err, StoreError::FormatTooNew { found, .. } if found == FORMAT_VERSION + 1), "{err}");
    let (status, stderr) = node_on(newer.path());
    assert_eq!(status.code(), Some(1), "{stderr}");
    let want = format!("has format version {}; this dagfold reads versions up to {FORMAT_VERSION}", FORMAT_VERSION + 1);
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    for record in [&[0u8, 0, 0, 0][..], &[1, 0, 0], b"not a version"] {
        let unknown = store_with_format_record(record);
        let err = RocksStore::open(unknown.path()).err().expect("an unknown format is refused");
        assert!(matches!(err, StoreError::FormatUnknown { .. }), "{record:?}: {err}");
        let (status, stderr) = dagfold_on(unknown.path(), &["inspect"]);
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("is in no format this dagfold knows") && !stderr.contains("panicked"), "{stderr}");
    }
}

/// Flips the bits of one byte, `at_fraction` into the largest file of
/// `dir` whose name ends with `ext` (at least 50 kB: the store's records).
fn damage_largest(dir: &Path, ext: &str, at_fraction: f64) {
    let (file, len) = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == ext))
        .map(|e| (e.path(), e.metadata().unwrap().len()))
        .max_by_key(|(_, len)| *len)
        .unwrap_or_else(|| panic!("no .{ext} file"));
    assert!(len > 50_000, "the records are in {}: {len} bytes", file.display());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[(len as f64 * at_fraction) as usize] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
}

/// A store holding a scope of `data_ops` ops, each commit synced; with
/// `flush` its tables are in table files, else all in the WAL. No events:
/// the event log is not read at open, so its table must not be the
/// largest, the one damaged.
fn store_with_ops(data_ops: usize, flush: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RocksStore::open(dir.path()).unwrap();
    let id = dagfold::store::load_or_create_identity(&mut store).unwrap();
    let w = generate(&WorkloadConfig { seed: 3, data_ops, writers: 2, events_per_op: 0, ..Default::default() }, id.public_key, id.kem_public);
    let frames: Vec<Vec<u8>> = w.messages.iter().map(|m| m.frame.clone()).collect();
    let mut node = InlineDriver::open(store, Config::default(), 0).unwrap();
    for chunk in frames.chunks(16) {
        node.handle_frames(chunk, 0).unwrap();
    }
    if flush {
        node.store.flush().unwrap();
    }
    dir
}

/// Asserts that the node and `inspect` refuse the damaged store in `dir`
/// with the message that says what to do, and no panic.
fn assert_refused_as_corrupt(dir: &Path, what: &str) {
    let (status, stderr) = node_on(dir);
    assert_eq!(status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains("is corrupt; dagfold stopped and left its data as it is"), "{what}: {stderr}");
    assert!(stderr.contains("--peer KEY@ADDR") && stderr.contains("Corruption at open"), "{what}: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    let (status, stderr) = dagfold_on(dir, &["inspect"]);
    assert_eq!(status.code(), Some(1), "{what}: {stderr}");
    assert!(stderr.contains("is corrupt; dagfold stopped and left its data as it is") && !stderr.contains("panicked"), "{what}: {stderr}");
}

/// A damaged record in the middle of the WAL (commits after it were
/// acknowledged) stops the open: no silent rollback to the damage.
#[test]
fn a_damaged_wal_record_stops_the_open_with_what_to_do() {
    let dir = store_with_ops(300, false);
    damage_largest(dir.path(), "log", 0.5);
    // RocksDB's files but its info logs, with their sizes.
    let files = || -> Vec<(std::ffi::OsString, u64)> {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with("LOG"))
            .map(|e| (e.file_name(), e.metadata().unwrap().len()))
            .collect();
        v.sort();
        v
    };
    let before = files();
    assert_refused_as_corrupt(dir.path(), "a WAL record");
    assert_eq!(files(), before, "the store is left as it was");
}

/// A damaged block of the ops table met by a read of an applied op (the
/// engine's cold index, as the restore reads an op back) rather than at
/// open: the error says the store is corrupt and what to do, as at open.
/// (Met at open or in the restore's scan, `a_damaged_table_file_stops_
/// the_open_with_what_to_do` checks it whole; which one a damaged byte
/// meets depends on the block it falls in.)
#[test]
fn a_damaged_block_met_by_a_read_of_an_op_says_what_to_do() {
    let dir = store_with_ops(2_000, true);
    let mut ids = Vec::new();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        store.cold_reader().unwrap().scan(&mut |id, _| ids.push(*id)).unwrap();
    }
    assert!(ids.len() > 2_000, "{} ops stored", ids.len());
    // The ops table's file is the largest (each op's bytes); a byte in its
    // data blocks, which open does not read.
    damage_largest(dir.path(), "sst", 1.0 / 3.0);
    let store = RocksStore::open(dir.path()).expect("a data block is not read at open");
    let cold = store.cold_reader().unwrap();
    let failed: Vec<String> = ids.iter().filter_map(|id| cold.get(id).err()).map(|e| e.to_string()).collect();
    assert!(!failed.is_empty(), "some op's block was damaged");
    for e in &failed {
        assert!(e.contains("is corrupt; dagfold stopped and left its data as it is") && e.contains("--peer KEY@ADDR"), "{e}");
    }
}

/// A damaged block in the middle of a table file stops the open, before
/// the engine reads the table.
#[test]
fn a_damaged_table_file_stops_the_open_with_what_to_do() {
    let dir = store_with_ops(2_000, true);
    damage_largest(dir.path(), "sst", 1.0 / 3.0);
    assert_refused_as_corrupt(dir.path(), "a table file");
}
