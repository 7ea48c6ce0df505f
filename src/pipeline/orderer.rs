//! The orderer: the one thread that runs the engine. It judges the
//! decrypted batches in order (verdicts, DAG, buffers, cascade), folds them
//! into group commits, feeds the authorizer's and decryptor's replicas with
//! what the engine accepted, publishes statuses and the ids wanted from
//! peers, and hands each commit to the projector's shards.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use metrics::{counter, gauge, histogram};

use super::metrics::{count_verdict, flush_verdicts, note_age, publish_engine_memory, EngineGauges, Paced, WaitCounter};
use super::policy::{InFlight, OrderPolicy};
use super::projector::{HeartbeatCheck, ToProject};
use super::shards::Split;
use super::author::Authoring;
use super::{gate, Authored, Batch, ConnId, HostOutcomes, Item, PipelineState, Work};
use crate::clock::now_ms;
use crate::core::governance::Governance;
use crate::core::{Engine, Outcome, ScopeStatus, VerifiedOp};
use crate::protocol::Hash;

/// What the orderer updates beside the engine: the stages' replicas, the
/// queue probes for metrics, and where what each host's ops came to goes.
pub(super) struct OrdererIo {
    pub(super) gov: Arc<RwLock<Governance>>,
    pub(super) keyring: super::Keyring,
    pub(super) probes: Vec<(&'static str, Receiver<Batch>)>,
    pub(super) outcomes: Option<Arc<dyn HostOutcomes>>,
    /// The byte budget of the orderer's input queue.
    pub(super) gate: Arc<gate::ByteGate>,
    /// The API's requests to the orderer (`PipelineState::direct`).
    pub(super) direct: Receiver<Work>,
}

/// What a wait for input brought.
enum Input {
    Batch(Batch),
    Direct(Work),
    Timeout,
    Closed,
}

/// The next batch from the stages before, or request from the API, within
/// `wait`.
fn next_input(rx: &Receiver<Batch>, direct: &Receiver<Work>, wait: Duration) -> Input {
    crossbeam_channel::select! {
        recv(rx) -> b => b.map_or(Input::Closed, Input::Batch),
        recv(direct) -> w => w.map_or(Input::Timeout, Input::Direct),
        default(wait) => Input::Timeout,
    }
}

pub(super) fn run(
    engine: &mut Engine,
    rx: Receiver<Batch>,
    commit_tx: Split,
    shared: Arc<PipelineState>,
    io: OrdererIo,
    commit_ops_max: usize,
    tick_ms: u64,
) {
    let OrdererIo { gov, keyring, probes, outcomes, gate, direct } = io;
    let mut hosts: crate::core::IdMap<std::net::IpAddr, (u32, u32)> = Default::default();
    let mut conns: crate::core::IdMap<Hash, ConnId> = Default::default();
    let mut policy = OrderPolicy::new(commit_ops_max, Duration::from_millis(tick_ms), Instant::now());
    let mut last_received = Instant::now();
    let mut open = true;
    let waited_commit = WaitCounter::new("commit");
    let waited_input = WaitCounter::new("input");
    // The handles of what is published with every commit, looked up once.
    let engine_gauges = EngineGauges::new();
    let order_seconds = histogram!("dagfold_stage_seconds", "stage" => "order");
    let status_seconds = histogram!("dagfold_stage_seconds", "stage" => "status");
    let buffered_ops = gauge!("dagfold_buffered_ops");
    let buffered_bytes = gauge!("dagfold_buffered_bytes");
    let queues: Vec<(metrics::Gauge, &Receiver<Batch>)> =
        probes.iter().map(|(stage, rx)| (gauge!("dagfold_queue_batches", "stage" => *stage), rx)).collect();
    let project_queue = gauge!("dagfold_queue_batches", "stage" => "project");
    let order_queue_bytes = gauge!("dagfold_order_queue_bytes");
    let mut heartbeats: Vec<HeartbeatCheck> = Vec::new();
    let mut authoring = Authoring::default();
    let mut in_flight = InFlight::default();
    let mut memory = Paced::default();
    let mut spell = crate::idle::Spell::default();
    while open || engine.cascade_remaining() {
        // Group commit: keep folding batches into this commit while the
        // one before waits for the projector, or two handed over are not
        // yet durable (`InFlight`), up to `commit_ops_max` applied ops
        // (`COMMIT_ITEMS_FACTOR`); hand it over as soon as neither holds.
        let mut items_in_commit = 0usize;
        let mut t = Instant::now();
        let cascaded = engine.cascade_remaining();
        if cascaded {
            // A long cascade goes in parts of `commit_ops_max` woken ops, one
            // commit each, so the committer writes one part while the
            // orderer judges the next; new batches wait until it is done
            // (the rest of the batch that started it was handled with it,
            // each item adding to the same work list, which order does not
            // change: a verdict depends only on the op and what is applied).
            engine.continue_cascade(now_ms());
        }
        while !engine.cascade_remaining() {
            // Idle, wait for input up to a tick; with work in hand (folded
            // items, or the last part of a cascade just judged), only
            // briefly, so that it is committed at once when nothing comes.
            let idle = policy.idle(items_in_commit, cascaded);
            let wait = policy.input_wait(items_in_commit, cascaded);
            let t_recv = Instant::now();
            let got = next_input(&rx, &direct, wait);
            waited_input.increment(t_recv.elapsed());
            if idle {
                // The step's time (the "order" stage) starts with its work.
                t = Instant::now();
            }
            match got {
                Input::Direct(work) => {
                    // The API's requests queued by now go in the same round
                    // (each round can close a commit: one per request made
                    // a commit, and a projector and committer trip, each).
                    let mut at = ItemState { conns: &mut conns, hosts: &mut hosts, heartbeats: &mut heartbeats, authoring: &mut authoring };
                    let queued = std::iter::from_fn(|| direct.try_recv().ok()).take(DIRECT_PER_ROUND_MAX - 1);
                    for work in std::iter::once(work).chain(queued) {
                        items_in_commit += match &work {
                            Work::Own(ops) => ops.len(),
                            Work::Draft(reqs) => reqs.len(),
                            _ => 1,
                        };
                        handle_item(engine, Item { work, valid: false, pre: Default::default() }, &shared, &mut at);
                    }
                }
                Input::Batch(batch) => {
                    note_age("order", batch.received);
                    gate.release(batch.bytes());
                    last_received = last_received.min(batch.received);
                    items_in_commit += batch.items.len();
                    let mut at = ItemState { conns: &mut conns, hosts: &mut hosts, heartbeats: &mut heartbeats, authoring: &mut authoring };
                    engine.prefetch(batch.items.iter().filter_map(|i| match &i.work {
                        Work::Op { id, .. } if i.valid => Some(id),
                        _ => None,
                    }));
                    for item in batch.items {
                        handle_item(engine, item, &shared, &mut at);
                    }
                }
                Input::Timeout => {}
                Input::Closed => {
                    open = false;
                    break;
                }
            }
            let slot_free = commit_tx.is_empty() && in_flight.room(shared.durable_commits.load(Ordering::Acquire));
            if policy.close_commit(items_in_commit, engine.applied_in_commit(), slot_free) {
                break;
            }
        }
        flush_verdicts();
        engine.handle_tick(now_ms());
        authoring.expire(engine, now_ms());
        // Ops applied by durable commits may leave the in-memory index.
        let durable = shared.durable_commits.load(Ordering::Acquire);
        if durable > 0 {
            engine.note_durable(durable - 1);
        }
        if engine.cold_filter_partial() {
            match shared.cold_filter.lock().unwrap().take() {
                Some(Ok(filter)) => {
                    engine.complete_cold_filter(&filter);
                    gauge!("dagfold_cold_filter_partial").set(0.0);
                }
                // As a failed read of the cold index: the node stops.
                Some(Err(e)) if shared.refuse("store read", &e) => {
                    counter!("dagfold_store_read_failures_total").increment(1);
                }
                Some(Err(_)) | None => {}
            }
        }
        let commit = match engine.take_commit() {
            Ok(commit) => commit,
            Err(e) => {
                // As after a failed write: nothing judged since is handed
                // on (the commits before it are), nothing more is taken.
                if shared.refuse("store read", &e) {
                    counter!("dagfold_store_read_failures_total").increment(1);
                }
                // Never durable: their writers hear the store refuses.
                authoring.answers.clear();
                continue;
            }
        };
        if let Some(outcomes) = &outcomes {
            outcomes.record(&mut hosts.drain().map(|(h, (useful, total))| (h, useful, total)));
        } else {
            hosts.clear();
        }
        // Statuses (and so the scope roots) are computed when the input is
        // drained, and under load at most every STATUS_INTERVAL (the
        // policy). A data op entering its in-memory key wait writes nothing
        // but still changes the status.
        let now = Instant::now();
        let want_status = policy.want_status(now, engine.statuses_stale(), rx.is_empty());
        // The ids to ask peers for, refreshed after a change, at most every
        // WANTED_INTERVAL, idle ticks included (the policy).
        let changed = !commit.is_empty() || !commit.applied.is_empty() || want_status;
        if policy.refresh_wanted(now, changed) {
            let ids = engine.wanted(crate::protocol::node::SYNC_IDS_MAX);
            let scopes = engine.wanted_scopes(&ids);
            *shared.wanted.lock().unwrap() = crate::peering::Wanted { ids, scopes };
        }
        // Idle rounds too: the buffers change with no commit (a data op's
        // key wait expires, an orphan is evicted).
        memory.run(|| publish_engine_memory(engine, &shared));
        if commit.is_empty()
            && commit.applied.is_empty()
            && commit.delivered.is_empty()
            && !want_status
            && heartbeats.is_empty()
            && authoring.roots.is_empty()
        {
            last_received = Instant::now();
            spell.idle();
            continue;
        }
        spell.worked();
        order_seconds.record(t.elapsed().as_secs_f64());
        // Feed the replicas before the next batch reaches the authorizer.
        if !commit.gov_applied.is_empty() {
            let mut g = gov.write().expect("governance replica lock");
            for (id, node) in &commit.gov_applied {
                g.insert(*id, node.clone());
            }
        }
        if !commit.keys_added.is_empty() {
            let mut k = keyring.write().expect("keyring lock");
            for key in &commit.keys_added {
                k.insert(crate::protocol::crypto::key_id_of(key), *key);
            }
        }
        let statuses: Vec<ScopeStatus> = if want_status {
            let t_status = Instant::now();
            policy.statuses_computed(t_status);
            authoring.judged.clear();
            let v = engine.take_statuses();
            status_seconds.record(t_status.elapsed().as_secs_f64());
            v
        } else {
            // Between the policy's rounds, the scopes of the API's writes
            // (answered once this commit is durable).
            let judged = std::mem::take(&mut authoring.judged);
            judged.iter().filter_map(|s| engine.take_status(s)).collect()
        };
        let applied_conns: Vec<ConnId> =
            commit.applied.iter().map(|(id, _)| conns.remove(id).unwrap_or(0)).collect();
        conns.clear();
        let (bo, bb) = engine.buffered_total();
        shared.buffered_ops.store(bo, Ordering::Relaxed);
        shared.buffered_bytes.store(bb, Ordering::Relaxed);
        buffered_ops.set(bo as f64);
        buffered_bytes.set(bb as f64);
        engine_gauges.publish(engine);
        for (gauge, rx) in &queues {
            gauge.set(rx.len() as f64);
        }
        project_queue.set(commit_tx.len() as f64);
        order_queue_bytes.set(gate.held() as f64);
        // Both slots of a shard taken: that shard (or, behind it, the
        // committer) is behind, and the time spent here is the orderer
        // waiting for it. The commit is split by scope on this thread.
        let t_send = Instant::now();
        let heartbeats = std::mem::take(&mut heartbeats);
        let roots = std::mem::take(&mut authoring.roots);
        if !authoring.answers.is_empty() {
            // Before the commit goes on, so the committer finds them.
            debug_assert!(authoring.answers.iter().all(|(_, a)| a.commit == commit.number));
            shared.answers.lock().unwrap().push_back((commit.number, std::mem::take(&mut authoring.answers)));
        }
        in_flight.sent(commit.number);
        let to_project = ToProject { commit, statuses, conns: applied_conns, received: last_received, heartbeats, roots };
        if !commit_tx.send(to_project) {
            return;
        }
        waited_commit.increment(t_send.elapsed());
        last_received = Instant::now();
    }
}

/// The API's requests (`Work::Draft` and the like) taken in one round of
/// the orderer at most, so that batches from the network keep their turn.
const DIRECT_PER_ROUND_MAX: usize = 256;

/// Heartbeat root comparisons one commit carries at most (a heartbeat is
/// per peer and scope, ≥ 200 ms apart; past this, a flood of them is
/// compared no more until the next commit).
const HEARTBEAT_CHECKS_MAX: usize = 1024;

/// What handling an item may add to, beside the engine: per commit, the
/// connections of applied ops, the hosts' outcomes, the heartbeat
/// comparisons; across commits, the drafts out.
struct ItemState<'a> {
    conns: &'a mut crate::core::IdMap<Hash, ConnId>,
    hosts: &'a mut crate::core::IdMap<std::net::IpAddr, (u32, u32)>,
    heartbeats: &'a mut Vec<HeartbeatCheck>,
    authoring: &'a mut Authoring,
}

