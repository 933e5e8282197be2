#!/bin/sh
# Starts or stops a local Redis Cluster of N masters on loopback, for tests and for trying the
# worker's remote tier (DESIGN §16) by hand:
#
#   tests/redis_cluster.sh start DIR FIRST_PORT [MASTERS]   # default 3 masters
#   tests/redis_cluster.sh stop DIR
#
# Node i listens on 127.0.0.1:(FIRST_PORT+i) and its cluster bus on that port + 10000; its files
# are DIR/node-PORT/{redis.pid,redis.log,nodes.conf}. Nothing is persisted (--save '',
# --appendonly no). cluster-require-full-coverage is off, so the surviving masters keep
# serving their slots when one is killed. "start" returns once every node reports
# cluster_state:ok and prints the URL to give the worker:
#
#   redis+cluster://127.0.0.1:FIRST_PORT
#
# Needs redis-server and redis-cli (Debian: redis-server, redis-tools).
set -eu

usage() {
    echo "usage: $0 start DIR FIRST_PORT [MASTERS] | stop DIR" >&2
    exit 2
}

wait_for() { # wait_for SECONDS COMMAND...: retries COMMAND every 0.1 s
    limit=$(($1 * 10))
    shift
    i=0
    while ! "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        [ "$i" -ge "$limit" ] && return 1
        sleep 0.1
    done
}

cluster_ok() {
    redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

stop() {
    dir=$1
    for pidfile in "$dir"/node-*/redis.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill -CONT "$pid" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
case "$cmd" in
start)
    [ $# -ge 3 ] || usage
    first=$3
    masters=${4:-3}
    [ "$masters" -ge 3 ] || { echo "$0: a Redis Cluster needs at least 3 masters" >&2; exit 2; }
    command -v redis-server >/dev/null || { echo "$0: redis-server not found" >&2; exit 3; }
    command -v redis-cli >/dev/null || { echo "$0: redis-cli not found" >&2; exit 3; }
    mkdir -p "$dir"
    addrs=""
    i=0
    while [ "$i" -lt "$masters" ]; do
        port=$((first + i))
        nd="$dir/node-$port"
        mkdir -p "$nd"
        rm -f "$nd/nodes.conf"
        redis-server --port "$port" --bind 127.0.0.1 --dir "$nd" --daemonize yes \
            --pidfile "$nd/redis.pid" --logfile "$nd/redis.log" --save '' --appendonly no \
            --cluster-enabled yes --cluster-config-file "$nd/nodes.conf" \
            --cluster-node-timeout 3000 --cluster-require-full-coverage no
        addrs="$addrs 127.0.0.1:$port"
        i=$((i + 1))
    done
    for a in $addrs; do
        if ! wait_for 10 redis-cli -h 127.0.0.1 -p "${a##*:}" ping; then
            echo "$0: node $a did not start; see $dir/node-${a##*:}/redis.log" >&2
            stop "$dir"
            exit 1
        fi
    done
    # shellcheck disable=SC2086 # addrs is a list of words
    if ! redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1; then
        echo "$0: redis-cli --cluster create failed; see $dir/create.log" >&2
        stop "$dir"
        exit 1
    fi
    for a in $addrs; do
        if ! wait_for 30 cluster_ok "${a##*:}"; then
            echo "$0: node $a never reported cluster_state:ok" >&2
            stop "$dir"
            exit 1
        fi
    done
    echo "redis+cluster://127.0.0.1:$first"
    ;;
stop)
    stop "$dir"
    ;;
*)
    usage
    ;;
esac
