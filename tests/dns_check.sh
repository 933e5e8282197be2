#!/usr/bin/env bash
# A worker known by a name that moves to another address (a restarted container, a Kubernetes
# service, a failover) is used again within a health interval: the gateway re-resolves
# upstream names instead of keeping libcurl's default 60 s DNS cache (DESIGN §20).
# The gateway runs in its own mount namespace (unshare -m) with a test-owned file bind-mounted
# over /etc/hosts, so glibc's resolver behind libcurl really looks the name up; the file is
# rewritten in place (same inode) to move the name. The worker listens on 127.0.0.2, then on
# 127.0.0.3 (all of 127/8 is loopback). Exit 77 (ctest: skipped) when no mount namespace can
# be made (not root, no unshare).
# Environment (set by ctest): CHUNKGATE_BIN, CHUNKGATE_WORKER_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/check_lib.sh"
need_tool unshare util-linux
need_tool curl curl
check_start
name=cg-dns-check.invalid
interval_ms=1000
deadline_s=5 # the health interval, plus a probe, plus a request

cp /etc/hosts "$tmp/hosts"
echo "127.0.0.2 $name" >>"$tmp/hosts"
if ! unshare -m sh -c "mount --bind '$tmp/hosts' /etc/hosts && getent hosts $name" >/dev/null 2>&1; then
    echo "SKIPPED: cannot bind-mount a hosts file in a mount namespace (unshare -m needs root or CAP_SYS_ADMIN)"
    exit 77
fi
# Moves the name: rewritten in place, so the bind mount (an inode) sees it.
move_name() { # address
    { grep -v " $name\$" "$tmp/hosts"; echo "$1 $name"; } >"$tmp/hosts.new"
    cat "$tmp/hosts.new" >"$tmp/hosts"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wport=$(free_port)
gport=$(free_port)
"$CHUNKGATE_WORKER_BIN" generate-model --out "$tmp/model" >/dev/null

wpid=
start_worker() { # address
    "$CHUNKGATE_WORKER_BIN" serve --model "$tmp/model" --listen "$1:$wport" --data-dir "$tmp/worker" \
        --pool-mb 32 >>"$tmp/worker.log" 2>&1 &
    wpid=$!
    pids+=("$wpid")
    for _ in $(seq 1 200); do
        curl -fsS "http://$1:$wport/healthz" >/dev/null 2>&1 && return 0
        kill -0 "$wpid" 2>/dev/null || break
        sleep 0.05
    done
    echo "FAIL: the worker did not start on $1:$wport"
    cat "$tmp/worker.log"
    exit 1
}
start_worker 127.0.0.2
unshare -m sh -c "mount --bind '$tmp/hosts' /etc/hosts && exec '$CHUNKGATE_BIN' --listen 127.0.0.1:$gport \
    --worker http://$name:$wport --health-interval-ms $interval_ms --data-dir '$tmp/gateway'" \
    >"$tmp/gateway.log" 2>&1 &
pids+=($!)

# One completion through the gateway, answered by the worker (no fallback): 0 when it was.
served() {
    curl -fsS -m 5 "http://127.0.0.1:$gport/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"chunkgate-tiny","max_tokens":2,"temperature":0,"prompt":"Be brief. # # A moving worker. # # Where?"}' \
        -o "$tmp/answer.json" 2>/dev/null || return 1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["chunk_cache"]["fallback"] is False else 1)' \
        "$tmp/answer.json" 2>/dev/null
}
wait_served() { # seconds
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt "$end" ]; do
        served && return 0
        sleep 0.2
    done
    return 1
}

wait_served 15 || { echo "FAIL: the gateway never served through $name -> 127.0.0.2"; cat "$tmp/gateway.log"; exit 1; }
served && served || { echo "FAIL: requests through $name -> 127.0.0.2 do not succeed"; exit 1; }
echo "ok: served through $name -> 127.0.0.2:$wport"

# The worker restarts on another address and the name follows it.
kill "$wpid"
wait "$wpid" 2>/dev/null || true
start_worker 127.0.0.3
move_name 127.0.0.3
moved=$SECONDS
if ! wait_served "$deadline_s"; then
    echo "FAIL: not served within ${deadline_s}s after $name moved to 127.0.0.3 (health interval ${interval_ms} ms)"
    tail -n 20 "$tmp/gateway.log"
    exit 1
fi
echo "ok: served again $((SECONDS - moved))s after $name moved to 127.0.0.3"
