#!/usr/bin/env bash
# Runs docker/entrypoint.sh outside a container against model directories in a temporary
# directory: a mounted model must never be deleted or changed. A sharded checkpoint (index +
# shards) with a user's file beside it, and a directory with only a user's file, are left
# byte for byte and handed to the worker (which refuses these fakes); the tiny model is
# generated only into a missing or empty directory, and never when --model is passed.
# The entrypoint finds chunkgate-worker on the PATH: a wrapper there logs each call and runs
# the real binary (CHUNKGATE_WORKER_BIN, set by ctest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${CHUNKGATE_WORKER_BIN:?set CHUNKGATE_WORKER_BIN to the built chunkgate-worker}"
: "${CHUNKGATE_BIN:=/nonexistent}"
. "$root/tests/check_lib.sh"
check_start
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

bin="$tmp/bin"
mkdir -p "$bin"
cat >"$bin/chunkgate-worker" <<EOF
#!/bin/sh
echo "\$*" >>"$tmp/calls"
# serve: only show how the worker was started; the fake checkpoints are not loadable.
[ "\$1" = serve ] && exit 3
exec "$CHUNKGATE_WORKER_BIN" "\$@"
EOF
chmod +x "$bin/chunkgate-worker"

# A listing of every file under a directory with its size and hash.
tree_sum() { (cd "$1" && find . -mindepth 1 -printf '%y %p %s\n' | sort && find . -type f -print0 | sort -z | xargs -0r sha256sum); }

# run_entry NAME MODEL_DIR [ARGS]: runs the worker entrypoint; its status in $rc, log in $tmp/NAME.log.
run_entry() {
    local name=$1 model=$2; shift 2
    : >"$tmp/calls"
    rc=0
    env PATH="$bin:$PATH" CHUNKGATE_WORKER_MODEL="$model" \
        "$root/docker/entrypoint.sh" worker "$@" >"$tmp/$name.log" 2>&1 || rc=$?
}

echo "== a sharded checkpoint with a user's file beside it"
m="$tmp/models/sharded"
mkdir -p "$m"
printf '{"architectures":["LlamaForCausalLM"],"model_type":"llama"}' >"$m/config.json"
printf '{"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' \
    >"$m/model.safetensors.index.json"
head -c 4096 /dev/urandom >"$m/model-00001-of-00002.safetensors"
head -c 4096 /dev/urandom >"$m/model-00002-of-00002.safetensors"
echo "my notes" >"$m/NOTES.txt"
before=$(tree_sum "$m")
run_entry sharded "$m"
[ "$(tree_sum "$m")" = "$before" ] || fail "the sharded checkpoint was changed: $(diff <(echo "$before") <(tree_sum "$m") || true)"
grep -q '^generate-model' "$tmp/calls" && fail "the tiny model was generated over the sharded checkpoint"
grep -qx 'serve' "$tmp/calls" || fail "the worker was not started on the sharded checkpoint (calls: $(cat "$tmp/calls"))"
[ "$rc" = 3 ] || fail "the entrypoint's status is $rc, not the worker's (3)"
[ -z "$(ls -A "$tmp/models" | grep -v '^sharded$')" ] || fail "left beside the model: $(ls -A "$tmp/models")"

echo "== a directory holding only a user's file"
m="$tmp/models/user"
mkdir -p "$m"
echo "keep me" >"$m/.keep"
run_entry user "$m"
[ "$(ls -A "$m")" = ".keep" ] && [ "$(cat "$m/.keep")" = "keep me" ] || fail "the user's directory was changed: $(ls -A "$m")"
grep -q '^generate-model' "$tmp/calls" && fail "the tiny model was generated into a non-empty directory"

echo "== a regular file where the model should be"
m="$tmp/models/file"
echo "not a model" >"$m"
run_entry file "$m"
[ "$(cat "$m")" = "not a model" ] || fail "the file was replaced"
grep -q '^generate-model' "$tmp/calls" && fail "the tiny model was generated over a file"

echo "== --model passed: nothing is generated at CHUNKGATE_WORKER_MODEL"
m="$tmp/models/unused"
run_entry model-arg "$m" --model "$tmp/models/sharded"
[ -e "$m" ] && fail "generated at CHUNKGATE_WORKER_MODEL although --model was passed"
grep -qx "serve --model $tmp/models/sharded" "$tmp/calls" || fail "serve was not given --model (calls: $(cat "$tmp/calls"))"
run_entry model-arg-eq "$m" "--model=$tmp/models/sharded"
[ -e "$m" ] && fail "generated at CHUNKGATE_WORKER_MODEL although --model=DIR was passed"

echo "== a missing directory: the tiny model is generated"
m="$tmp/models/new/tiny"
run_entry missing "$m"
[ -f "$m/config.json" ] && [ -f "$m/model.safetensors" ] || fail "no model generated into a missing directory: $(cat "$tmp/missing.log")"
grep -qx 'serve' "$tmp/calls" || fail "the worker was not started after generating"
[ -z "$(ls -A "$m" | grep chunkgate-generate || true)" ] || fail "a temporary directory was left in the model"
sum=$(tree_sum "$m")
run_entry again "$m"
grep -q '^generate-model' "$tmp/calls" && fail "the model was generated a second time"
[ "$(tree_sum "$m")" = "$sum" ] || fail "the generated model changed on the second start"

echo "== an empty directory (an empty mount): the tiny model is generated into it"
m="$tmp/models/empty"
mkdir -p "$m"
ino=$(stat -c %i "$m")
run_entry empty "$m"
[ -f "$m/config.json" ] && [ -f "$m/model.safetensors" ] || fail "no model generated into an empty directory: $(cat "$tmp/empty.log")"
[ "$(stat -c %i "$m")" = "$ino" ] || fail "the empty directory was replaced, not filled (a mount point cannot be)"

echo "== the leftover of an interrupted generation is ours to clear"
m="$tmp/models/interrupted"
mkdir -p "$m/.chunkgate-generate.abc123"
echo partial >"$m/.chunkgate-generate.abc123/model.safetensors"
run_entry interrupted "$m"
[ -f "$m/config.json" ] && [ ! -e "$m/.chunkgate-generate.abc123" ] || fail "an interrupted generation was not redone: $(ls -A "$m")"

if [ "$fails" -gt 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "ok: mounted models are never touched; the tiny model goes only into a missing or empty directory"
