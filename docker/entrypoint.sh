#!/bin/sh
# Container entrypoint (the images' ENTRYPOINT; their CMD names the role).
#   worker [ARGS]   `chunkgate-worker serve ARGS`. Without --model in ARGS, the tiny test model
#                   is generated first into $CHUNKGATE_WORKER_MODEL when that directory is
#                   missing or empty (first start on an empty volume).
#   gateway [ARGS]  `chunkgate ARGS`.
#   anything else   run as a command: `chunkgate-worker generate-model --out DIR`, `sh`.
# The entrypoint never deletes or writes into a directory that holds anything: a mounted model
# (one file or sharded, with an index) is left exactly as it is, for the worker to load or to
# refuse with the reason. It only removes the temporary directory it made itself.
set -eu
role=${1:-gateway}
[ $# -gt 0 ] && shift

# True when directory $1 holds nothing but leftovers of an interrupted generation (ours).
only_ours() {
    for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        [ -e "$e" ] || [ -L "$e" ] || continue
        case "${e##*/}" in
        .chunkgate-generate.*) ;;
        *) return 1 ;;
        esac
    done
    return 0
}

# Generates the tiny model into directory $1, which is missing or holds only our leftovers.
# It is written into a temporary directory inside $1 and its files are moved up, config.json
# last: the worker loads nothing from a directory without config.json, so a container stopped
# halfway leaves no half-written model that a later start would load.
generate_into() {
    model=$1
    mkdir -p "$model"
    for e in "$model"/.chunkgate-generate.*; do
        [ -e "$e" ] && rm -rf "$e"
    done
    tmp=$(mktemp -d "$model/.chunkgate-generate.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    trap 'exit 143' TERM INT
    chunkgate-worker generate-model --out "$tmp" >&2
    for f in "$tmp"/* "$tmp"/.[!.]*; do
        [ -e "$f" ] || continue
        [ "${f##*/}" = config.json ] || mv "$f" "$model/"
    done
    mv "$tmp/config.json" "$model/config.json"
    rmdir "$tmp"
    trap - EXIT TERM INT
}

case "$role" in
worker)
    model_arg=no
    for a in "$@"; do
        case "$a" in --model | --model=*) model_arg=yes ;; esac
    done
    if [ "$model_arg" = no ]; then
        model=${CHUNKGATE_WORKER_MODEL:?CHUNKGATE_WORKER_MODEL or --model must name the model directory}
        if [ ! -e "$model" ] || { [ -d "$model" ] && only_ours "$model"; }; then
            echo "chunkgate-entrypoint: $model is missing or empty, generating the tiny test model" >&2
            generate_into "$model"
        fi
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