fn handle_item(engine: &mut Engine, item: Item, shared: &PipelineState, at: &mut ItemState<'_>) {
    let ItemState { conns, hosts, heartbeats, authoring } = at;
    if shared.refusing.load(Ordering::Relaxed) {
        counter!("dagfold_refused_while_failed_total").increment(1);
        // Requests of the node's own API are answered (dropped, their
        // requesters see the store refusing).
        return;
    }
    let now = now_ms();
    let outcome = match item.work {
        Work::Draft(reqs) => {
            for req in reqs {
                authoring.request(engine, req, now);
            }
            return;
        }
        Work::Follow { scope, reply } => {
            engine.follow(scope);
            let _ = reply.send(engine.commit_number());
            return;
        }
        Work::Undraft { scope, plane, reply } => {
            authoring.returned(engine, &scope, plane, now);
            let _ = reply.send(());
            return;
        }
        Work::Deliver { kd, reply } => {
            engine.stats.frames += 1;
            let outcome = engine.handle_own_delivery(&kd, now);
            if let Some(r) = reply {
                let _ = r.send(engine.commit_number());
            }
            outcome
        }
        Work::Malformed => engine.note_malformed(),
        Work::Key { kd, host } => {
            engine.stats.frames += 1;
            let outcome = engine.handle_key_opened(&kd, item.pre.key, now);
            note_host(hosts, host, outcome == Outcome::KeyAccepted);
            outcome
        }
        Work::Own(ops) => {
            for o in ops {
                count_verdict(judge_own(engine, o, authoring, now));
            }
            return;
        }
        Work::Op { id, op, bytes, conn, host } => {
            let outcome = engine.handle_checked(VerifiedOp { id, op, bytes, pre: item.pre }, item.valid, now);
            if conn != 0 {
                conns.insert(id, conn);
            }
            let useful = matches!(
                outcome,
                Outcome::Applied | Outcome::NotYet(crate::core::BufKind::KeyWait | crate::core::BufKind::DataKeyWait)
            );
            note_host(hosts, host, useful);
            outcome
        }
        Work::Heads { peer, origin, scope, heads, root } => {
            let lacking = crate::peering::lacking_heads(&heads, |h| engine.op_state(h));
            if !lacking.is_empty() {
                let mut notes = shared.lacking.lock().unwrap();
                notes.note(origin, scope, lacking);
                gauge!("dagfold_lacking_notes").set(notes.len() as f64);
            } else if let Some(st) = engine.status(&scope) {
                let mut theirs = heads.clone();
                theirs.sort();
                let mut ours: Vec<Hash> = st.data_heads.iter().chain(&st.governance_heads).copied().collect();
                ours.sort();
                if ours == theirs && heartbeats.len() < HEARTBEAT_CHECKS_MAX {
                    // Our root at this point is the projector's to compare.
                    heartbeats.push(HeartbeatCheck { at: engine.folds_in_commit(), peer, scope, root });
                }
            }
            return;
        }
    };
    count_verdict(outcome);
}

