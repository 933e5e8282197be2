#!/usr/bin/env bash
# Installs dependencies (Debian 12, as root), builds, generates the tiny model if missing, and
# starts chunkgate-worker plus the chunkgate gateway in the foreground (Ctrl-C stops both).
# The gateway runs the main path: it assembles each "# #" request's KV on the worker and
# completes it there (no --backend: the chosen worker answers).
# Environment: CG_LISTEN (gateway, default 127.0.0.1:8080), CG_WORKER_LISTEN
# (default 127.0.0.1:8081), CG_DATA (default ./data), CG_POOL_MB (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
# libgomp's default spin-wait starves the OpenBLAS threads on small machines.
export OMP_WAIT_POLICY=passive
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target chunkgate chunkgate-worker

listen=${CG_LISTEN:-127.0.0.1:8080}
wlisten=${CG_WORKER_LISTEN:-127.0.0.1:8081}
data=${CG_DATA:-./data}
mkdir -p "$data/worker" "$data/gateway"
[ -f "$data/model/config.json" ] || build/worker/chunkgate-worker generate-model --out "$data/model"
model=$(sed -n 's/.*"model_id"[^"]*"\([^"]*\)".*/\1/p' "$data/model/config.json" | head -n1)
model=${model:-chunkgate-tiny}

build/worker/chunkgate-worker serve --model "$data/model" --listen "$wlisten" \
    --data-dir "$data/worker" --pool-mb "${CG_POOL_MB:-256}" &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
    curl -fs "http://$wlisten/healthz" >/dev/null && break
    kill -0 $worker 2>/dev/null || { echo "chunkgate-worker failed to start" >&2; exit 1; }
    sleep 0.1
done

cat <<EOT
chunkgate: http://$listen  (worker: http://$wlisten, model $model)
Try (the second request reuses both documents' KV: see usage.prompt_tokens_details.cached_tokens
and chunk_cache in the answer):
  curl -s http://$listen/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","prompt":"You are terse. # # Paris is the capital of France. # # Berlin is the capital of Germany. # # What is the capital of France?","max_tokens":16,"temperature":0}'
  curl -s http://$listen/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","prompt":"Answer in one word. # # Berlin is the capital of Germany. # # Paris is the capital of France. # # And of Germany?","max_tokens":16,"temperature":0}'
Workers: curl -s http://$listen/v1/workers     Demo: scripts/demo.sh
EOT
build/server/chunkgate --listen "$listen" --worker "http://$wlisten" --data-dir "$data/gateway"
