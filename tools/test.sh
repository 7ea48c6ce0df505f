#!/usr/bin/env bash
# The test command: every test, in the release profile (the one profile the
# node, the tests, the benchmarks and the tools share: RocksDB's C++ build
# takes ~17 minutes per profile on 2 cores). The tests and benches turn on
# the `testkit` feature themselves (the dev-dependency in Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh
exec cargo test --release "$@"
