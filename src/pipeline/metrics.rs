//! The pipeline's own metrics: how old a batch is at each stage, the
//! orderer's waits, the verdict counts (kept per thread, added to the
//! registry once per orderer round) and the engine's counters.

use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};

use crate::clock::now_ms;
use crate::core::{Engine, Outcome, Stats};

/// How long after the batcher closed it a batch (for the projector and
/// the committer: the oldest batch of a commit) reached a stage: where the
/// end-to-end time goes (`dagfold_end_to_end_seconds` is the last step).
pub(super) fn note_age(at: &'static str, received: Instant) {
    let age = received.elapsed().as_secs_f64();
    AGES.with_borrow_mut(|a| match a.iter().find(|(k, _)| *k == at) {
        Some((_, h)) => h.record(age),
        None => {
            let h = histogram!("dagfold_batch_age_seconds", "at" => at);
            h.record(age);
            a.push((at, h));
        }
    });
}

thread_local! {
    /// `dagfold_batch_age_seconds` by stage: its handle looked up in the
    /// registry once per thread and stage, not per batch (a lookup hashes
    /// the key and its labels). A thread notes one or two stages.
    static AGES: std::cell::RefCell<Vec<(&'static str, metrics::Histogram)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Counts one message's verdict in `dagfold_received_total` (`VERDICTS`).
pub(super) fn count_verdict(outcome: Outcome) {
    let label = match outcome {
        Outcome::Malformed => "malformed",
        Outcome::BadSignature => "bad_signature",
        Outcome::Duplicate => "duplicate",
        Outcome::GenesisRefused => "genesis_refused",
        Outcome::Applied => "applied",
        Outcome::Dropped(r) => r.name(),
        Outcome::NotYet(crate::core::BufKind::Pending) => "pending",
        Outcome::NotYet(crate::core::BufKind::KeyWait) => "key_waiting",
        Outcome::NotYet(crate::core::BufKind::DataKeyWait) => "data_key_waiting",
        Outcome::KeyAccepted => "key_accepted",
        Outcome::KeyIgnored => "key_ignored",
        Outcome::StoreFailed => "store_failed",
    };
    VERDICTS.with_borrow_mut(|v| v.entry(label).or_insert_with(|| (counter!("dagfold_received_total", "verdict" => label), 0)).1 += 1);
}

thread_local! {
    /// `dagfold_received_total` by verdict: one registry lookup per label,
    /// not per op (it hashes the key and its labels: 6% of the orderer in a
    /// long cascade), and counted here, added to the registry's atomics
    /// once per orderer round (`flush_verdicts`).
    static VERDICTS: std::cell::RefCell<crate::core::IdMap<&'static str, (metrics::Counter, u64)>> =
        Default::default();
}

pub(super) fn flush_verdicts() {
    VERDICTS.with_borrow_mut(|v| {
        for (c, n) in v.values_mut() {
            if *n > 0 {
                c.increment(std::mem::take(n));
            }
        }
    });
}

/// `dagfold_orderer_waited_microseconds_total{on}`: how long the orderer
/// waited for input (`input`, idle time included) or for a free commit slot
/// (`commit`: the committer was behind). Microseconds, as the registry's
/// counters are integers.
pub(super) struct WaitCounter(metrics::Counter);

impl WaitCounter {
    pub(super) fn new(on: &'static str) -> WaitCounter {
        WaitCounter(counter!("dagfold_orderer_waited_microseconds_total", "on" => on))
    }

    pub(super) fn increment(&self, d: Duration) {
        self.0.increment(d.as_micros() as u64);
    }
}

/// How often the memory gauges (`dagfold_memory_bytes`) are taken at most:
/// their sums walk every scope (not every op), so about once a second,
/// idle or not, is their pace.
pub(super) const MEMORY_EVERY: Duration = Duration::from_secs(1);

/// The memory gauges' pace on one thread: at most once per `MEMORY_EVERY`,
/// and their walk at most 1% of the thread's time (after a walk of `d`, the
/// next waits `100 × d` at least: with a million scopes, say).
pub(super) struct Paced {
    last: Option<Instant>,
    every: Duration,
}

impl Default for Paced {
    fn default() -> Self {
        Paced { last: None, every: MEMORY_EVERY }
    }
}

impl Paced {
    /// Runs `walk` if it is due (the first time: yes).
    pub(super) fn run(&mut self, walk: impl FnOnce()) {
        let now = Instant::now();
        if self.last.is_some_and(|last| now.duration_since(last) < self.every) {
            return;
        }
        walk();
        self.every = MEMORY_EVERY.max(now.elapsed() * 100);
        self.last = Some(now);
    }
}

/// `dagfold_memory_bytes{part}` of the engine's parts (`EngineMemory`),
/// of the replica of its governance index the authorizer judges with, and
/// of the verifiers' caches (decompressed keys, signatures found valid).
pub(super) fn publish_engine_memory(engine: &Engine, shared: &super::PipelineState) {
    let m = engine.memory();
    let replica = shared.governance.read().expect("governance replica lock").heap_bytes();
    let parts = [
        ("op_index", m.op_index),
        ("scopes", m.scopes),
        ("governance", m.governance),
        ("governance_replica", replica),
        ("buffers", m.buffers),
        ("key_cache", crate::protocol::sig::key_cache_bytes()),
        ("verified_cache", shared.verified.heap_bytes()),
    ];
    for (part, bytes) in parts {
        gauge!("dagfold_memory_bytes", "part" => part).set(bytes as f64);
    }
}

/// `dagfold_memory_bytes{part, shard}` of a projector shard's cells or
/// trees (`FoldSide::heap_bytes`, `TreeSide::heap_bytes`).
pub(super) fn shard_memory_gauge(part: &'static str, shard: usize) -> metrics::Gauge {
    gauge!("dagfold_memory_bytes", "part" => part, "shard" => shard.to_string())
}

/// The engine's counters published as gauges with every commit: each
/// name, and its counter in `Stats`.
const ENGINE_COUNTERS: [(&str, fn(&Stats) -> u64); 11] = [
    ("dagfold_engine_applied_total", |s| s.applied),
    ("dagfold_engine_evicted_total", |s| s.evicted),
    ("dagfold_engine_key_timeouts_total", |s| s.key_timeouts),
    ("dagfold_engine_root_checks_total", |s| s.root_checks),
    ("dagfold_engine_cascade_released_total", |s| s.cascade_released),
    ("dagfold_engine_malformed_total", |s| s.malformed),
    ("dagfold_engine_bad_signature_total", |s| s.bad_signature),
    ("dagfold_engine_duplicates_total", |s| s.duplicates),
    ("dagfold_engine_cold_evicted_total", |s| s.cold_evicted),
    ("dagfold_engine_cold_reads_total", |s| s.cold_reads),
    ("dagfold_engine_cold_hits_total", |s| s.cold_hits),
];

/// The engine's gauges, their handles taken from the registry once: a
/// lookup hashes the key and its labels, and the orderer publishes all of
/// them with every commit (with the queues' gauges, 34 lookups a commit:
/// ~5% of the orderer's thread in `tools/bench api_writes`, whose commits
/// hold ~13 writes).
pub(super) struct EngineGauges {
    counters: [(metrics::Gauge, fn(&Stats) -> u64); ENGINE_COUNTERS.len()],
    /// In `Reason::ALL`'s order, which `Reason::code` is.
    dropped: [metrics::Gauge; crate::core::Reason::ALL.len()],
    genesis_refused: metrics::Gauge,
    /// The op index's entries and the cold filter's bytes; the governance
    /// cache's hits and misses; the oldest buffered op's age.
    sizes: [metrics::Gauge; 5],
}

impl EngineGauges {
    pub(super) fn new() -> EngineGauges {
        EngineGauges {
            counters: ENGINE_COUNTERS.map(|(name, of)| (gauge!(name), of)),
            dropped: crate::core::Reason::ALL.map(|r| gauge!("dagfold_engine_dropped_total", "reason" => r.name())),
            // API.md, "Which scopes a node holds": one reason so far, a
            // genesis whose author is neither the node, nor accepted, nor
            // of a followed scope.
            genesis_refused: gauge!("dagfold_engine_genesis_refused_total", "reason" => "author_not_accepted"),
            sizes: [
                "dagfold_engine_index_entries",
                "dagfold_engine_cold_filter_bytes",
                "dagfold_governance_cache_hits_total",
                "dagfold_governance_cache_misses_total",
                "dagfold_buffered_oldest_age_seconds",
            ]
            .map(|name| gauge!(name)),
        }
    }

    pub(super) fn publish(&self, engine: &mut Engine) {
        let s = &engine.stats;
        for (gauge, of) in &self.counters {
            gauge.set(of(s) as f64);
        }
        for (gauge, n) in self.dropped.iter().zip(s.dropped) {
            gauge.set(n as f64);
        }
        self.genesis_refused.set(s.genesis_refused as f64);
        let (indexed, filter_bytes) = engine.index_sizes();
        let (hits, misses) = engine.governance_cache_stats();
        let age_ms = engine.oldest_buffered_since_ms().map(|t| now_ms().saturating_sub(t)).unwrap_or(0);
        let sizes = [indexed as f64, filter_bytes as f64, hits as f64, misses as f64, age_ms as f64 / 1000.0];
        for (gauge, v) in self.sizes.iter().zip(sizes) {
            gauge.set(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's gauges, their handles taken once, publish each counter
    /// under its own name and reason as it is at each publish, not as it
    /// was when the handles were taken.
    #[test]
    fn the_engine_gauges_publish_each_counter_under_its_name_at_every_commit() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let gauges = metrics::with_local_recorder(&recorder, EngineGauges::new);
        let id = crate::core::Identity::from_secrets([31; 32], [32; 32]);
        let mut engine = Engine::new(crate::core::Config::default(), id);
        let value = |text: &str, series: &str| -> Option<f64> {
            text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).map(|v| v.parse().unwrap()))
        };
        gauges.publish(&mut engine);
        assert_eq!(value(&handle.render(), "dagfold_engine_applied_total"), Some(0.0));
        engine.stats.applied = 7;
        engine.stats.duplicates = 3;
        for (i, r) in crate::core::Reason::ALL.into_iter().enumerate() {
            engine.stats.dropped[r.code() as usize] = 100 + i as u64;
        }
        gauges.publish(&mut engine);
        let text = handle.render();
        assert_eq!(value(&text, "dagfold_engine_applied_total"), Some(7.0));
        assert_eq!(value(&text, "dagfold_engine_duplicates_total"), Some(3.0));
        for (i, r) in crate::core::Reason::ALL.into_iter().enumerate() {
            let series = format!("dagfold_engine_dropped_total{{reason=\"{}\"}}", r.name());
            assert_eq!(value(&text, &series), Some(100.0 + i as f64), "{series}");
        }
    }

    /// The memory gauges' walk runs at once, then not within
    /// `MEMORY_EVERY`; a walk that took `d` puts the next `100 × d` away.
    #[test]
    fn the_memory_walk_keeps_its_pace() {
        let mut paced = Paced::default();
        let mut walks = 0;
        paced.run(|| walks += 1);
        paced.run(|| walks += 1);
        assert_eq!(walks, 1, "not again within MEMORY_EVERY");
        std::thread::sleep(MEMORY_EVERY);
        // A slow walk: 15 ms or more, so the next waits 1.5 s at least,
        // and 100 times the walk's time at most.
        let t = Instant::now();
        paced.run(|| {
            walks += 1;
            std::thread::sleep(Duration::from_millis(15));
        });
        let walked = t.elapsed();
        assert_eq!(walks, 2);
        std::thread::sleep((t + MEMORY_EVERY + Duration::from_millis(100)).saturating_duration_since(Instant::now()));
        paced.run(|| walks += 1);
        assert_eq!(walks, 2, "a walk of 15 ms is 1% of 1.5 s");
        std::thread::sleep((t + walked * 100 + Duration::from_millis(50)).saturating_duration_since(Instant::now()));
        paced.run(|| walks += 1);
        assert_eq!(walks, 3);
    }
}
