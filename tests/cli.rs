//! The `dagfold` command line as a user runs it: `export` (offline, against
//! `import` and `inspect`), and the API client commands against a running
//! node.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use dagfold::core::{Cf, Write};
use dagfold::protocol::crypto::seal_key_delivery;
use dagfold::protocol::{encode, Hash};
use dagfold::store::rocks::RocksStore;
use dagfold::store::Store;
use dagfold::workload::{generate, shuffle_within_windows, WorkloadConfig};

fn dagfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dagfold")).args(args).output().expect("running dagfold")
}

/// Runs `dagfold` and answers its standard output as JSON; fails the test
/// with its standard error if it failed.
fn dagfold_json(args: &[&str]) -> serde_json::Value {
    let out = dagfold(args);
    assert!(out.status.success(), "dagfold {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("dagfold {args:?} printed no JSON ({e}): {:?}", String::from_utf8_lossy(&out.stdout)))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The public and KEM keys of the identity of `data_dir` (made if new).
fn identity(data_dir: &Path) -> (Hash, [u8; 32]) {
    let v = dagfold_json(&["identity", "--data-dir", path(data_dir)]);
    let h = |k: &str| -> [u8; 32] { hex::decode(v[k].as_str().unwrap()).unwrap().try_into().unwrap() };
    (h("public_key"), h("kem_public_key"))
}

#[test]
fn an_export_imports_in_one_pass_into_another_node_with_the_same_status() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a_key, a_kem) = identity(a.path());
    let (b_key, b_kem) = identity(b.path());
    assert_ne!(a_key, b_key);
    // A scope of many ops with a key rotation, imported into A out of order
    // (so the order of its tables is not the causal one).
    let cfg = WorkloadConfig { seed: 11, data_ops: 600, rotate_at: Some(300), ..WorkloadConfig::default() };
    let wl = generate(&cfg, a_key, a_kem);
    assert_eq!(wl.keys.len(), 2);
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for i in shuffle_within_windows(wl.messages.len(), 64, 5) {
        let f = &wl.messages[i].frame;
        file.write_all(&(f.len() as u32).to_le_bytes()).unwrap();
        file.write_all(f).unwrap();
    }
    file.flush().unwrap();
    let summary = dagfold_json(&["import", "--data-dir", path(a.path()), path(file.path())]);
    let applied = summary["applied"].as_u64().unwrap();
    assert!(applied > 600, "{summary}");
    // Deliveries of both keys to B, as if A had made them (the API's member
    // add does), and one for another scope, which the export leaves out.
    let mut deliveries: Vec<_> =
        wl.keys.iter().enumerate().map(|(i, k)| seal_key_delivery(wl.scope, k, b_key, &b_kem, &[i as u8 + 1; 32])).collect();
    deliveries.push(seal_key_delivery([7; 32], &wl.keys[0], b_key, &b_kem, &[9; 32]));
    {
        let mut store = RocksStore::open(a.path()).unwrap();
        let writes: Vec<Write> = deliveries
            .iter()
            .map(|kd| {
                let key = [dagfold::core::META_DELIVERY_PREFIX, &kd.recipient[..], &kd.scope[..], &kd.key_id[..]].concat();
                Write::Put(Cf::Meta, key, encode(kd))
            })
            .collect();
        store.write(&writes, true).unwrap();
    }

    let scope = hex::encode(wl.scope);
    let out = tempfile::NamedTempFile::new().unwrap();
    let summary = dagfold_json(&["export", "--data-dir", path(a.path()), "--scope", &scope, "--out", path(out.path())]);
    assert_eq!(summary["ops"].as_u64(), Some(applied), "{summary}");
    assert_eq!(summary["deliveries"].as_u64(), Some(2), "{summary}");
    // To standard output: the same frames, the summary on standard error.
    let to_stdout = dagfold(&["export", "--data-dir", path(a.path()), "--scope", &scope]);
    assert!(to_stdout.status.success());
    assert_eq!(to_stdout.stdout, std::fs::read(out.path()).unwrap());
    assert!(String::from_utf8_lossy(&to_stdout.stderr).contains("\"deliveries\":2"));

    // Into B, whose identity differs: nothing waits on anything.
    let summary = dagfold_json(&["import", "--data-dir", path(b.path()), path(out.path())]);
    assert_eq!(summary["applied"].as_u64(), Some(applied), "{summary}");
    assert_eq!(summary["buffered"], serde_json::json!({"pending": 0, "key_waiting": 0, "data_key_waiting": 0}), "{summary}");
    assert_eq!(summary["released_by_cascade"].as_u64(), Some(0), "{summary}");
    assert_eq!(summary["keys_accepted"].as_u64(), Some(2), "{summary}");
    let status_a = dagfold_json(&["inspect", "--data-dir", path(a.path()), "--scope", &scope]);
    let status_b = dagfold_json(&["inspect", "--data-dir", path(b.path()), "--scope", &scope]);
    assert_eq!(status_a, status_b);
    assert_eq!(status_a["root"].as_str(), Some(hex::encode(wl.final_root).as_str()));
    assert_eq!(status_a["applied"].as_u64(), Some(applied));

    // An unknown scope: a clear message, nothing written.
    let unknown = hex::encode([0xab; 32]);
    let out = dagfold(&["export", "--data-dir", path(a.path()), "--scope", &unknown]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("no scope {unknown}")), "{err}");
    let out = dagfold(&["export", "--data-dir", path(a.path()), "--scope", "xyz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("64 hex"));
}
