#!/usr/bin/env bash
# Sends a small RAG workload through chunkgate and prints what chunk caching did: per request
# the documents' hits, the tokens reused, the time to first token (TTFT); then the hit rate,
# the tokens reused and TTFT cold vs warm.
#
# Uses the gateway at CG_GATEWAY (default http://127.0.0.1:8080, e.g. started by
# scripts/run.sh). When none answers there, it builds and starts its own stack (one
# chunkgate-worker and the gateway, on free ports, in a temporary directory) and stops it at
# the end, serving models/chunkgate-rag where it is committed (CG_MODEL: another checkpoint
# directory, or tiny for the random-weight tiny model). Needs bash, curl and awk.
#
# On the trained model (a model id starting with chunkgate-rag) the workload is questions over
# fictional documents in other orders and under other system prompts, and each answer is
# checked: accuracy is printed next to the hit rate and TTFT. On any other model the documents
# are word salad of CG_DOC_BYTES bytes (default 2048). CG_BUILD: the build directory to use or
# create (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

gw=${CG_GATEWAY:-http://127.0.0.1:8080}
doc_bytes=${CG_DOC_BYTES:-2048}
bdir=${CG_BUILD:-build}
tmp=""
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

# The port a process logged in its "listening on 127.0.0.1:PORT" line.
wait_port() { # log pid
    for _ in $(seq 1 300); do
        local p
        p=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$1" | head -n1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    echo "failed to start; log:" >&2
    cat "$1" >&2
    return 1
}

if ! curl -fs "$gw/healthz" >/dev/null 2>&1; then
    echo "no gateway at $gw: starting a worker and a gateway on free ports"
    if [ ! -x "$bdir/server/chunkgate" ] || [ ! -x "$bdir/worker/chunkgate-worker" ]; then
        cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
        cmake --build "$bdir" -j"$(nproc)" --target chunkgate chunkgate-worker >/dev/null
    fi
    tmp=$(mktemp -d /tmp/chunkgate-demo.XXXXXX)
    mdir=${CG_MODEL:-}
    if [ -z "$mdir" ]; then
        mdir=tiny
        [ -f models/chunkgate-rag/config.json ] && mdir=models/chunkgate-rag
    fi
    if [ "$mdir" = tiny ]; then
        mdir=$tmp/model
        "$bdir/worker/chunkgate-worker" generate-model --out "$mdir" >/dev/null
    fi
    "$bdir/worker/chunkgate-worker" serve --model "$mdir" --listen 127.0.0.1:0 \
        --data-dir "$tmp/worker" --pool-mb 256 2>"$tmp/worker.log" &
    pids+=($!)
    wport=$(wait_port "$tmp/worker.log" "${pids[0]}")
    "$bdir/server/chunkgate" --listen 127.0.0.1:0 --worker "http://127.0.0.1:$wport" \
        --data-dir "$tmp/gateway" 2>"$tmp/gateway.log" &
    pids+=($!)
    gport=$(wait_port "$tmp/gateway.log" "${pids[1]}")
    gw="http://127.0.0.1:$gport"
    for _ in $(seq 1 100); do
        curl -fs "$gw/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
fi

model=$(curl -fs "$gw/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p' | head -n1)
[ -n "$model" ] || { echo "cannot read the model from $gw/v1/models" >&2; exit 1; }
# A marker unique to this run, so a gateway that ran the demo before starts cold again.
run="run $(date +%s%N)"

hits_total=0; segs_total=0; reused_total=0; prompt_total=0
cold_ttft=""; warm_sum=0; warm_n=0

# Records one answered request (its whole streamed output) into the totals and sets acct to
# "hits/segments reused_tokens prompt_tokens ttft_ms worker".
account() { # out
    local out=$1 first hits segs cached ptoks ttft worker
    first=$(grep -m1 '^data: {' <<<"$out" || true)
    [ -n "$first" ] || { echo "request failed: $out" >&2; exit 1; }
    hits=$(grep -o '"hit":true' <<<"$first" | wc -l || true)
    segs=$(grep -o '"hit":' <<<"$first" | wc -l || true)
    worker=$(sed -n 's/.*"worker":"\([^"]*\)".*/\1/p' <<<"$first")
    cached=$(grep -o '"cached_tokens":[0-9]*' <<<"$out" | tail -n1 | cut -d: -f2 || true)
    ptoks=$(grep -o '"prompt_tokens":[0-9]*' <<<"$out" | tail -n1 | cut -d: -f2 || true)
    ttft=$(sed -n 's/^TTFT //p' <<<"$out")
    if [ -z "$cold_ttft" ]; then
        cold_ttft=$ttft
    else
        hits_total=$((hits_total + hits)); segs_total=$((segs_total + segs))
        reused_total=$((reused_total + ${cached:-0})); prompt_total=$((prompt_total + ${ptoks:-0}))
        warm_sum=$(awk -v a="$warm_sum" -v b="$ttft" 'BEGIN{print a+b}'); warm_n=$((warm_n + 1))
    fi
    printf -v acct '%d/%d %s %s %.0f %s' "$hits" "$segs" "${cached:-0}" "${ptoks:-0}" \
        "$(awk -v t="$ttft" 'BEGIN{print t*1000}')" "${worker:-fallback}"
}

summary() {
    awk -v h="$hits_total" -v s="$segs_total" -v r="$reused_total" -v p="$prompt_total" \
        -v c="$cold_ttft" -v ws="$warm_sum" -v wn="$warm_n" 'BEGIN {
        w = ws / wn;
        printf "warm requests: hit rate %.0f%% of cacheable segments (%d/%d), %d of %d prompt tokens reused (%.0f%%)\n",
            100 * h / s, h, s, r, p, 100 * r / p;
        printf "TTFT cold %.0f ms, warm %.0f ms on average: %.1fx faster\n", c * 1000, w * 1000, c / w }'
}

case "$model" in
chunkgate-rag*)
    # Fictional documents in the model's world (people and companies it never saw in
    # training), asked about in other orders and under other system prompts.
    D1="Trenddir Group makes clocks. The year Trenddir Group was founded is 1897. It has its head office in Kempein."
    D2="Mertnourt Breirpomje is a resident of Bindmouth. The employer of Mertnourt Breirpomje is Trenddir Group. Mertnourt Breirpomje is a farmer by profession. Mertnourt Breirpomje is 58 years of age."
    D3="Fas Sambis is a painter by profession. Fas Sambis is on the payroll of Trenddir Group. The home of Fas Sambis is in Kirstairtmouth. This year he turned 19."
    D4="Gairka Optics was first established in 1947. The head office of Gairka Optics is in Thakbro. Gairka Optics produces soap."
    S1="Answer the question from the documents."
    S2="Be brief. If the documents do not say, answer unknown."
    right=0; asked=0
    # qa LABEL SYSTEM QUESTION EXPECTED DOC...: one streamed chat request with documents.
    qa() {
        local label=$1 sys=$2 q=$3 want=$4 docs="" d; shift 4
        for d in "$@"; do docs+="${docs:+,}\"$d\""; done
        local body out got
        body=$(printf '{"model":"%s","messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}],"documents":[%s],"max_tokens":24,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
            "$model" "$sys" "$q" "$docs")
        out=$(curl -sS -N "$gw/v1/chat/completions" -H 'Content-Type: application/json' \
            -d "$body" -w '\nTTFT %{time_starttransfer}\n')
        got=$(grep '^data: {' <<<"$out" | sed -n 's/.*"content":"\([^"]*\)".*/\1/p' | tr -d '\n')
        account "$out"
        read -r hs cached ptoks ms worker <<<"$acct"
        asked=$((asked + 1))
        local mark=wrong
        [ "$got" = "$want" ] && { mark=right; right=$((right + 1)); }
        printf '%-28s %-46s -> %-30s %-5s  %s segments hit  %4s/%4s tokens reused  TTFT %4s ms\n' \
            "$label" "$q" "$got" "$mark" "$hs" "$cached" "$ptoks" "$ms"
    }
    echo "gateway $gw, model $model: questions over 4 documents"
    qa "first: D1 D2 D3" "$S1" "Where does Fas Sambis live?" "Kirstairtmouth" "$D1" "$D2" "$D3"
    qa "same documents" "$S1" "Who does Mertnourt Breirpomje work for?" "Trenddir Group" "$D1" "$D2" "$D3"
    qa "reordered" "$S1" "What does Trenddir Group make?" "clocks" "$D3" "$D1" "$D2"
    qa "other system prompt" "$S2" "Where is Fas Sambis's employer based?" "Trenddir Group, Kempein" "$D2" "$D3" "$D1"
    qa "new document added" "$S2" "Who is older, Mertnourt Breirpomje or Fas Sambis?" "58 vs 19: Mertnourt Breirpomje" "$D4" "$D2" "$D1" "$D3"
    qa "subset, other order" "$S1" "In which city is Gairka Optics located?" "Thakbro" "$D3" "$D4" "$D1"
    qa "not in the documents" "$S2" "How old is Jalpa Rosstarvar?" "unknown" "$D4" "$D2" "$D3"
    summary
    echo "accuracy: $right of $asked answers right"
    exit 0
    ;;
