//! The node's own writes (API.md, "Model"), driven through the pipeline
//! without a transport: each authored op is received by the same path as
//! any other, answered once durable, refused with a clear reason when the
//! node cannot honour it, and applied by another node to the same state.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagfold::core::{Config, DraftRefused, Engine, Identity, Outcome};
use dagfold::node::author::{Author, WriteError};
use dagfold::pipeline::{Committed, Pipeline, PipelineConfig, PipelineState};
use dagfold::protocol::{encode, Action, Event, Hash, Message, Role, ZERO};
use dagfold::store::memory::MemStore;

struct Node {
    author: Arc<Author>,
    shared: Arc<PipelineState>,
    /// Every message the node kept, as frames, in commit order (what its
    /// peers would be sent).
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
    rt: tokio::runtime::Runtime,
    /// The ingest stays open while the node runs (the API's writes go to
    /// the orderer directly).
    _ingest: tokio::sync::mpsc::Sender<dagfold::pipeline::Work>,
    _pipeline: Pipeline,
}

fn start(id: &Identity) -> Node {
    start_on(id, MemStore::new(), 1, true)
}

fn start_on(id: &Identity, store: MemStore, projector_shards: usize, projector_split: bool) -> Node {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let sent: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let s2 = sent.clone();
    let on_durable = Box::new(move |c: Committed| {
        let mut s = s2.lock().unwrap();
        for (_, _, bytes, _) in c.applied {
            s.push([&[dagfold::protocol::MESSAGE_OP][..], &bytes].concat());
        }
        for kd in c.delivered {
            s.push(encode(&Message::Key(kd)));
        }
    });
    let cfg = PipelineConfig { tick_ms: 20, projector_shards, projector_split, ..Default::default() };
    let pipeline = Pipeline::start(cfg, Engine::new(Config::default(), id.clone()), store, rx, on_durable);
    let shared = pipeline.shared.clone();
    let author = Arc::new(Author::new(id.clone(), shared.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    Node { author, shared, sent, rt, _ingest: tx, _pipeline: pipeline }
}

impl Node {
    fn run<F, Fut>(&self, f: F) -> Result<dagfold::node::author::Written, WriteError>
    where
        F: FnOnce(Arc<Author>) -> Fut,
        Fut: std::future::Future<Output = Result<dagfold::node::author::Written, WriteError>> + Send + 'static,
    {
        let a = self.author.clone();
        self.rt.block_on(async move { a.spawn(f).await })
    }

    /// The scope's SPEC §11 status once `ok` holds of it.
    fn status_when(&self, scope: &Hash, ok: impl Fn(&dagfold::core::ScopeStatus) -> bool) -> dagfold::core::ScopeStatus {
        let t = Instant::now();
        loop {
            if let Some(s) = self.shared.status.read().unwrap().get(scope).filter(|s| ok(s)) {
                return s.clone();
            }
            assert!(t.elapsed() < Duration::from_secs(20), "status never reached: {:?}", self.shared.status.read().unwrap().get(scope));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What the node sent once it holds `ops` ops: a status is published
    /// before its commit's side effects are handed out (both after the
    /// commit is durable), so it may be seen first.
    fn sent_when(&self, ops: usize) -> Vec<Vec<u8>> {
        let t = Instant::now();
        loop {
            let sent = self.sent.lock().unwrap().clone();
            if sent.iter().filter(|f| f[0] == dagfold::protocol::MESSAGE_OP).count() >= ops {
                return sent;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "never sent {ops} ops");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn put(k: &str, v: &str) -> Action {
    Action::Put { entity: "notes".into(), key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() }
}

#[test]
fn authored_ops_apply_here_and_on_a_member_node_with_the_same_root() {
    let a = Identity::from_secrets([31; 32], [32; 32]);
    let b = Identity::from_secrets([33; 32], [34; 32]);
    let node = start(&a);
    let scope = node.run(|x| x.create_scope("team".into())).unwrap().scope;
    let w = node.run(move |x| x.write(scope, vec![put("a", "1")], vec![Event { kind: "hello".into(), data: b"x".to_vec() }])).unwrap();
    assert_eq!(w.first_event_seq, Some(1));
    let st = node.status_when(&scope, |s| s.applied == 2);
    assert_eq!(st.root, w.root.unwrap(), "the op carries the root it makes");
    assert_eq!(st.data_heads, vec![w.op]);

    // The second node becomes a writer: the keyring is delivered to it.
    node.run(move |x| x.add_member(scope, b.public_key, b.kem_public, Role::Writer)).unwrap();
    // Many writers at once: none waits on another's whole path.
    let writes: Vec<_> = (0..64)
        .map(|i| {
            let a = node.author.clone();
            node.rt.spawn(async move { a.spawn(move |x| x.write(scope, vec![put(&format!("k{i}"), "v")], vec![])).await })
        })
        .collect();
    for h in writes {
        node.rt.block_on(h).unwrap().expect("a concurrent write is applied");
    }
    // A rotation, then a write under the new key.
    let rot = node.run(move |x| x.remove_or_rotate(scope, None)).unwrap();
    assert!(rot.key_id.is_some());
    let last = node.run(move |x| x.write(scope, vec![put("a", "2")], vec![])).unwrap();
    let st = node.status_when(&scope, |s| s.data_heads == vec![last.op]);
    assert_eq!(st.root, last.root.unwrap());
    assert_eq!(st.applied, 1 + 1 + 1 + 64 + 1 + 1);

    // Written on one node, received and applied on another.
    let mut other = Engine::new(Config::default(), b.clone());
    let frames = node.sent_when(st.applied as usize);
    // The ops before the AddMember wait for the keyring delivered after it.
    for f in &frames {
        let o = other.handle_frame(f, 0);
        assert!(matches!(o, Outcome::Applied | Outcome::KeyAccepted | Outcome::NotYet(_)), "{o:?}");
    }
    let theirs = other.status(&scope).unwrap();
    assert_eq!((theirs.root, theirs.applied, theirs.data_key_waiting), (st.root, st.applied, 0));
}

/// Issue 23: with the fold split by scope into shards, each data draft's
/// root is still computed at its point of the commit by the shard of its
/// scope (here each shard in one thread; the other tests run the default,
/// a shard's cells and trees on two): concurrent writes in six scopes (two a shard), each op's root as its scope's
/// after it (a member node applying them all finds no divergence), the
/// statuses' roots those of the other node.
#[test]
fn authored_roots_are_right_with_the_fold_in_shards() {
    let a = Identity::from_secrets([35; 32], [36; 32]);
    let b = Identity::from_secrets([37; 32], [38; 32]);
    let node = start_on(&a, MemStore::new(), 3, false);
    // Two scopes in each shard (a scope's id is its genesis's: random).
    let mut scopes: Vec<Hash> = Vec::new();
    for i in 0..200 {
        let scope = node.run(move |x| x.create_scope(format!("team {i}"))).unwrap().scope;
        let shard = dagfold::core::projector::shard_of(&scope, 3);
        if scopes.iter().filter(|s| dagfold::core::projector::shard_of(s, 3) == shard).count() < 2 {
            node.run(move |x| x.add_member(scope, b.public_key, b.kem_public, Role::Writer)).unwrap();
            scopes.push(scope);
        }
        if scopes.len() == 6 {
            break;
        }
    }
    assert_eq!(scopes.len(), 6, "two scopes in each shard");
    let writes: Vec<_> = (0..96)
        .map(|i| {
            let (a, scope) = (node.author.clone(), scopes[i % 6]);
            node.rt.spawn(async move { a.spawn(move |x| x.write(scope, vec![put(&format!("k{}", i % 5), &format!("v{i}"))], vec![])).await })
        })
        .collect();
    for h in writes {
        node.rt.block_on(h).unwrap().expect("a concurrent write is applied");
    }
    let mut other = Engine::new(Config::default(), b.clone());
    let statuses: Vec<_> = scopes.iter().map(|s| node.status_when(s, |st| st.applied == 2 + 16)).collect();
    let applied: u64 = node.shared.status.read().unwrap().values().map(|s| s.applied).sum();
    for f in &node.sent_when(applied as usize) {
        let o = other.handle_frame(f, 0);
        assert!(matches!(o, Outcome::Applied | Outcome::KeyAccepted | Outcome::NotYet(_)), "{o:?}");
    }
    assert_eq!((other.stats.root_checks > 0, other.stats.divergences), (true, 0), "every authored root checked is right");
    for st in statuses {
        assert_eq!(other.status(&st.scope).map(|s| (s.root, s.applied)), Some((st.root, st.applied)));
    }
}

#[test]
fn requests_the_node_cannot_honour_are_refused_and_leave_nothing() {
    let a = Identity::from_secrets([41; 32], [42; 32]);
    let b = Identity::from_secrets([43; 32], [44; 32]);
    let node = start(&a);
    let unknown = [7u8; 32];
    match node.run(move |x| x.write(unknown, vec![put("a", "1")], vec![])) {
        Err(WriteError::Refused(DraftRefused::UnknownScope)) => {}
        other => panic!("{other:?}"),
    }
    let scope = node.run(|x| x.create_scope("team".into())).unwrap().scope;
    let big = Action::Put { entity: "e".into(), key: vec![1], value: vec![0; 262_144] };
    assert!(matches!(node.run(move |x| x.write(scope, vec![big], vec![])), Err(WriteError::TooLarge(_))));
    assert!(matches!(node.run(move |x| x.set_role(scope, b.public_key, Role::Admin)), Err(WriteError::NotFound(_))));
    assert!(matches!(node.run(move |x| x.remove_or_rotate(scope, Some(b.public_key))), Err(WriteError::NotFound(_))));
    assert!(matches!(node.run(move |x| x.remove_or_rotate(scope, Some(a.public_key))), Err(WriteError::Conflict(_))));
    node.run(move |x| x.add_member(scope, b.public_key, b.kem_public, Role::Reader)).unwrap();
    assert!(matches!(node.run(move |x| x.add_member(scope, b.public_key, b.kem_public, Role::Writer)), Err(WriteError::Conflict(_))));
    // Two removals at once: one is applied, the other finds it gone.
    let r1 = node.author.clone();
    let r2 = node.author.clone();
    let (x, y) = node.rt.block_on(async move {
        let f1 = r1.spawn(move |x| x.remove_or_rotate(scope, Some(b.public_key)));
        let f2 = r2.spawn(move |x| x.remove_or_rotate(scope, Some(b.public_key)));
        tokio::join!(f1, f2)
    });
    assert!(x.is_ok() != y.is_ok(), "exactly one removal: {x:?} {y:?}");
    assert!(matches!(x.err().or(y.err()), Some(WriteError::NotFound(_))));
    // The refusals made no op: genesis, AddMember, one removal.
    let st = node.status_when(&scope, |s| s.applied == 3);
    assert_eq!(st.members.len(), 1);
    assert_ne!(scope, ZERO);
}

/// A store that fails a write: the write whose commit it was is answered
/// "unavailable" (retryable, never "done"), and so is every write after it,
/// at once.
#[test]
fn writes_while_the_store_refuses_are_unavailable() {
    let a = Identity::from_secrets([51; 32], [52; 32]);
    let mut store = MemStore::new();
    // The scope's key and genesis (one or two commits), then failure.
    store.fail_after_writes = Some(2);
    let node = start_on(&a, store, 1, true);
    let scope = node.run(|x| x.create_scope("team".into())).unwrap().scope;
    let mut answers = Vec::new();
    for i in 0..3 {
        answers.push(node.run(move |x| x.write(scope, vec![put(&format!("k{i}"), "v")], vec![])));
    }
    let failed = answers.iter().position(|r| r.is_err()).expect("a write meets the failed store");
    assert!(answers[failed..].iter().all(|r| matches!(r, Err(WriteError::Unavailable(_)))), "{answers:?}");
    assert!(node.shared.refusing.load(std::sync::atomic::Ordering::SeqCst));
}
