//! Signing, and signature verification throughput: SPEC §1 (`dagfold::protocol::sig`)
//! single and batched, against `ed25519_dalek` (cofactorless, not SPEC §1)
//! and `ed25519_consensus` (cofactored equation, ZIP-215 encodings).
//!
//! Every group reports elements = signatures, so criterion prints a
//! per-signature throughput that compares across batch sizes.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dagfold::protocol::sig::{public_key_from_seed, sign, verify, verify_batch};
use sha2::{Digest, Sha512};

type Item = ([u8; 32], [u8; 32], [u8; 64]);

/// `n` honest signatures by `n` distinct keys over distinct 32-byte messages.
fn items(n: usize) -> Vec<Item> {
    items_from(0, n)
}

/// `items` with the keys and messages numbered from `first`.
fn items_from(first: u64, n: usize) -> Vec<Item> {
    (first..first + n as u64)
        .map(|i| {
            let h = Sha512::digest(i.to_le_bytes());
            let seed: [u8; 32] = h[..32].try_into().unwrap();
            let msg: [u8; 32] = h[32..].try_into().unwrap();
            (public_key_from_seed(&seed), msg, sign(&seed, &msg))
        })
        .collect()
}

/// `n` honest signatures by four keys, in turn, over distinct messages: the
/// node's batches in the benchmark workloads (four writers), whose terms of
/// one key `dagfold::protocol::sig` merges.
fn items_four_keys(n: usize) -> Vec<Item> {
    items_of_keys(4, false, n)
}

/// `n` honest signatures by 1,000 keys, each signature's key drawn at
/// random (a fixed sequence): `tools/bench authors_1k`, whose writers take
/// turns at random, so that a batch of 512 holds ~400 distinct keys, one of
/// 2,048 ~870.
fn items_1k_keys(n: usize) -> Vec<Item> {
    items_of_keys(1000, true, n)
}

/// `n` signatures by `keys` keys, in turn or drawn at random.
fn items_of_keys(keys: u64, random: bool, n: usize) -> Vec<Item> {
    let seeds: Vec<[u8; 32]> = (0..keys).map(|k| Sha512::digest(k.to_be_bytes())[..32].try_into().unwrap()).collect();
    (0..n as u64)
        .map(|i| {
            let k = if random { u64::from_le_bytes(Sha512::digest(i.to_be_bytes())[32..40].try_into().unwrap()) } else { i };
            let seed = seeds[(k % keys) as usize];
            let msg: [u8; 32] = Sha512::digest(i.to_le_bytes())[32..].try_into().unwrap();
            (public_key_from_seed(&seed), msg, sign(&seed, &msg))
        })
        .collect()
}

fn single(c: &mut Criterion) {
    let (pk, msg, sig) = items(1)[0];
    let mut g = c.benchmark_group("single");
    g.throughput(Throughput::Elements(1));
    g.bench_function("dagfold_verify", |b| {
        b.iter(|| assert!(verify(black_box(&pk), black_box(&msg), black_box(&sig))))
    });
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk).unwrap();
    let dsig = ed25519_dalek::Signature::from_bytes(&sig);
    g.bench_function("ed25519_dalek_verify_strict", |b| {
        b.iter(|| {
            assert!(black_box(&vk)
                .verify_strict(black_box(&msg), black_box(&dsig))
                .is_ok())
        })
    });
    g.finish();
}

/// Signing op ids with the node's key (`sig::Signer`): what the node pays
/// per op it authors (`pipeline::author::Composer`), one at a time and as a
/// commit's ops together (`sign_many`; ~14 ops a commit under
/// `tools/bench api_writes`).
fn signing(c: &mut Criterion) {
    let seed = [9u8; 32];
    let signer = dagfold::protocol::sig::Signer::new(&seed);
    let msg = [7u8; 32];
    let mut g = c.benchmark_group("sign");
    g.throughput(Throughput::Elements(1));
    g.bench_function("dagfold_signer", |b| b.iter(|| signer.sign(black_box(&msg))));
    for n in [1usize, 8, 14, 64] {
        let messages: Vec<[u8; 32]> = (0..n).map(|i| [i as u8; 32]).collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("sign_many", n), &messages, |b, m| b.iter(|| signer.sign_many(black_box(m))));
    }
    g.finish();
}

