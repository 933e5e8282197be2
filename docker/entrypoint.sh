#!/bin/sh
# Container entrypoint. "worker": generate the tiny test model into $CHUNKGATE_WORKER_MODEL
# when it holds none (first start on an empty volume), then `chunkgate-worker serve`.
# "gateway": `chunkgate`. Further arguments go to the program; any other first argument is
# run as a command (for example `sh`).
set -eu
role=${1:-gateway}
[ $# -gt 0 ] && shift
case "$role" in
worker)
    model=${CHUNKGATE_WORKER_MODEL:?CHUNKGATE_WORKER_MODEL must name the model directory}
    if [ ! -f "$model/config.json" ] || [ ! -f "$model/model.safetensors" ]; then
        echo "chunkgate-entrypoint: no model in $model, generating the tiny test model" >&2
        # Generated beside the target and renamed into place: a container stopped halfway
        # never leaves a half-written model that a later start would load.
        tmp="$model.tmp.$$"
        rm -rf "$tmp"
        chunkgate-worker generate-model --out "$tmp"
        rm -rf "$model"
        mv "$tmp" "$model"
    fi
    exec chunkgate-worker serve "$@"
    ;;
gateway)
    exec chunkgate "$@"
    ;;
*)
    exec "$role" "$@"
    ;;
esac
