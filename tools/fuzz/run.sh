#!/usr/bin/env bash
# Runs a dagfold fuzz target (or all three) for SECONDS each, on the stable
# toolchain. Usage:
#
#   tools/fuzz/run.sh TARGET SECONDS     TARGET: frame | payload | engine
#   tools/fuzz/run.sh all SECONDS
#   tools/fuzz/run.sh TARGET SECONDS -- EXTRA_LIBFUZZER_ARGS...
#
# cargo-fuzz is installed from crates.io if missing; the corpus is seeded from
# the shared vectors on first use (seed-corpus.sh). Crashers land in
# tools/fuzz/artifacts/TARGET/, the log in tools/fuzz/artifacts/TARGET.log.
#
# Stable needs no nightly flag with `--sanitizer none` (cargo-fuzz then passes
# only stable `-C` options: sancov, debug assertions, overflow checks).
# SANITIZER=address (or leak, ...) builds with -Zsanitizer, which stable only
# takes with RUSTC_BOOTSTRAP=1: set here for that case alone.
# Run it niced on a shared machine: `nice -n 19 tools/fuzz/run.sh all 60`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
targets=(frame payload engine)

usage() { echo "usage: $0 {frame|payload|engine|all} SECONDS [-- LIBFUZZER_ARGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
target="$1"; seconds="$2"; shift 2
[[ "$seconds" =~ ^[0-9]+$ ]] || usage
if [ "${1:-}" = "--" ]; then shift; fi
extra=("$@")

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi

sanitizer="${SANITIZER:-none}"
# 16 codegen units: a full fuzz build in ~4 min on 2 cores, for a few percent
# of execution speed.
build=(--fuzz-dir "$here" --sanitizer "$sanitizer" --codegen-units "${CODEGEN_UNITS:-16}")
if [ "$sanitizer" != none ]; then
    export RUSTC_BOOTSTRAP=1
    # Its own target dir, so switching back and forth rebuilds nothing.
    build+=(--target-dir "$here/target/sanitizer-$sanitizer")
fi

run_one() {
    local t="$1"
    if [ ! -d "$here/corpus/$t" ] || [ -z "$(ls -A "$here/corpus/$t" 2>/dev/null)" ]; then
        "$here/seed-corpus.sh"
    fi
    mkdir -p "$here/artifacts/$t"
    echo "run.sh: $t for ${seconds}s (sanitizer $sanitizer)" >&2
    # -close_fd_mask=2: the engine logs every divergence to stderr (SPEC §8),
    # which the mutated scopes cause by the thousand; libFuzzer keeps its own
    # report. Rerun a crasher without it to see the panic message.
    cargo fuzz run "${build[@]}" "$t" "$here/corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 -close_fd_mask=2 \
        "${extra[@]}" 2>&1 | tee "$here/artifacts/$t.log"
    return "${PIPESTATUS[0]}"
}

status=0
case "$target" in
    all) for t in "${targets[@]}"; do run_one "$t" || status=$?; done ;;
    frame|payload|engine) run_one "$target" || status=$? ;;
    *) usage ;;
esac
exit "$status"
