//! Shared helpers for the integration tests: reading `../shared/vectors`
//! (never copied into the repo) and comparing an engine with a scenario.
#![allow(dead_code)]

pub mod api;
pub mod node;
pub mod relay;

use std::collections::BTreeMap;
use std::path::PathBuf;

use dagfold::core::{Engine, ScopeReport};
use dagfold::protocol::Hash;
use serde_json::Value;

pub fn vectors_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/vectors"))
}

pub fn load_json(rel: &str) -> Value {
    let path = vectors_dir().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("vector file is JSON")
}

pub fn scenario_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(vectors_dir().join("scenarios"))
        .expect("scenarios directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(v.len() >= 25, "expected the shared scenarios, found {}", v.len());
    v
}

pub fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap_or_else(|_| panic!("bad hex {s}"))
}

pub fn h32(s: &str) -> Hash {
    unhex(s).try_into().expect("32 bytes")
}

pub fn hashes(v: &Value) -> Vec<Hash> {
    v.as_array().expect("array").iter().map(|x| h32(x.as_str().unwrap())).collect()
}

pub fn node_identity(scn: &Value) -> dagfold::core::Identity {
    let n = &scn["node"];
    let id = dagfold::core::Identity::from_secrets(h32(n["secret_seed"].as_str().unwrap()), h32(n["kem_secret"].as_str().unwrap()));
    assert_eq!(hex::encode(id.public_key), n["public_key"].as_str().unwrap());
    assert_eq!(hex::encode(id.kem_public), n["kem_public"].as_str().unwrap());
    id
}

pub fn messages(scn: &Value) -> Vec<Vec<u8>> {
    scn["messages"].as_array().unwrap().iter().map(|m| unhex(m.as_str().unwrap())).collect()
}

/// The expected report of one scope entry of a scenario.
pub fn expected_report(e: &Value) -> ScopeReport {
    let mut dropped = BTreeMap::new();
    for (k, v) in e["dropped"].as_object().unwrap() {
        let reason = dagfold::core::Reason::ALL
            .into_iter()
            .find(|r| r.name() == v.as_str().unwrap())
            .unwrap_or_else(|| panic!("unknown reason {v}"));
        dropped.insert(h32(k), reason);
    }
    ScopeReport {
        scope: h32(e["scope"].as_str().unwrap()),
        root: h32(e["root"].as_str().unwrap()),
        data_heads: hashes(&e["data_heads"]),
        governance_heads: hashes(&e["governance_heads"]),
        applied: hashes(&e["applied"]),
        dropped,
        key_waiting: hashes(&e["key_waiting"]),
        data_key_waiting: hashes(&e["data_key_waiting"]),
        pending: hashes(&e["pending"]),
        divergences: e["divergences"].as_u64().unwrap(),
    }
}

/// Compares every scope of the engine with the scenario's expectation.
/// `check_divergences` is false where the count depends on arrival order.
pub fn check_scopes(name: &str, engine: &mut Engine, scn: &Value, check_divergences: bool) {
    let expected: Vec<ScopeReport> = scn["expect"]["scopes"].as_array().unwrap().iter().map(expected_report).collect();
    let want_ids: Vec<Hash> = expected.iter().map(|r| r.scope).collect();
    assert_eq!(engine.scope_ids(), want_ids, "{name}: the set of scopes");
    for want in expected {
        let mut got = engine.report(&want.scope).unwrap();
        if !check_divergences {
            got.divergences = want.divergences;
        }
        assert_eq!(got, want, "{name}: scope {}", hex::encode(want.scope));
        if let Some(status) = engine.status(&want.scope) {
            assert_eq!(status.applied, want.applied.len() as u64);
            assert_eq!(status.pending, want.pending.len() as u64);
            assert_eq!(status.key_waiting, want.key_waiting.len() as u64);
            assert_eq!(status.data_key_waiting, want.data_key_waiting.len() as u64);
            assert_eq!(status.root, want.root);
        }
    }
}

/// Events as (scope, op, kind, data) sorted, from the scenario.
pub fn expected_events(scn: &Value) -> Vec<(Hash, Hash, String, Vec<u8>)> {
    let mut v: Vec<_> = scn["expect"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                h32(e["scope"].as_str().unwrap()),
                h32(e["op"].as_str().unwrap()),
                e["kind"].as_str().unwrap().to_owned(),
                unhex(e["data"].as_str().unwrap()),
            )
        })
        .collect();
    v.sort();
    v
}
