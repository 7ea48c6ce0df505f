#!/usr/bin/env bash
# Runs a node: data in ./dagfold-data, QUIC on 127.0.0.1:7400, HTTP status on
# 127.0.0.1:7401. Extra arguments go to `dagfold node` (see `--help`).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/ensure-deps.sh
exec cargo run --release --bin dagfold -- node "$@"
