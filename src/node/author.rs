//! The node as its application's agent (API.md, "Model"): ops and key
//! deliveries authored by the node's identity, each received through the
//! same path as any op from the network.
//!
//! A governance write asks the orderer for a draft (`pipeline::
//! DraftRequest::Governance`: parents, cut, hlc, key, the members and
//! keys), composes and signs the op here, on the network runtime's
//! threads, and sends it to the orderer (`Work::Own`: the stages before it
//! would only find the node's own signature valid and open the payload it
//! sealed). A data write sends its payload with the request (`DraftRequest
//! ::Data`): the pipeline drafts it, computes its root, composes and signs
//! it, with no trip back here (`pipeline::author`). Either way the engine
//! judges the op like a received one, and the write is answered once its
//! commit is durable. An op the path drops is answered `Rejected` with the
//! SPEC §6 reason; nothing of it is kept. Callers run each write in a task
//! of its own (`spawn`), so that a client that goes away mid-write never
//! leaves a draft out, and holds its place among the writes in progress
//! until it is answered.

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use tokio::sync::{oneshot, Semaphore};

use crate::core::{DraftRefused, Identity, Outcome};
use crate::limits::OP_PAYLOAD_BYTES_MAX;
use crate::pipeline::{Authored, DraftRequest, Drafted, OwnOp, PipelineState, Work};
use crate::protocol::crypto::{key_id_of, seal_key_delivery};
use crate::protocol::{
    encode, Action, DataPayload, Event, GovAction, GovPayload, Hash, KeyDelivery, Op, PublicKey, Role,
    PLANE_GOVERNANCE, ZERO,
};

/// Writes in progress at once, over all clients: each holds a draft or an
/// op in the pipeline; past this the API answers 503 at once instead of
/// queueing without bound.
pub const WRITES_IN_PROGRESS_MAX: usize = 4096;

/// How long a write waits for its draft, its verdict and its durability
/// together. The pipeline answers in milliseconds; this covers a stall
/// (a store slow to sync) without holding a client forever, and answers
/// within the API's request timeout (`api::API_REQUEST_TIMEOUT_MS`), so the
/// client reads why.
pub const WRITE_ANSWER_TIMEOUT_MS: u64 = 8_000;

/// The AEAD tag a sealed payload adds (SPEC §4).
const TAG_BYTES: usize = 16;

/// Why a write was not done.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Refused(#[from] DraftRefused),
    /// The receive path dropped the op (SPEC §6), with its reason.
    #[error("the receive path dropped the op: {0}")]
    Rejected(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    TooLarge(String),
    /// Retryable: the store refuses writes, the node drains, a bound is full.
    #[error("{0}")]
    Unavailable(String),
}

/// A write that is durable and applied.
#[derive(Debug, Clone)]
pub struct Written {
    pub scope: Hash,
    pub op: Hash,
    /// The scope root the op carries (data ops).
    pub root: Option<Hash>,
    pub first_event_seq: Option<u64>,
    /// The new key's id (rotations).
    pub key_id: Option<Hash>,
}

/// The node's authoring side, shared by the API's handlers.
pub struct Author {
    identity: Identity,
    signer: crate::protocol::sig::Signer,
    pipeline: Arc<PipelineState>,
    permits: Arc<Semaphore>,
    /// Data drafts not yet sent to the orderer (`request_draft`): at most
    /// one per write in progress.
    drafts: Arc<Coalescer<DraftRequest>>,
}

/// Items pushed by the tasks of one round of a tokio runtime, handed on
/// together: the first push spawns a task that yields once, so that the
/// tasks already woken run and push theirs, then takes them all.
struct Coalescer<T> {
    /// The items, and whether a task to take them is on its way.
    queue: std::sync::Mutex<(Vec<T>, bool)>,
}

impl<T: Send + 'static> Coalescer<T> {
    fn new() -> Arc<Self> {
        Arc::new(Coalescer { queue: std::sync::Mutex::new((Vec::new(), false)) })
    }

    /// Adds `item`; `send` gets it with the others of this round (the
    /// first push's `send` is the one called).
    fn push(self: &Arc<Self>, item: T, send: impl FnOnce(Vec<T>) + Send + 'static) {
        let first = {
            let mut q = self.queue.lock().unwrap();
            q.0.push(item);
            !std::mem::replace(&mut q.1, true)
        };
        if !first {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            let items = {
                let mut q = me.queue.lock().unwrap();
                q.1 = false;
                std::mem::take(&mut q.0)
            };
            send(items);
        });
    }
}

