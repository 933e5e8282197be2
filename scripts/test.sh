#!/usr/bin/env bash
# Installs dependencies (Debian 12, as root), builds chunkgate and chunkgate-worker
# warning-free, and runs every test with ctest. CG_SANITIZE=1 also runs the whole suite on an
# ASan+UBSan build in build-san/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)

run_suite() { # build-dir, extra cmake args...
    local dir=$1; shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    (cd "$dir" && ctest --output-on-failure --timeout 900)
}

run_suite build
if [ "${CG_SANITIZE:-0}" = 1 ]; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run_suite build-san -DCG_SANITIZE=ON -DCG_BENCH=OFF
fi
