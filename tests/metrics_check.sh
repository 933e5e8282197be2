#!/usr/bin/env bash
# The /metrics of a real chunkgate and chunkgate-worker, after real traffic (main path cold
# and warm, a stream, a chat, a client error), pass `promtool check metrics`, follow the
# naming rules (counters _total, histograms _seconds with sensible buckets or another unit:
# _bytes, _nats, _ratio; byte gauges _bytes), count the traffic, and export every series the Grafana dashboard queries; every
# dashboard query is valid PromQL (`promtool check rules`).
# Exit 77 (ctest: skipped) when promtool is not installed (Debian package prometheus).
# Environment (set by ctest): CHUNKGATE_BIN, CHUNKGATE_WORKER_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tests/check_lib.sh"
need_tool promtool prometheus
check_start
export OMP_WAIT_POLICY=passive
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Starts a program with its log in $tmp/NAME.log; sets $port from its "listening on" line.
start() { # name, command...
    local name=$1; shift
    # created here: the child opens it only once it runs, and sed below may come first
    : >"$tmp/$name.log"
    "$@" >>"$tmp/$name.log" 2>&1 &
    pids+=($!)
    port=""
    for _ in $(seq 1 300); do
        port=$(sed -n 's/.*"msg":"listening on 127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$tmp/$name.log" | head -n1)
        [ -n "$port" ] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    echo "FAIL: $name did not start"; cat "$tmp/$name.log"; exit 1
}

"$CHUNKGATE_WORKER_BIN" generate-model --out "$tmp/model" >/dev/null
start worker "$CHUNKGATE_WORKER_BIN" serve --model "$tmp/model" --listen 127.0.0.1:0 \
    --data-dir "$tmp/worker" --pool-mb 32 --disk-mb 16
wurl="http://127.0.0.1:$port"
start gateway "$CHUNKGATE_BIN" --listen 127.0.0.1:0 --worker "$wurl" --data-dir "$tmp/gateway"
gurl="http://127.0.0.1:$port"

post() { # path, json → body on stdout
    curl -sS -H 'Content-Type: application/json' -d "$2" "$gurl$1"
}
D1="Metrics doc one: the bakery sells rye on Tuesdays and spelt on Fridays."
D2="Metrics doc two: ovens are cleaned every second Sunday before dawn."
post /v1/completions "{\"model\":\"chunkgate-tiny\",\"prompt\":\"Sys A # # $D1 # # $D2 # # When is rye sold?\",\"max_tokens\":3}" >/dev/null
warm=$(post /v1/completions "{\"model\":\"chunkgate-tiny\",\"prompt\":\"Sys B # # $D2 # # $D1 # # Ovens?\",\"max_tokens\":3}")
case "$warm" in *'"hit":true'*) ;; *) fail "the warm request reported no hit: $warm" ;; esac
post /v1/completions "{\"model\":\"chunkgate-tiny\",\"prompt\":\"Sys A # # $D1 # # Spelt?\",\"max_tokens\":3,\"stream\":true}" >/dev/null
post /v1/chat/completions "{\"model\":\"chunkgate-tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"Bread?\"}],\"documents\":[\"$D1\"],\"max_tokens\":2}" >/dev/null
# a quality probe: the canary's families appear on the worker
post /v1/completions "{\"model\":\"chunkgate-tiny\",\"prompt\":\"Sys B # # $D1 # # $D2 # # Rye?\",\"max_tokens\":3,\"quality_probe\":true,\"recompute_ratio\":0.15}" >/dev/null
post /v1/completions '{"model": 1}' >/dev/null
curl -sS "$gurl/v1/nope" >/dev/null
curl -sS "$gurl/metrics" >"$tmp/gateway.prom"
curl -sS "$wurl/metrics" >"$tmp/worker.prom"

for m in gateway worker; do
    echo "== promtool check metrics: $m"
    if ! out=$(promtool check metrics <"$tmp/$m.prom" 2>&1); then
        fail "$m /metrics: promtool check metrics: $out"
    fi
done

# Name, type and samples of every family, for the naming checks below.
families() { sed -n 's/^# TYPE \([^ ]*\) \([^ ]*\)$/\1 \2/p' "$1"; }
value() { # file, exact series (name{labels} or name) → its value, empty when absent
    awk -v s="$2" '$1 == s {print $2}' "$1"
}

echo "== naming"
for m in gateway worker; do
    prefix=chunkgate_
    [ "$m" = worker ] && prefix=chunkgate_worker_
    n=0
    while read -r name type; do
        n=$((n + 1))
        [[ $name == "$prefix"* ]] || fail "$m: $name lacks the prefix $prefix"
        grep -q "^# HELP $name " "$tmp/$m.prom" || fail "$m: $name has no HELP"
        case $type in
        counter) [[ $name == *_total ]] || fail "$m: counter $name does not end in _total" ;;
        histogram) [[ $name == *_seconds || $name == *_bytes || $name == *_nats || $name == *_ratio ]] ||
            fail "$m: histogram $name is not in _seconds, _bytes, _nats or _ratio" ;;
        gauge) [[ $name == *_total ]] && fail "$m: gauge $name ends in _total" ;;
        *) fail "$m: $name has type $type (only counter, gauge, histogram are used)" ;;
        esac
        # A family that measures bytes says so in its unit suffix.
        if [[ $name == *bytes* && $name != *_bytes && $name != *_bytes_total ]]; then
            fail "$m: $name measures bytes but does not end in _bytes or _bytes_total"
        fi
    done < <(families "$tmp/$m.prom")
    [ "$n" -ge 10 ] || fail "$m: only $n metric families"
