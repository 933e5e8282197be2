#!/bin/sh
# Container entrypoint (the images' ENTRYPOINT; their CMD names the role).
#   worker [ARGS]   `chunkgate-worker serve ARGS`. Without --model in ARGS, the tiny test model
#                   is generated first into $CHUNKGATE_WORKER_MODEL when that directory is
#                   missing or empty (first start on an empty volume).
#   gateway [ARGS]  `chunkgate ARGS`.
#   healthcheck     the images' HEALTHCHECK: GET /healthz on the address the running chunkgate
#                   or `chunkgate-worker serve` listens on, read from its own command line
#                   (--listen), else its environment, else the program's default port; a
#                   wildcard host is probed on loopback. CHUNKGATE_HEALTH_PID names the process
#                   outside a container (tests/docker_check.sh); in one, it is found in /proc.
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

# The pid of the serving chunkgate or chunkgate-worker in this PID namespace (the container).
find_server() {
    for d in /proc/[0-9]*; do
        set -f
        set -- $(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) ""
        set +f
        case "${1##*/}" in
        chunkgate) echo "${d#/proc/}"; return 0 ;;
        chunkgate-worker) [ "${2:-}" = serve ] && { echo "${d#/proc/}"; return 0; } ;;
        esac
    done
    return 1
}

healthcheck() {
    pid=${CHUNKGATE_HEALTH_PID:-}
    [ -n "$pid" ] || pid=$(find_server) || { echo "chunkgate-entrypoint: no chunkgate process" >&2; exit 1; }
    prog=$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)
    case "${prog##*/}" in
    chunkgate-worker) var=CHUNKGATE_WORKER_LISTEN listen=127.0.0.1:8090 ;;
    *) var=CHUNKGATE_LISTEN listen=127.0.0.1:8080 ;;
    esac
    # The program reads flags over the environment over its default; the last --listen wins.
    env_listen=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n "s/^$var=//p" | tail -n 1)
    [ -n "$env_listen" ] && listen=$env_listen
    prev=
    set -f
    for a in $(tr '\0' ' ' <"/proc/$pid/cmdline"); do
        [ "$prev" = --listen ] && listen=$a
        case "$a" in --listen=*) listen=${a#--listen=} ;; esac
        prev=$a
    done
    host=${listen%:*} port=${listen##*:}
    case "$host" in "" | 0.0.0.0 | "*") host=127.0.0.1 ;; "[::]" | "::") host="[::1]" ;; esac
    exec curl -fsS -m 3 -o /dev/null "http://$host:$port/healthz"
}

case "$role" in
healthcheck)
    healthcheck
    ;;
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