esac

# Word-like text of about $1 bytes, seeded by $2, all on one line, no quotes.
text() {
    awk -v n="$1" -v seed="$2" -v tag="$3" 'BEGIN {
        split("valley rainfall gauge council records annual report members harbour survey " \
              "data changed ferry museum archive budget bridge quorum bylaws river", w, " ");
        srand(seed); s = tag;
        while (length(s) < n) s = s " " w[int(rand() * 20) + 1];
        print substr(s, 1, n) "." }'
}
sys1=$(text 300 1 "You are a careful assistant for the city council ($run). Answer from the documents only:")
sys2=$(text 200 2 "Terse mode ($run): cite the document number, then answer in one sentence:")
d1=$(text "$doc_bytes" 11 "Document 1, harbour survey ($run):")
d2=$(text "$doc_bytes" 12 "Document 2, council budget ($run):")
d3=$(text "$doc_bytes" 13 "Document 3, rainfall records ($run):")

# ask LABEL SYSTEM DOC... QUESTION: one streamed request; prints one line of results.
ask() {
    local label=$1; shift
    local prompt="" part
    for part in "$@"; do prompt+="${prompt:+ # # }$part"; done
    local body out
    body=$(printf '{"model":"%s","prompt":"%s","max_tokens":16,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
        "$model" "$prompt")
    out=$(curl -sS -N "$gw/v1/completions" -H 'Content-Type: application/json' -d "$body" \
        -w '\nTTFT %{time_starttransfer}\n')
    account "$out"
    read -r hs cached ptoks ms worker <<<"$acct"
    printf '%-34s %s segments hit  %5s of %5s prompt tokens reused  TTFT %6s ms  %s\n' \
        "$label" "$hs" "$cached" "$ptoks" "$ms" "$worker"
}

echo "gateway $gw, model $model, 3 documents of $doc_bytes bytes"
ask "cold: sys1 + d1 d2 d3"            "$sys1" "$d1" "$d2" "$d3" "What did the harbour survey find?"
ask "same documents, new question"     "$sys1" "$d1" "$d2" "$d3" "Which budget line grew?"
ask "documents reordered"              "$sys1" "$d3" "$d1" "$d2" "How much rain fell?"
ask "system prompt changed"            "$sys2" "$d2" "$d3" "$d1" "Summarise document 2."
ask "subset, other order"              "$sys2" "$d3" "$d1" "Compare documents 1 and 3."
summary
