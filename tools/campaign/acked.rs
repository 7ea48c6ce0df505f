//! What node A acknowledged, recorded by the campaign itself (never read
//! back from the node's own counts), and the check that all of it is in
//! the store after a kill or a power cut, before anything is resent:
//!
//! - every event the subscriber printed (its op applied, at its seq in the
//!   event log);
//! - every op a status read named as a head, the largest applied count a
//!   status reported (a failed read records nothing: it never lowers the
//!   expectation), and the root reported with each count (a store holding
//!   that many applied ops must hold that root: the applied set only grows);
//! - every API write answered 201 (`POST /v1/scopes`, `POST
//!   /v1/scopes/{scope}/ops`), which the node answers only once durable.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagfold::client::{Action, Client};
use dagfold::protocol::{parse_hash_hex, Hash};

use crate::check::StoreReport;

/// The records of what the node acknowledged on one scope.
#[derive(Default)]
pub struct Acked {
    pub status_heads: HashSet<Hash>,
    pub status_applied_max: u64,
    /// Applied count → the root a status reported with it.
    pub status_roots: BTreeMap<u64, Hash>,
    pub status_reads: u64,
    pub status_failures: u64,
}

/// How much of the record one check covered, for the kill log.
#[derive(Default, Debug, Clone, Copy, serde::Serialize)]
pub struct Covered {
    pub events: u64,
    pub status_heads: u64,
    pub status_applied_max: u64,
    pub api_writes: u64,
    /// Of those, missing from the store (each counted, the messages capped).
    pub lost: u64,
}

impl Acked {
    /// Records one status read of the scope (None: the read failed).
    pub fn record_status(&mut self, status: Option<&serde_json::Value>) {
        let Some(s) = status else {
            self.status_failures += 1;
            return;
        };
        let (Some(applied), Some(root)) = (s["applied"].as_u64(), s["root"].as_str().and_then(parse_hash_hex)) else {
            self.status_failures += 1;
            return;
        };
        self.status_reads += 1;
        self.status_applied_max = self.status_applied_max.max(applied);
        self.status_roots.insert(applied, root);
        for k in ["data_heads", "governance_heads"] {
            for h in s[k].as_array().into_iter().flatten().filter_map(|h| h.as_str().and_then(parse_hash_hex)) {
                self.status_heads.insert(h);
            }
        }
    }

    /// Problems if anything recorded is missing from `chk` (the store as
    /// reopened after the kill). `events_file`: the subscriber's output so
    /// far; `api_ops`: the API writes answered so far.
    pub fn check(&self, chk: &StoreReport, events_file: &Path, api_ops: &[Hash]) -> (Covered, Vec<String>) {
        let mut problems = Vec::new();
        let mut lost = 0u64;
        let mut p = |s: String| {
            lost += 1;
            if problems.len() < 20 {
                problems.push(s)
            }
        };
        let mut cov = Covered::default();
        for (seq, op) in subscriber_events(events_file) {
            cov.events += 1;
            if !chk.ops.contains(&op) {
                p(format!("acknowledged loss: event {seq} (op {}) was received, the op is not applied in the store", hex::encode(op)));
            } else if chk.events.get(&seq) != Some(&op) {
                p(format!("acknowledged loss: event {seq} (op {}) was received, the event log has {:?}", hex::encode(op), chk.events.get(&seq).map(hex::encode)));
            }
        }
        for h in &self.status_heads {
            cov.status_heads += 1;
            if !chk.ops.contains(h) {
                p(format!("acknowledged loss: a status named head {} applied, the store does not hold it applied", hex::encode(h)));
            }
        }
        cov.status_applied_max = self.status_applied_max;
        let stored = chk.scope_applied.unwrap_or(0);
        if stored < self.status_applied_max {
            p(format!("acknowledged loss: a status said {} applied, the store holds {stored}", self.status_applied_max));
        }
        // Compared only when reopening released nothing (then the count is
        // the stored applied set's).
        if chk.released_at_reopen == 0 {
            if let (Some(want), Some(root)) = (self.status_roots.get(&stored), chk.root) {
                if *want != root {
                    p(format!("acknowledged loss: a status reported root {} at {stored} applied, the store holds {} at that count", hex::encode(want), hex::encode(root)));
                }
            }
        }
        for op in api_ops {
            cov.api_writes += 1;
            if !chk.ops.contains(op) {
                p(format!("acknowledged loss: the API answered 201 for op {}, the store does not hold it applied", hex::encode(op)));
            }
        }
        cov.lost = lost;
        (cov, problems)
    }
}

/// The events the subscriber printed so far, (seq, op), complete lines only.
pub fn subscriber_events(path: &Path) -> Vec<(u64, Hash)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["seq"].as_u64()?, v["op"].as_str().and_then(parse_hash_hex)?)))
        .collect()
}

/// Writes to node A over its API from a thread: a scope of its own, then
/// one small data op at a time (each answered once durable), paced;
/// records every op answered 201. Errors (the node down, restarting) are
/// counted and retried after a pause.
pub struct ApiWriter {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Hash>>>,
    errors: Arc<Mutex<u64>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ApiWriter {
    pub fn start(admin: std::net::SocketAddr, token_file: PathBuf, writes_per_s: u64) -> ApiWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(0u64));
        let (s, a, e) = (stop.clone(), acked.clone(), errors.clone());
        let pause = Duration::from_millis(1000 / writes_per_s.max(1));
        let handle = std::thread::spawn(move || {
            let mut scope: Option<String> = None;
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                // The token is read again each time: a cut may lose a token
                // file the node had not synced, and the next start makes one.
                let r = Client::with_token_file(&admin.to_string(), &token_file).and_then(|c| match &scope {
                    None => c.create_scope("crash-api").map(|made| (Some(made.scope), made.op)),
                    Some(sc) => {
                        let key = i.to_le_bytes();
                        c.write(sc, &[Action::put("crash", key, key)], &[]).map(|w| (None, w.op))
                    }
                });
                match r {
                    Ok((new_scope, op)) => {
                        if let Some(sc) = new_scope {
                            scope = Some(sc);
                        }
                        i += 1;
                        if let Some(op) = parse_hash_hex(&op) {
                            a.lock().unwrap().push(op);
                        }
                        std::thread::sleep(pause);
                    }
                    Err(_) => {
                        *e.lock().unwrap() += 1;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        });
        ApiWriter { stop, acked, errors, handle: Some(handle) }
    }

    /// The ops answered so far.
    pub fn acked(&self) -> Vec<Hash> {
        self.acked.lock().unwrap().clone()
    }

    pub fn errors(&self) -> u64 {
        *self.errors.lock().unwrap()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ApiWriter {
    fn drop(&mut self) {
        self.stop();
    }
}