fn batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch");
    // Keys never seen before, a new batch each time (made outside the
    // timing): every key decompressed, as dalek's below. Then the same
    // batch again and again: its keys from the verifying thread's cache,
    // as a group's authors' keys are in the node.
    for n in [16, 64, 256] {
        let mut next = 1u64 << 32;
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("dagfold_verify_batch_new_keys", n), |b| {
            b.iter_batched(
                || {
                    next += n as u64;
                    items_from(next, n)
                },
                |batch| assert!(verify_batch(black_box(&batch)).iter().all(|&v| v)),
                criterion::BatchSize::PerIteration,
            )
        });
    }
    own_batches(&mut g, &[16, 64, 256], items);

    let n = 64;
    let batch = items(n);
    g.throughput(Throughput::Elements(n as u64));

    let messages: Vec<&[u8]> = batch.iter().map(|(_, m, _)| &m[..]).collect();
    let signatures: Vec<ed25519_dalek::Signature> = batch
        .iter()
        .map(|(_, _, s)| ed25519_dalek::Signature::from_bytes(s))
        .collect();
    let keys: Vec<ed25519_dalek::VerifyingKey> = batch
        .iter()
        .map(|(pk, _, _)| ed25519_dalek::VerifyingKey::from_bytes(pk).unwrap())
        .collect();
    g.bench_function(BenchmarkId::new("ed25519_dalek_verify_batch", n), |b| {
        b.iter(|| {
            assert!(ed25519_dalek::verify_batch(
                black_box(&messages),
                black_box(&signatures),
                black_box(&keys)
            )
            .is_ok())
        })
    });

    // The same with the keys parsed (decompressed) inside the timed closure,
    // as `dagfold_verify_batch` parses them: the like-for-like comparison.
    g.bench_function(
        BenchmarkId::new("ed25519_dalek_verify_batch_parsing_keys", n),
        |b| {
            b.iter(|| {
                let keys: Vec<ed25519_dalek::VerifyingKey> = black_box(&batch)
                    .iter()
                    .map(|(pk, _, _)| ed25519_dalek::VerifyingKey::from_bytes(pk).unwrap())
                    .collect();
                assert!(ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok())
            })
        },
    );

    // Queueing (key parsing, SHA-512 of k) is part of the cost, as it is for
    // the dagfold batch, so it is inside the timed closure.
    g.bench_function(BenchmarkId::new("ed25519_consensus_batch", n), |b| {
        b.iter(|| {
            let mut verifier = ed25519_consensus::batch::Verifier::new();
            for (pk, msg, sig) in black_box(&batch) {
                let vk = ed25519_consensus::VerificationKeyBytes::from(*pk);
                verifier.queue((vk, ed25519_consensus::Signature::from(*sig), &msg[..]));
            }
            assert!(verifier.verify(rand::thread_rng()).is_ok())
        })
    });
    g.finish();
}

/// Batches as the node makes them under load (four writers): per signature
/// by batch size, for `PipelineConfig::verify_batch_max`.
fn batch_four_keys(c: &mut Criterion) {
    let mut four = c.benchmark_group("batch_four_keys");
    own_batches(&mut four, &[64, 256, 512, 1024], items_four_keys);
    four.finish();
}

/// Batches of a group of 1,000 writers (`tools/bench authors_1k`): the
/// terms of a batch's distinct keys are most of its sum at 512, fewer per
/// signature as the batch grows.
fn batch_1k_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_1k_keys");
    own_batches(&mut g, &[512, 1024, 2048, 4096], items_1k_keys);
    g.finish();
}

/// `dagfold::protocol::sig::verify_batch` of batches of each size, each
/// verified again and again (so its keys are in the node's key cache).
fn own_batches(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, sizes: &[usize], make: fn(usize) -> Vec<Item>) {
    for &n in sizes {
        let batch = make(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("dagfold_verify_batch", n), &batch, |b, batch| {
            b.iter(|| assert!(verify_batch(black_box(batch)).iter().all(|&v| v)))
        });
    }
}

