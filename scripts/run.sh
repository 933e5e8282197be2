#!/usr/bin/env bash
# Installs dependencies (Debian 12, as root), builds, generates the tiny model if missing, and
# starts chunkgate-worker plus the chunkgate gateway in the foreground (Ctrl-C stops both).
# The gateway runs the main path: it assembles each "# #" request's KV on the worker and
# completes it there (no --backend: the chosen worker answers).
# Environment: CG_MODEL (a Hugging Face checkpoint directory: config.json, *.safetensors,
# tokenizer.json, tokenizer_config.json; default: models/chunkgate-rag, the small model trained
# by train/ to answer questions over documents, where it is committed, else the generated
# random-weight tiny model in CG_DATA/model; CG_MODEL=tiny: always the tiny model),
# CG_LISTEN (gateway, default 127.0.0.1:8080), CG_WORKER_LISTEN (default 127.0.0.1:8081),
# CG_DATA (default ./data), CG_POOL_MB (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target chunkgate chunkgate-worker

listen=${CG_LISTEN:-127.0.0.1:8080}
wlisten=${CG_WORKER_LISTEN:-127.0.0.1:8081}
data=${CG_DATA:-./data}
mkdir -p "$data/worker" "$data/gateway"
model_choice=${CG_MODEL:-}
if [ -z "$model_choice" ]; then
    model_choice=tiny
    [ -f models/chunkgate-rag/config.json ] && model_choice=models/chunkgate-rag
fi
case "$model_choice" in
tiny)
    mdir=$data/model
    [ -f "$mdir/config.json" ] || build/worker/chunkgate-worker generate-model --out "$mdir"
    ;;
*) mdir=$model_choice ;;
esac
[ -f "$mdir/config.json" ] || { echo "$mdir has no config.json" >&2; exit 1; }

build/worker/chunkgate-worker serve --model "$mdir" --listen "$wlisten" \
    --data-dir "$data/worker" --pool-mb "${CG_POOL_MB:-256}" &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 1200); do # a large checkpoint takes a while to map and check
    curl -fs "http://$wlisten/healthz" >/dev/null && break
    kill -0 $worker 2>/dev/null || { echo "chunkgate-worker failed to start" >&2; exit 1; }
    sleep 0.1
done
# the model id the worker serves (a real checkpoint's directory name, or chunkgate-tiny)
model=$(curl -fs "http://$wlisten/v1/info" | sed -n 's/.*"model":"\([^"]*\)".*/\1/p')
model=${model:-chunkgate-tiny}

case "$model" in
chunkgate-rag*) # the trained model: questions over documents about its fictional world
    cat <<EOT
chunkgate: http://$listen  (worker: http://$wlisten, model $model, trained to answer from documents)
Try (the second request reuses both documents' KV in the other order: see
usage.prompt_tokens_details.cached_tokens and chunk_cache in the answer):
  curl -s http://$listen/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","max_tokens":24,"temperature":0,"messages":[{"role":"system","content":"Answer the question from the documents."},{"role":"user","content":"Where does Fas Sambis live?"}],"documents":["Fas Sambis is a painter by profession. The home of Fas Sambis is in Kirstairtmouth.","Gairka Optics produces soap. The head office of Gairka Optics is in Thakbro."]}'
  curl -s http://$listen/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","max_tokens":24,"temperature":0,"messages":[{"role":"system","content":"Answer the question from the documents."},{"role":"user","content":"What does Gairka Optics make?"}],"documents":["Gairka Optics produces soap. The head office of Gairka Optics is in Thakbro.","Fas Sambis is a painter by profession. The home of Fas Sambis is in Kirstairtmouth."]}'
Workers: curl -s http://$listen/v1/workers     Demo: scripts/demo.sh
EOT
    ;;
*)
cat <<EOT
chunkgate: http://$listen  (worker: http://$wlisten, model $model)
Try (the second request reuses both documents' KV: see usage.prompt_tokens_details.cached_tokens
and chunk_cache in the answer):
  curl -s http://$listen/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","prompt":"You are terse. # # Paris is the capital of France. # # Berlin is the capital of Germany. # # What is the capital of France?","max_tokens":16,"temperature":0}'
  curl -s http://$listen/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","prompt":"Answer in one word. # # Berlin is the capital of Germany. # # Paris is the capital of France. # # And of Germany?","max_tokens":16,"temperature":0}'
  A chat with documents (rendered with the model's own chat template when it has one):
  curl -s http://$listen/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"$model","messages":[{"role":"user","content":"What is the capital of France?"}],"documents":["Paris is the capital of France.","Berlin is the capital of Germany."],"max_tokens":32}'
Workers: curl -s http://$listen/v1/workers     Demo: scripts/demo.sh
EOT
    ;;
esac
build/server/chunkgate --listen "$listen" --worker "http://$wlisten" --data-dir "$data/gateway"
