#!/usr/bin/env bash
# tools/sync-redundancy.sh [KEEP] [OPS]: how many ops a sync serves a node
# that holds a prefix of a wide scope (8 writers, --view-lag 8), against how
# many it lacks. Node a imports the whole scope, node b its first KEEP
# frames (default 2500 of the OPS (default 3000) and 4 more); the two are then started
# as peers on loopback, and once b has applied what it lacked the script
# prints b's applied count, the ops a served by sync, b's duplicates, and
# the time a's sync walks took (reading the ops back from its store) and
# a's CPU since its start.
# Binaries from DAGFOLD_BENCH_BIN_DIR, else target/release (built with
# `cargo build --release --features testkit --bins`). docs/PERFORMANCE.md,
# "a sync walks from both ends".
set -euo pipefail
KEEP=${1:-2500}; OPS=${2:-3000}
BIN=${DAGFOLD_BENCH_BIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
W=$(mktemp -d); trap 'pkill -f "data-dir $W/" || true; rm -rf "$W"' EXIT
for n in a b; do mkdir -m 700 "$W/$n"; "$BIN/dagfold" identity --data-dir "$W/$n" > "$W/$n.json"; done
k() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$W/$1.json" "$2"; }
"$BIN/dagfold-loadgen" file --out "$W/all.bin" --public-key "$(k a public_key)" --kem-public-key "$(k a kem_public_key)" \
  --extra-recipient "$(k b public_key):$(k b kem_public_key)" --ops "$OPS" --writers 8 --view-lag 8 > /dev/null
python3 - "$W/all.bin" "$W/prefix.bin" "$KEEP" <<'PY'
import struct, sys
d = open(sys.argv[1], 'rb').read(); keep = int(sys.argv[3]); i = n = 0; out = bytearray()
while i < len(d):
    l = struct.unpack('<I', d[i:i + 4])[0]
    if n < keep: out += d[i:i + 4 + l]
    i += 4 + l; n += 1
open(sys.argv[2], 'wb').write(out)
open(sys.argv[2] + '.lacking', 'w').write(str(max(n - keep, 0)))
PY
"$BIN/dagfold" import --data-dir "$W/a" "$W/all.bin" > /dev/null
"$BIN/dagfold" import --data-dir "$W/b" "$W/prefix.bin" > /dev/null
port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
PA=$(port); PB=$(port); MA=$(port); MB=$(port)
"$BIN/dagfold" node --data-dir "$W/a" --listen 127.0.0.1:$PA --admin 127.0.0.1:$MA --peer "$(k b public_key)@127.0.0.1:$PB" > "$W/a.log" 2>&1 &
PIDA=$!
"$BIN/dagfold" node --data-dir "$W/b" --listen 127.0.0.1:$PB --admin 127.0.0.1:$MB --peer "$(k a public_key)@127.0.0.1:$PA" > "$W/b.log" 2>&1 &
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
lacking=$(cat "$W/prefix.bin.lacking")
for _ in $(seq 1 200); do
  sleep 0.2
  applied=$(metric $MB dagfold_applied_total)
  [ -n "$applied" ] && [ "${applied%.*}" -ge "$lacking" ] && break
done
sleep 1
echo "node b lacked $lacking, applied $(metric $MB dagfold_applied_total); node a served $(metric $MA dagfold_sync_ops_served_total) by sync; node b's duplicates $(metric $MB dagfold_engine_duplicates_total); node a's sync walks took $(metric $MA dagfold_sync_walk_seconds_sum) s, node a's CPU $(awk -v t="$(getconf CLK_TCK)" '{print ($14 + $15) / t}' /proc/$PIDA/stat) s"