impl Author {
    pub fn new(identity: Identity, pipeline: Arc<PipelineState>) -> Self {
        let signer = crate::protocol::sig::Signer::new(&identity.seed);
        let permits = Arc::new(Semaphore::new(WRITES_IN_PROGRESS_MAX));
        Author { identity, signer, pipeline, permits, drafts: Coalescer::new() }
    }

    /// Runs a write in a task of its own, bounded by `WRITES_IN_PROGRESS_MAX`
    /// and `WRITE_ANSWER_TIMEOUT_MS`.
    pub async fn spawn<F, Fut>(self: &Arc<Self>, f: F) -> Result<Written, WriteError>
    where
        F: FnOnce(Arc<Author>) -> Fut,
        Fut: std::future::Future<Output = Result<Written, WriteError>> + Send + 'static,
    {
        if let Some(reason) = self.pipeline.refusing_reason.lock().unwrap().clone() {
            return Err(WriteError::Unavailable(format!("the store refuses writes until the node restarts: {reason}")));
        }
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            WriteError::Unavailable(format!("{WRITES_IN_PROGRESS_MAX} writes are in progress; retry"))
        })?;
        let fut = f(self.clone());
        let timeout = Duration::from_millis(WRITE_ANSWER_TIMEOUT_MS);
        let task = tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(WriteError::Unavailable(format!(
                    "not answered within {} s; the write may still be applied",
                    WRITE_ANSWER_TIMEOUT_MS / 1000
                ))),
            }
        });
        task.await.unwrap_or_else(|e| Err(WriteError::Unavailable(format!("the write's task failed: {e}"))))
    }

    /// A new scope (API.md `POST /v1/scopes`): a genesis by the node, and
    /// a fresh group key from the OS's randomness, delivered to the node.
    pub async fn create_scope(self: Arc<Self>, name: String) -> Result<Written, WriteError> {
        if name.len() > OP_PAYLOAD_BYTES_MAX as usize - 64 {
            return Err(WriteError::TooLarge(format!("a scope name of {} bytes does not fit in an op", name.len())));
        }
        let key = random_key();
        let payload = encode(&GovPayload { actions: vec![GovAction::Genesis { name, first_key_id: key_id_of(&key) }] });
        let mut op = Op {
            version: 1,
            scope: ZERO,
            plane: PLANE_GOVERNANCE,
            author: self.identity.public_key,
            parents: vec![],
            cut: vec![],
            hlc: crate::clock::now_ms(),
            key_id: ZERO,
            nonce: [0; 12],
            payload,
            signature: [0; 64],
        };
        let (bytes, id) = self.sign(&mut op);
        // The key first: it is in the keyring before any op can need it.
        let commit = self.deliver(self.to_self(id, &key)).await?;
        let done = self.submit(id, op, bytes, None).await?;
        self.durable(commit.max(done.commit)).await?;
        Ok(Written { scope: id, op: id, root: None, first_event_seq: None, key_id: Some(key_id_of(&key)) })
    }

    /// A data op (API.md `POST /v1/scopes/{scope}/ops`).
    pub async fn write(self: Arc<Self>, scope: Hash, actions: Vec<Action>, events: Vec<Event>) -> Result<Written, WriteError> {
        let has_events = !events.is_empty();
        // Encoded once: the root, its first field (borsh, in order), is set
        // in place by the projector. The actions go separately too (the
        // projector folds them for the root).
        let plain = encode(&DataPayload { root_hash: ZERO, actions: actions.clone(), events });
        // SPEC §7's payload limit, with the tag.
        if plain.len() + TAG_BYTES > OP_PAYLOAD_BYTES_MAX as usize {
            return Err(WriteError::TooLarge(format!(
                "the op's payload would be {} bytes, over SPEC §7's {OP_PAYLOAD_BYTES_MAX}",
                plain.len() + TAG_BYTES
            )));
        }
        let (tx, rx) = oneshot::channel();
        self.request_draft(DraftRequest::Data { scope, actions, plain, reply: tx });
        // Answered once its commit is durable.
        let done = self.judged(rx).await?;
        let first_event_seq = has_events.then_some(done.event_seq + 1);
        Ok(Written { scope, op: done.id, root: done.root, first_event_seq, key_id: None })
    }

    /// `AddMember`, then every key of the keyring delivered to the member.
    pub async fn add_member(self: Arc<Self>, scope: Hash, member: PublicKey, kem: [u8; 32], role: Role) -> Result<Written, WriteError> {
        let d = self.draft(scope).await?;
        if d.draft.governance.role(&member).is_some() {
            return self
                .release(d, WriteError::Conflict("already a member; change its role with PUT …/members/{public_key}".into()))
                .await;
        }
        let plain = encode(&GovPayload { actions: vec![GovAction::AddMember { member, role, kem }] });
        let (id, op, bytes) = self.compose(&d, &plain);
        let done = self.submit(id, op, bytes, Some(plain)).await?;
        let mut last = done.commit;
        for key in &d.draft.keyring {
            last = last.max(self.deliver(self.seal(scope, key, member, &kem)).await?);
        }
        self.durable(last).await?;
        Ok(Written { scope, op: id, root: None, first_event_seq: None, key_id: None })
    }

    /// `SetRole` of a member.
    pub async fn set_role(self: Arc<Self>, scope: Hash, member: PublicKey, role: Role) -> Result<Written, WriteError> {
        let d = self.draft(scope).await?;
        if d.draft.governance.role(&member).is_none() {
            return self.release(d, WriteError::NotFound("not a member of the scope".into())).await;
        }
        let plain = encode(&GovPayload { actions: vec![GovAction::SetRole { member, role }] });
        let (id, op, bytes) = self.compose(&d, &plain);
        self.submit(id, op, bytes, Some(plain)).await?;
        Ok(Written { scope, op: id, root: None, first_event_seq: None, key_id: None })
    }

    /// `[RemoveMember, RotateKey(new)]` in one op, then the new key to every
    /// remaining member (`member` = None: a rotation alone).
    pub async fn remove_or_rotate(self: Arc<Self>, scope: Hash, member: Option<PublicKey>) -> Result<Written, WriteError> {
        let d = self.draft(scope).await?;
        let mut actions = Vec::new();
        if let Some(m) = member {
            if d.draft.governance.role(&m).is_none() {
                return self.release(d, WriteError::NotFound("not a member of the scope".into())).await;
            }
            if m == self.identity.public_key {
                let e = WriteError::Conflict("the node cannot remove itself: it would lose the key it rotates".into());
                return self.release(d, e).await;
            }
            actions.push(GovAction::RemoveMember { member: m });
        }
        let key = random_key();
        actions.push(GovAction::RotateKey { key_id: key_id_of(&key) });
        // The key first: ops built on the rotation need it.
        let mut last = self.deliver(self.to_self(scope, &key)).await?;
        let plain = encode(&GovPayload { actions });
        let (id, op, bytes) = self.compose(&d, &plain);
        let done = self.submit(id, op, bytes, Some(plain)).await?;
        last = last.max(done.commit);
        let mut members: Vec<(&PublicKey, &[u8; 32])> = d.draft.governance.kem.iter().collect();
        members.sort_unstable();
        for (m, kem) in members {
            if Some(*m) != member && *m != self.identity.public_key && d.draft.governance.role(m).is_some() {
                last = last.max(self.deliver(self.seal(scope, &key, *m, kem)).await?);
            }
        }
        self.durable(last).await?;
        Ok(Written { scope, op: id, root: None, first_event_seq: None, key_id: Some(key_id_of(&key)) })
    }

    /// Accepts the scope's genesis whoever authored it, durably.
    pub async fn follow(self: Arc<Self>, scope: Hash) -> Result<Written, WriteError> {
        let (tx, rx) = oneshot::channel();
        self.direct(Work::Follow { scope, reply: tx })?;
        let commit = rx.await.map_err(|_| stopped())?;
        self.durable(commit).await?;
        Ok(Written { scope, op: ZERO, root: None, first_event_seq: None, key_id: None })
    }

    // ----- the steps --------------------------------------------------

    /// A request to the orderer itself (`PipelineState::direct`).
    fn direct(&self, w: Work) -> Result<(), WriteError> {
        self.pipeline.direct.try_send(w).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => WriteError::Unavailable("the node's queue of writes is full; retry".into()),
            crossbeam_channel::TrySendError::Disconnected(_) => stopped(),
        })
    }

    /// Sends a data draft's request to the orderer with the others made in
    /// the same round of the network runtime (`Coalescer`: the requests
    /// read in one wake-up), in one message, one wake-up of the orderer for
    /// all of them. A request the orderer's queue has no room for is
    /// answered busy.
    fn request_draft(&self, req: DraftRequest) {
        let direct = self.pipeline.direct.clone();
        self.drafts.push(req, move |reqs| {
            if let Err(crossbeam_channel::TrySendError::Full(Work::Draft(reqs))) = direct.try_send(Work::Draft(reqs)) {
                for r in reqs {
                    r.refuse(DraftRefused::Busy);
                }
            }
        });
    }

    /// A governance draft.
    async fn draft(&self, scope: Hash) -> Result<Drafted, WriteError> {
        let (tx, rx) = oneshot::channel();
        self.direct(Work::Draft(vec![DraftRequest::Governance { scope, reply: tx }]))?;
        Ok(rx.await.map_err(|_| stopped())??)
    }

    /// A draft not used (the request turned out to be wrong against the
    /// state it was drafted on): its turn goes back to the scope.
    async fn release(&self, d: Drafted, e: WriteError) -> Result<Written, WriteError> {
        let (tx, rx) = oneshot::channel();
        self.direct(Work::Undraft { scope: d.draft.scope, plane: d.draft.plane, reply: tx })?;
        let _ = rx.await;
        Err(e)
    }

    /// A governance op of draft `d` (`pipeline::author::compose`).
    fn compose(&self, d: &Drafted, plain: &[u8]) -> (Hash, Op, Vec<u8>) {
        crate::pipeline::compose(&self.signer, &self.pipeline.verified, self.identity.public_key, &d.draft, d.hlc, plain)
    }

    /// Signs `op` in place; its encoding and id (`pipeline::author::sign`).
    fn sign(&self, op: &mut Op) -> (Vec<u8>, Hash) {
        crate::pipeline::sign(&self.signer, &self.pipeline.verified, op)
    }

    fn seal(&self, scope: Hash, key: &[u8; 32], to: PublicKey, kem: &[u8; 32]) -> KeyDelivery {
        seal_key_delivery(scope, key, to, kem, &random_key())
    }

    fn to_self(&self, scope: Hash, key: &[u8; 32]) -> KeyDelivery {
        self.seal(scope, key, self.identity.public_key, &self.identity.kem_public)
    }

    /// Sends a delivery; the commit that keeps it.
    async fn deliver(&self, kd: KeyDelivery) -> Result<u64, WriteError> {
        let (tx, rx) = oneshot::channel();
        self.direct(Work::Deliver { kd, reply: Some(tx) })?;
        rx.await.map_err(|_| stopped())
    }

    /// Sends an op to be judged (`plain`: the payload it sealed, none for
    /// a genesis); what the receive path made of it, once durable if
    /// applied.
    async fn submit(&self, id: Hash, op: Op, bytes: Vec<u8>, plain: Option<Vec<u8>>) -> Result<Authored, WriteError> {
        let (tx, rx) = oneshot::channel();
        self.direct(Work::Own(vec![OwnOp { id, op, bytes, plain, reply: tx }]))?;
        self.judged(rx).await
    }

    /// What the receive path made of an authored op: the op applied and
    /// durable, or why not (its draft refused, the op dropped).
    async fn judged(&self, rx: oneshot::Receiver<Result<Authored, DraftRefused>>) -> Result<Authored, WriteError> {
        // Dropped unanswered: the store refused the commit, or the node
        // stops.
        let done = rx.await.map_err(|_| self.unanswered())??;
        match done.outcome {
            Outcome::Applied => Ok(done),
            Outcome::Dropped(reason) => Err(WriteError::Rejected(reason.name().to_string())),
            other => Err(WriteError::Rejected(format!("{other:?}"))),
        }
    }

    fn unanswered(&self) -> WriteError {
        if self.pipeline.refusing.load(std::sync::atomic::Ordering::Relaxed) {
            WriteError::Unavailable("the store refuses writes until the node restarts".into())
        } else {
            stopped()
        }
    }

    /// Waits until commit `number` is durable.
    async fn durable(&self, number: u64) -> Result<(), WriteError> {
        let mut rx = self.pipeline.durable.subscribe();
        let refusing = || self.pipeline.refusing.load(std::sync::atomic::Ordering::Relaxed);
        loop {
            if *rx.borrow_and_update() > number {
                return Ok(());
            }
            if refusing() {
                return Err(WriteError::Unavailable("the store refuses writes until the node restarts".into()));
            }
            // The committer skips commits while refusing: look again now
            // and then rather than wait for a change that never comes.
            if let Ok(Err(_)) = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await {
                return Err(stopped());
            }
        }
    }
}

fn stopped() -> WriteError {
    WriteError::Unavailable("the node is draining".into())
}

fn random_key() -> [u8; 32] {
    let mut k = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut k);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_of_one_round_are_handed_on_together() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let coalescer = Coalescer::new();
        let sent: Arc<std::sync::Mutex<Vec<Vec<u32>>>> = Arc::default();
        rt.block_on(async {
            // Ten tasks woken together (as the writes of requests read in
            // one wake-up), then one more after their batch went.
            let tasks: Vec<_> = (0..10u32)
                .map(|i| {
                    let (c, sent) = (coalescer.clone(), sent.clone());
                    tokio::spawn(async move { c.push(i, move |v| sent.lock().unwrap().push(v)) })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            while sent.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
            let s2 = sent.clone();
            coalescer.push(10, move |v| s2.lock().unwrap().push(v));
            while sent.lock().unwrap().len() < 2 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(*sent.lock().unwrap(), [(0..10).collect::<Vec<u32>>(), vec![10]]);
    }
}
