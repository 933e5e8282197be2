#!/bin/bash
# The CPU recipe of the wider model (hidden 256, 6 layers, 8 heads of 32), run in sittings:
# train/README.md, "The CPU run of w256L6". It takes longer than one sitting on 2 cores, so
# every part goes on from where the last sitting stopped it:
#
#   DIR/p1        the first part from scratch (copying stage, then RAG prompts), 4,000 steps
#   DIR/p2        the second part from p1: a fresh optimizer, 6 documents a prompt, 3,600 steps
#                 (the GPU run's 2,400 and 1,200 more: this run's part one ended further back)
#   DIR/p2-block  the block fine-tune of p2 (DESIGN §5's chunk-isolating mask), 500 steps
#
# A finished part (its train_log.json holds its own held-out accuracy, and no resume.pt is
# left) is skipped; an interrupted one (resume.pt) is resumed with the same options,
# bit-identically. SIGTERM stops the running part at its next resumable step (at most 8 steps)
# and the script exits 143; a part that fails exits 1, saying so. Started as the leader of its
# own session (setsid), it lowers the priority of that session's scheduling group to nice 19,
# so that the run takes what the machine leaves over and does not skew timings measured
# beside it. The script's pid is in DIR/pid.
#
#   setsid nohup train/cpu_run.sh /var/tmp/w256 >> /var/tmp/w256.log 2>&1 &
#   kill -TERM "$(cat /var/tmp/w256/pid)"    # before the sitting ends; run it again later
set -uo pipefail

dir=${1:?usage: train/cpu_run.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1

mkdir -p "$dir"
echo $$ > "$dir/pid"
if [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ]; then
    renice -n 19 -p $$ > /dev/null
    { echo 19 > /proc/self/autogroup; } 2> /dev/null || true
fi

child=
stopping=
on_stop() {
    stopping=1
    [ -n "$child" ] && kill -TERM "$child" 2> /dev/null
}
trap on_stop TERM INT

# finished OUT: OUT's log holds the held-out accuracy of its own run (a run from --init also
# keeps its parents' logs, with theirs)
finished() {
    [ ! -f "$1/resume.pt" ] && "$py" -c 'import json, sys
sys.exit("heldout" not in json.load(open(sys.argv[1])))' "$1/train_log.json" 2> /dev/null
}

# part OUT OPTIONS...: runs (or resumes) one part; 0 once OUT is finished, 143 when stopped,
# 1 when it failed
part() {
    local out=$1
    shift
    if finished "$out"; then
        echo "== $out: finished in an earlier sitting"
        return 0
    fi
    [ -n "$stopping" ] && return 143
    local resume=()
    [ -f "$out/resume.pt" ] && resume=(--resume)
    echo "== $out: $(date -u +%FT%TZ) ${resume[*]:-from the start}"
    "$py" "$here/train.py" --out "$out" "$@" "${resume[@]}" &
    child=$!
    [ -n "$stopping" ] && kill -TERM "$child"
    local rc
    while :; do
        wait "$child"
        rc=$?
        # a trapped signal cuts the wait short while the trainer saves and exits on its own
        if [ "$rc" -le 128 ] || [ -z "$stopping" ] || ! kill -0 "$child" 2> /dev/null; then
            break
        fi
    done
    child=
    if [ "$rc" -eq 0 ] && finished "$out"; then
        return 0
    fi
    if [ -n "$stopping" ] && [ -f "$out/resume.pt" ]; then
        echo "== $out: stopped ($(date -u +%FT%TZ)); run the same command to go on"
        return 143
    fi
    echo "== $out: failed (exit $rc, $(date -u +%FT%TZ))"
    return 1
}

common=(--blas-threads 2 --eval-every 500)
part "$dir/p1" --hidden 256 --layers 6 --heads 8 --kv-heads 4 --mlp 768 \
    --steps 4000 --lr 0.002 --schedule wsd --decay 0.25 "${common[@]}" || exit
part "$dir/p2" --init "$dir/p1" --steps 3600 --lr 0.0015 --schedule wsd --decay 0.4 \
    --curriculum 0 --warmup 20 "${common[@]}" || exit
part "$dir/p2-block" --init "$dir/p2" --steps 500 --block-mask 0.5 --lr 5e-4 --curriculum 0 \
    --blas-threads 2 --eval-every 250 || exit
echo "== all parts finished: $dir/p2 and $dir/p2-block"