/// Decompressing the `R` of 64 signatures: dalek one at a time, and
/// `dagfold::protocol::edwards_lanes` (eight at a time where the CPU has IFMA).
fn decompress(c: &mut Criterion) {
    use curve25519_dalek::edwards::CompressedEdwardsY;
    let rs: Vec<[u8; 32]> = items(64).iter().map(|(_, _, sig)| sig[..32].try_into().unwrap()).collect();
    let mut g = c.benchmark_group("decompress R");
    g.throughput(Throughput::Elements(rs.len() as u64));
    g.bench_function("curve25519_dalek", |b| {
        b.iter(|| assert!(black_box(&rs).iter().all(|r| CompressedEdwardsY(*r).decompress().is_some())))
    });
    let name = if dagfold::protocol::edwards_lanes::accelerated() { "dagfold (IFMA)" } else { "dagfold (dalek fallback)" };
    g.bench_function(name, |b| {
        b.iter(|| assert!(dagfold::protocol::edwards_lanes::decompress_many(black_box(&rs)).iter().all(|p| p.is_some())))
    });
    g.finish();
}

/// Opening key deliveries: X25519 of the node's KEM secret with 8 and 32
/// ephemeral keys, x25519-dalek one at a time, and
/// `edwards_lanes::x25519_many` (eight at a time where the CPU has IFMA).
fn x25519(c: &mut Criterion) {
    let secret = [0x42u8; 32];
    let mut g = c.benchmark_group("x25519");
    for n in [8usize, 32] {
        let us: Vec<[u8; 32]> = (0..n).map(|i| dagfold::protocol::crypto::x25519_public(&[i as u8 + 1; 32])).collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("x25519_dalek", n), |b| {
            b.iter(|| black_box(&us).iter().map(|u| x25519_dalek::x25519(secret, *u)).collect::<Vec<_>>())
        });
        g.bench_function(BenchmarkId::new("dagfold_x25519_many", n), |b| {
            b.iter(|| dagfold::protocol::edwards_lanes::x25519_many(&secret, black_box(&us)))
        });
    }
    g.finish();
}

/// Opening a data payload (SPEC §4's ChaCha20-Poly1305, with its
/// associated data): RustCrypto's `chacha20poly1305`, and the node's
/// `open_payload` (ring's). A benchmark op's payload (two actions of
/// 16-byte values) is ~90 bytes.
fn aead(c: &mut Criterion) {
    use chacha20poly1305::aead::{Aead, KeyInit, Payload};
    use dagfold::protocol::crypto::{open_payload, payload_aad, seal_payload};
    let mut g = c.benchmark_group("aead open");
    let (key, nonce, scope, plane) = ([7u8; 32], [9u8; 12], [3u8; 32], 1u8);
    let aad = payload_aad(&scope, plane);
    for n in [90usize, 300, 1200] {
        let plain: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let sealed = seal_payload(&key, &nonce, &scope, plane, &plain);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("chacha20poly1305", n), &sealed, |b, sealed| {
            b.iter(|| {
                let c = chacha20poly1305::ChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(black_box(&key)));
                c.decrypt(chacha20poly1305::Nonce::from_slice(&nonce), Payload { msg: black_box(sealed), aad: &aad }).unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("dagfold_open_payload (ring)", n), &sealed, |b, sealed| {
            b.iter(|| open_payload(black_box(&key), &nonce, &scope, plane, black_box(sealed)).unwrap())
        });
    }
    g.finish();
}

/// The challenges of a batch's signatures: SHA-512 of 512 messages of 96
/// bytes (`R || A || M`), one at a time with sha2 and eight at a time with
/// `sha512_lanes`.
fn sha512(c: &mut Criterion) {
    use dagfold::protocol::sha512_lanes::{digests, Block};
    let mut g = c.benchmark_group("sha512 96 B");
    let messages: Vec<[u8; 96]> = (0..512u32).map(|i| std::array::from_fn(|j| (i as usize * 7 + j) as u8)).collect();
    g.throughput(Throughput::Elements(messages.len() as u64));
    g.bench_function("sha2", |b| {
        b.iter(|| messages.iter().map(|m| <[u8; 64]>::from(Sha512::digest(black_box(m)))).collect::<Vec<_>>())
    });
    g.bench_function("sha512_lanes", |b| {
        b.iter(|| {
            let blocks: Vec<Block> = messages.iter().map(|m| Block::of(&[black_box(m)]).unwrap()).collect();
            let mut out = Vec::with_capacity(blocks.len());
            digests(&blocks, &mut out);
            out
        })
    });
    g.finish();
}

criterion_group!(benches, single, signing, batch, batch_four_keys, batch_1k_keys, decompress, x25519, aead, sha512);
criterion_main!(benches);

