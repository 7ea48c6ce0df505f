#!/usr/bin/env bash
# Installs what the build needs on a fresh machine and nothing else:
# RocksDB's bindings (bindgen) need libclang, and its C++ needs a compiler.
set -euo pipefail
have_libclang() {
  ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q 'libclang'
}
if ! have_libclang || ! command -v clang >/dev/null 2>&1; then
  echo "ensure-deps: installing libclang-dev and clang (needed by RocksDB's bindings)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-dev clang >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "ensure-deps: cargo is required (rustup)" >&2; exit 1; }
# A build from clean writes ~3 GB into target/ (the tests; ~4 GB with the
# benchmarks and tools); a link that runs out of disk
# dies of a Bus error in the linker, which says nothing of the disk. Said
# plainly up front instead (a warning: a warm target/ needs far less).
target="${CARGO_TARGET_DIR:-$(dirname "$0")/../target}"
mkdir -p "$target" 2>/dev/null || true
free_kb=$(df -Pk "$target" 2>/dev/null | awk 'NR == 2 { print $4 }' || true)
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((5 * 1024 * 1024)) ]; then
  echo "ensure-deps: warning: $((free_kb / 1024)) MB free for $target; a build from clean needs ~3–4 GB (a full disk shows as the linker's Bus error)" >&2
fi