/// An op the node authored (`Work::Own`), judged; an applied one is
/// answered once its commit is durable, any other at once.
fn judge_own(engine: &mut Engine, o: crate::pipeline::OwnOp, authoring: &mut Authoring, now: u64) -> Outcome {
    let crate::pipeline::OwnOp { id, op, bytes, plain, reply } = o;
    // A genesis belongs to the scope it names (SPEC §2).
    let scope = if op.scope == crate::protocol::ZERO { id } else { op.scope };
    let plane = op.plane;
    let event_seq = engine.event_seq(&scope);
    // Signed by the node's own key over `id` (`Work::Own`); the payload it
    // sealed is `plain`.
    let root = if plane == crate::protocol::PLANE_DATA { plain.as_ref().and_then(|p| p.get(..32)?.try_into().ok()) } else { None };
    let pre = crate::core::Prepared { auth: None, opened: plain.map(Some), ..Default::default() };
    let outcome = engine.handle_checked(VerifiedOp { id, op, bytes, pre }, true, now);
    let answer = Authored { id, root, outcome, commit: engine.commit_number(), event_seq };
    if outcome == Outcome::Applied {
        authoring.answers.push((reply, answer));
    } else {
        let _ = reply.send(Ok(answer));
    }
    authoring.returned(engine, &scope, plane, now);
    outcome
}

/// Counts an op or key delivery in its host's `(useful, total)`.
fn note_host(hosts: &mut crate::core::IdMap<std::net::IpAddr, (u32, u32)>, host: Option<std::net::IpAddr>, useful: bool) {
    if let Some(h) = host {
        let e = hosts.entry(h).or_default();
        e.0 += u32::from(useful);
        e.1 += 1;
    }
}
