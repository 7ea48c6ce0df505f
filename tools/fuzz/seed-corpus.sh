#!/usr/bin/env bash
# Seeds tools/fuzz/corpus/{frame,payload,engine} from the shared test vectors
# (../shared/vectors beside the repo, or $DAGFOLD_VECTORS), read now: the
# corpus is generated, gitignored, and never a copy of a vector file.
#
#   frame:   every scenario message (the content of one wire frame), every
#            primitive op as `Message::Op`, every key delivery as `Message::Key`
#   payload: every primitive op's plaintext (governance and data payloads,
#            the genesis among them), every cell of `roots` and `lww_order`
#   engine:  its input is structured (`src/engine_input.rs`), so vector bytes
#            mean nothing to it: a few fixed byte strings; libFuzzer grows it.
#
# Files are named by the SHA-1 of their content, as libFuzzer names its own,
# so seeding twice adds nothing. Usage: tools/fuzz/seed-corpus.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vectors="${DAGFOLD_VECTORS:-$here/../../../shared/vectors}"
if [ ! -f "$vectors/primitives.json" ]; then
    echo "seed-corpus.sh: no vectors at $vectors (set DAGFOLD_VECTORS)" >&2
    exit 1
fi
python3 - "$vectors" "$here/corpus" <<'PY'
import glob, hashlib, json, os, sys

vectors, corpus = sys.argv[1], sys.argv[2]
count = {}

def put(target, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, hashlib.sha1(data).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)
        count[target] = count.get(target, 0) + 1

prim = json.load(open(os.path.join(vectors, "primitives.json")))
for op in prim["ops"]:
    put("frame", b"\x00" + bytes.fromhex(op["op_hex"]))
    put("payload", bytes.fromhex(op["plaintext_hex"]))
for kd in prim["key_deliveries"]:
    put("frame", bytes.fromhex(kd["message_hex"]))
for kd in prim["key_deliveries_rejected"]:
    put("frame", b"\x01" + bytes.fromhex(kd["delivery_hex"]))
for g in prim["governance"]:
    for h in g["ops_hex"]:
        put("frame", b"\x00" + bytes.fromhex(h))
for r in prim["roots"]:
    for c in r["cells"]:
        put("payload", bytes.fromhex(c["cell_hex"]))
for o in prim["lww_order"]:
    put("payload", bytes.fromhex(o["a_cell_hex"]))
    put("payload", bytes.fromhex(o["b_cell_hex"]))
for path in sorted(glob.glob(os.path.join(vectors, "scenarios", "*.json"))):
    for m in json.load(open(path))["messages"]:
        put("frame", bytes.fromhex(m))

# engine: deterministic byte strings of a few lengths (SHA-256 in counter mode).
for n, length in enumerate([8, 32, 64, 128, 256, 512, 1024, 2048]):
    out = b""
    i = 0
    while len(out) < length:
        out += hashlib.sha256(b"dagfold-fuzz-engine-seed %d %d" % (n, i)).digest()
        i += 1
    put("engine", out[:length])

for t in ("frame", "payload", "engine"):
    total = len(os.listdir(os.path.join(corpus, t)))
    print(f"seed-corpus: {t}: {count.get(t, 0)} new, {total} in {os.path.join(corpus, t)}")
PY
