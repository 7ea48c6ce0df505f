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