done

# TTFT and request duration: buckets from milliseconds to tens of seconds, cumulative,
# +Inf equal to _count.
check_buckets() { # file, histogram name, label filter (regex, may be empty)
    local f=$1 h=$2 filt=$3
    local les
    les=$(grep "^${h}_bucket{" "$f" | grep -E "$filt" | sed -n 's/.*le="\([^"]*\)".*/\1/p' | sort -u -g)
    local finite
    finite=$(grep -v '+Inf' <<<"$les" || true)
    local count lo hi
    count=$(wc -l <<<"$finite")
    lo=$(head -n1 <<<"$finite")
    hi=$(tail -n1 <<<"$finite")
    [ "$count" -ge 8 ] || fail "$h: $count buckets"
    awk -v lo="$lo" 'BEGIN {exit !(lo <= 0.005)}' || fail "$h: smallest bucket $lo s (> 5 ms)"
    awk -v hi="$hi" 'BEGIN {exit !(hi >= 30)}' || fail "$h: largest bucket $hi s (< 30 s)"
    grep -q "^${h}_bucket{.*le=\"+Inf\"" "$f" || fail "$h: no +Inf bucket"
    # Cumulative counts never decrease along the buckets of one series.
    grep "^${h}_bucket{" "$f" | grep -E "$filt" | awk '
        { key = $1; sub(/,?le="[^"]*"/, "", key); if (key in last && $2 + 0 < last[key]) bad = 1; last[key] = $2 + 0 }
        END { exit bad }' || fail "$h: bucket counts decrease"
}
check_buckets "$tmp/gateway.prom" chunkgate_ttft_seconds ""
check_buckets "$tmp/gateway.prom" chunkgate_request_duration_seconds 'route="completions"'
check_buckets "$tmp/worker.prom" chunkgate_worker_request_duration_seconds 'route="assemble"'
inf=$(value "$tmp/gateway.prom" 'chunkgate_ttft_seconds_bucket{le="+Inf"}')
cnt=$(value "$tmp/gateway.prom" chunkgate_ttft_seconds_count)
[ -n "$cnt" ] && [ "$inf" = "$cnt" ] || fail "chunkgate_ttft_seconds: +Inf bucket $inf != count $cnt"

echo "== the traffic is counted"
ge() { # file, series, minimum
    local v
    v=$(value "$1" "$2")
    awk -v v="${v:-x}" -v min="$3" 'BEGIN {exit !(v != "x" && v + 0 >= min)}' || fail "$2 = ${v:-absent}, expected >= $3"
}
ge "$tmp/gateway.prom" chunkgate_chunk_hits_total 2
ge "$tmp/gateway.prom" chunkgate_chunk_misses_total 3
ge "$tmp/gateway.prom" chunkgate_tokens_reused_total 1
ge "$tmp/gateway.prom" chunkgate_tokens_computed_total 1
ge "$tmp/gateway.prom" chunkgate_ttft_seconds_count 4
ge "$tmp/gateway.prom" 'chunkgate_requests_total{route="completions",code="200"}' 3
ge "$tmp/gateway.prom" 'chunkgate_requests_total{route="completions",code="400"}' 1
ge "$tmp/gateway.prom" chunkgate_workers_healthy 1
ge "$tmp/gateway.prom" "chunkgate_worker_healthy{worker=\"$wurl\"}" 1
ge "$tmp/worker.prom" chunkgate_worker_chunk_hits_total 2
ge "$tmp/worker.prom" 'chunkgate_worker_tier_bytes{tier="ram"}' 1
ge "$tmp/worker.prom" 'chunkgate_worker_tier_capacity_bytes{tier="disk"}' 1
ge "$tmp/worker.prom" 'chunkgate_worker_canary_kl_nats_count{mode="strict",recompute_ratio="0.15",recompute_prefix_tokens="0",recompute_select="deviation"}' 1

echo "== the Grafana dashboard's series exist and its queries parse"
exported=$( (families "$tmp/gateway.prom"; families "$tmp/worker.prom") | cut -d' ' -f1 | sort -u)
n=0
for d in "$root"/docker/grafana/dashboards/*.json; do
    # Grafana's $__rate_interval is not PromQL; promtool sees a plain range instead.
    python3 - "$d" "$tmp/rules.yml" <<'PY'
import json, sys
dash = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", []) if t.get("expr")]
rules = [{"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "1m")}
         for i, e in enumerate(exprs)]
json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
PY
    out=$(promtool check rules "$tmp/rules.yml" 2>&1) || fail "$(basename "$d"): a query is not valid PromQL: $out"
    for s in $(grep -o 'chunkgate_[a-z0-9_]*' "$d" | sed -E 's/_(bucket|sum|count)$//' | sort -u); do
        n=$((n + 1))
        grep -qx "$s" <<<"$exported" || fail "$(basename "$d") queries $s, which neither program exports"
    done
done
[ "$n" -ge 10 ] || fail "the dashboards name only $n chunkgate series"

if [ "$fails" -gt 0 ]; then
    echo "$fails check(s) failed"
    exit 1
fi
echo "ok: both /metrics pass promtool; $n dashboard series exported"
