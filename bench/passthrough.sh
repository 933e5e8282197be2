#!/usr/bin/env bash
# Pass-through hot path: chunkgate next to nginx as a plain reverse proxy, in one run, against
# the same trivial backend (nginx answering a fixed completion), driven by wrk with 4 KiB
# prompts without a separator (nothing to key: the request is relayed), or with SEPARATORS=3
# the keyed path: "system # # doc # # doc # # question" in the same bytes, which chunkgate
# splits, keys, looks up in its index and records before it relays the prompt (no worker is
# registered, so every request falls back to the backend as no_worker). Reports for each of
# direct-to-backend, nginx proxy_pass and chunkgate: requests/s at 32 connections, and latency
# p50/p99 at 1 connection; then the ratios the goal is stated in: chunkgate / nginx
# throughput, and the p50 each proxy adds over the direct path.
#
#   bench/passthrough.sh [BUILD_DIR (default build)]
#
# Environment: SECONDS_PER (default 5, per run), CONNS (default 32), THREADS (wrk, default
# 2), PROMPT_BYTES (default 4096), SEPARATORS (default 0), ROUNDS (default 2: each measurement is taken this many
# times, alternating, and the best kept), LOG_LEVEL (chunkgate, default warn),
# IO_THREADS (chunkgate --io-threads and nginx worker_processes, default 2), GW_IO_THREADS
# (chunkgate's alone, default IO_THREADS: each proxy at its own best setting).
#
# Install step (the bench's own, not scripts/deps.sh): nginx-light and wrk from Debian,
# installed when missing and running as root.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SECONDS_PER=${SECONDS_PER:-5}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
PROMPT_BYTES=${PROMPT_BYTES:-4096}
SEPARATORS=${SEPARATORS:-0}
ROUNDS=${ROUNDS:-2}
LOG_LEVEL=${LOG_LEVEL:-warn}
IO_THREADS=${IO_THREADS:-2}
GW_IO_THREADS=${GW_IO_THREADS:-$IO_THREADS}

missing=0
command -v wrk >/dev/null || missing=1
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing=1
if [ "$missing" = 1 ]; then
    # shellcheck source=scripts/apt.sh
    . "$(dirname "$0")/../scripts/apt.sh"
    apt_install passthrough.sh nginx-light wrk
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
GW=$BUILD/server/chunkgate
[ -x "$GW" ] || { echo "passthrough.sh: $GW not built" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$tmp/backend/nginx.pid" ] && kill "$(cat "$tmp/backend/nginx.pid")" 2>/dev/null || true
    [ -f "$tmp/proxy/nginx.pid" ] && kill "$(cat "$tmp/proxy/nginx.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BPORT=$(free_port)
PPORT=$(free_port)

# nginx as the trivial backend: a fixed text_completion with usage, for any POST.
answer='{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1024,"completion_tokens":1,"total_tokens":1025}}'
nginx_conf() { # dir, workers, server block
    mkdir -p "$1"
    cat >"$1/nginx.conf" <<EOF
worker_processes $2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    client_max_body_size 16m;
    client_body_buffer_size 64k;
    keepalive_requests 1000000;
    $3
}
EOF
}
nginx_conf "$tmp/backend" 1 "server { listen 127.0.0.1:$BPORT; location / {
        default_type application/json; return 200 '$answer'; } }"
nginx_conf "$tmp/proxy" "$IO_THREADS" "upstream be { server 127.0.0.1:$BPORT; keepalive 64; }
    server { listen 127.0.0.1:$PPORT; location / { proxy_pass http://be;
        proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering on; } }"
"$NGINX" -p "$tmp/backend" -c "$tmp/backend/nginx.conf"
"$NGINX" -p "$tmp/proxy" -c "$tmp/proxy/nginx.conf"

GPORT=$(free_port)
"$GW" --listen "127.0.0.1:$GPORT" --backend "http://127.0.0.1:$BPORT" --data-dir "$tmp/gw-data" \
    --log-level "$LOG_LEVEL" --io-threads "$GW_IO_THREADS" >"$tmp/gw.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$GPORT/healthz" && break
    sleep 0.1
