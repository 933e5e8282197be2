#!/usr/bin/env bash
# ctest demo_check: scripts/demo.sh runs on its own stack from this build and reports what it
# should. Its warm requests must hit, and on the committed trained model (models/chunkgate-rag)
# it must print its accuracy: the questions are fixed and decoding is greedy, so the count moves
# only when the model or the serving path changes. The model answers 5 of the 7 (two of its
# answers are wrong values from the documents: train/README.md); the check allows one less,
# for rounding that differs between instruction sets.
# Usage: demo_check.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(CG_BUILD="$1" CG_GATEWAY=http://127.0.0.1:9 bash "$root/scripts/demo.sh" 2>&1) || {
    echo "$out"
    echo "FAIL: scripts/demo.sh exited non-zero"
    exit 1
}
echo "$out"
rate=$(sed -n 's/^warm requests: hit rate \([0-9]*\)%.*/\1/p' <<<"$out")
[ -n "$rate" ] && [ "$rate" -ge 50 ] || { echo "FAIL: warm hit rate '${rate}' under 50%"; exit 1; }
if [ -f "$root/models/chunkgate-rag/config.json" ]; then
    read -r right asked < <(sed -n 's/^accuracy: \([0-9]*\) of \([0-9]*\) answers right$/\1 \2/p' <<<"$out")
    [ -n "${asked:-}" ] || { echo "FAIL: no accuracy line on the trained model"; exit 1; }
    [ "$right" -ge 4 ] || { echo "FAIL: $right of $asked answers right, under 4"; exit 1; }
fi
echo "demo_check: ok"
