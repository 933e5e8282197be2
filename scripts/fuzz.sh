#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ with clang (-fsanitize=fuzzer,address,undefined;
# the libraries under test get fuzzer-no-link coverage) in build-fuzz-clang/, then runs each
# target for CG_FUZZ_SECONDS seconds (default 60) starting from its seed corpus. Exits non-zero
# when a target crashes, leaks, times out or breaks an invariant; the reproducer is left in
# build-fuzz-clang/fuzz-out/<target>/ (replay: build-fuzz-clang/tests/fuzz_<target> FILE).
#
#   scripts/fuzz.sh                 all targets
#   scripts/fuzz.sh split sse       some targets
#   scripts/fuzz.sh --seeds         regenerate tests/fuzz/corpus/ (tests/fuzz/make_seeds.py)
#
# Environment: CG_FUZZ_SECONDS (per target), CG_FUZZ_BUILD (build dir), CG_FUZZ_ARGS (extra
# libFuzzer flags, e.g. "-max_len=4096"). New inputs found accumulate in
# build-fuzz-clang/fuzz-corpus/<target>/ and are reused by the next run; the seed corpora in
# tests/fuzz/corpus/ are only read.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${CG_FUZZ_BUILD:-$ROOT/build-fuzz-clang}
SECONDS_PER=${CG_FUZZ_SECONDS:-60}
ALL=(split chat sse json_request safetensors config kvwire disk chat_template http_frame gguf)

# clang with its libFuzzer runtime (Debian: clang + libclang-rt-dev) and libomp (OpenMP).
fuzzer_works() {
    local d
    d=$(mktemp -d)
    printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$d/t.c"
    clang -fsanitize=fuzzer,address,undefined "$d/t.c" -o "$d/t" >/dev/null 2>&1
    local rc=$?
    rm -rf "$d"
    return $rc
}
if ! command -v clang >/dev/null || ! fuzzer_works || ! dpkg-query -W -f='${Status}' libomp-dev 2>/dev/null | grep -q "install ok installed"; then
    # shellcheck source=scripts/apt.sh
    . "$ROOT/scripts/apt.sh"
    apt_install fuzz.sh clang libclang-rt-dev libomp-dev
    fuzzer_works || { echo "fuzz.sh: clang -fsanitize=fuzzer still does not link" >&2; exit 1; }
fi
scripts/deps.sh

# Warnings stay errors in the gcc builds; clang's set differs, so it does not gate fuzzing.
CC=clang cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_SANITIZE=ON -DCG_FUZZ=ON \
    -DCG_BENCH=OFF -DCG_WERROR=OFF -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link >/dev/null

if [ "${1:-}" = "--seeds" ]; then
    cmake --build "$BUILD" -j"$(nproc)" --target fuzz_config
    model=$(mktemp -d)
    CG_FUZZ_SEED_OUT=$model "$BUILD/tests/fuzz_config" -runs=0 >/dev/null 2>&1
    python3 tests/fuzz/make_seeds.py --model-dir "$model"
    rm -rf "$model"
    echo "fuzz.sh: seeds written to tests/fuzz/corpus/"
    exit 0
fi

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL[@]}")
cmake --build "$BUILD" -j"$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
printf '%-18s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus result
for t in "${targets[@]}"; do
    work=$BUILD/fuzz-corpus/$t out=$BUILD/fuzz-out/$t log=$BUILD/fuzz-out/$t.log
    mkdir -p "$work" "$out"
    rc=0
    # The work corpus comes first: libFuzzer writes new inputs into the first directory.
    # shellcheck disable=SC2086
    timeout $((SECONDS_PER + 300)) "$BUILD/tests/fuzz_$t" "$work" "tests/fuzz/corpus/$t" \
        -max_total_time="$SECONDS_PER" -timeout=25 -rss_limit_mb=4096 -print_final_stats=1 \
        -artifact_prefix="$out/" ${CG_FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    files=$(find "$work" -type f | wc -l)
    result=ok
    if [ "$rc" -ne 0 ]; then
        result="FAILED (rc $rc, see $log; reproducer in $out/)"
        failed+=("$t")
    fi
    printf '%-18s %8s %12s %10s %8s  %s\n' "fuzz_$t" "$SECONDS_PER" "${execs:-?}" "${speed:-?}" \
        "$files" "$result"
done
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz.sh: failed: ${failed[*]}" >&2
    for t in "${failed[@]}"; do
        echo "---- $t" >&2
        grep -E "invariant failed|ERROR: |SUMMARY|runtime error" "$BUILD/fuzz-out/$t.log" | head -5 >&2 || true
    done
    exit 1
fi
