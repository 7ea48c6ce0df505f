#!/usr/bin/env bash
# The test command: every test, in the release profile (the one profile the
# node, the tests, the benchmarks and the tools share: RocksDB's C++ build
# takes ~17 minutes per profile on 2 cores). The tests and benches turn on
# the `testkit` feature themselves (the dev-dependency in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh
# The crash campaign's power-cut filesystem (its own workspace, see
# tools/powercut/Cargo.toml), beside the campaign's binary, and its tests.
cargo build --release --quiet --manifest-path tools/powercut/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}"
cargo test --release --quiet --manifest-path tools/powercut/Cargo.toml --target-dir "${CARGO_TARGET_DIR:-target}"
# The benchmarks are compiled, not run (`cargo bench` runs them): a change
# to an API they call must change them too, or this fails.
cargo build --release --quiet --benches
exec cargo test --release "$@"