done
curl -s -o /dev/null "http://127.0.0.1:$GPORT/healthz" || { echo "chunkgate did not start:"; cat "$tmp/gw.log"; exit 1; }

# wrk script: POST a completion with a PROMPT_BYTES prompt, SEPARATORS "# #" spread evenly.
cat >"$tmp/post.lua" <<EOF
local prompt = string.rep("lorem ipsum dolor sit amet, ", math.ceil($PROMPT_BYTES / 28)):sub(1, $PROMPT_BYTES)
local parts, n = {}, $SEPARATORS + 1
local step = math.floor(#prompt / n)
for i = 1, n do parts[i] = prompt:sub((i - 1) * step + 1, i == n and #prompt or i * step) end
prompt = table.concat(parts, " # # ")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"m","max_tokens":1,"prompt":"' .. prompt .. '"}'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.1f %.1f %.1f %d %d\\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), summary.errors.status + summary.errors.connect
    + summary.errors.read + summary.errors.write + summary.errors.timeout, summary.requests))
end
EOF

# Checks each target answers 200 once.
for p in $BPORT $PPORT $GPORT; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
        -d '{"model":"m","prompt":"hi","max_tokens":1}' "http://127.0.0.1:$p/v1/completions")
    [ "$code" = 200 ] || { echo "port $p answered $code"; exit 1; }
done

# run NAME PORT CONNS THREADS -> "rps p50_us p99_us errors requests"
run() {
    wrk -t"$4" -c"$3" -d"${SECONDS_PER}s" --latency -s "$tmp/post.lua" \
        "http://127.0.0.1:$2/v1/completions" | sed -n 's/^RESULT //p'
}
declare -A rps p50 p99
names=(direct nginx chunkgate)
ports=($BPORT $PPORT $GPORT)
for round in $(seq 1 "$ROUNDS"); do
    for i in 0 1 2; do
        read -r r _ _ e n <<<"$(run "${names[$i]}" "${ports[$i]}" "$CONNS" "$THREADS")"
        [ "$e" = 0 ] || echo "warning: ${names[$i]} at $CONNS connections: $e errors of $n"
        k=${names[$i]}
        if [ -z "${rps[$k]:-}" ] || awk "BEGIN{exit !($r > ${rps[$k]})}"; then rps[$k]=$r; fi
        read -r _ a b e n <<<"$(run "${names[$i]}" "${ports[$i]}" 1 1)"
        [ "$e" = 0 ] || echo "warning: ${names[$i]} at 1 connection: $e errors of $n"
        if [ -z "${p50[$k]:-}" ] || awk "BEGIN{exit !($a < ${p50[$k]})}"; then p50[$k]=$a; p99[$k]=$b; fi
    done
done
cpus=$(nproc)
echo "machine: $cpus CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $PROMPT_BYTES-byte prompts, $SEPARATORS separators;" \
    "best of $ROUNDS x ${SECONDS_PER}s per figure; nginx $IO_THREADS workers, chunkgate $GW_IO_THREADS I/O threads"
printf '%-10s %14s %12s %12s\n' target "req/s@$CONNS" "p50@1 (us)" "p99@1 (us)"
for k in "${names[@]}"; do
    printf '%-10s %14.0f %12.0f %12.0f\n' "$k" "${rps[$k]}" "${p50[$k]}" "${p99[$k]}"
done
awk -v g="${rps[chunkgate]}" -v n="${rps[nginx]}" -v gp="${p50[chunkgate]}" -v np="${p50[nginx]}" \
    -v dp="${p50[direct]}" 'BEGIN {
    ga = gp - dp; na = np - dp;
    printf "chunkgate / nginx throughput at '"$CONNS"' connections: %.2f (goal >= 0.5)\n", g / n;
    printf "added p50 at 1 connection: chunkgate %.0f us, nginx %.0f us: %.1fx (goal <= 3x or <= 60 us)\n",
        ga, na, (na > 0 ? ga / na : 0) }'
