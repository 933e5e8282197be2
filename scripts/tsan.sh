#!/usr/bin/env bash
# ThreadSanitizer over the concurrent code: builds build-tsan/ (CG_TSAN=ON) and runs the suites
# whose threads share state: the scheduler (continuous batching), the HTTP server, the index
# writer, the disk tier, the Redis client, the gateway's fast path and relay (conformance,
# limits), the quality canary's background queue, the chunk events (worker publisher,
# gateway reader) and the 64-client soak through real processes.
# OpenMP runs one thread: libgomp is not instrumented, and its barriers would be reported as
# races; the request, scheduler, HTTP and writer threads are what this checks.
# Environment: CG_SOAK_SECONDS (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_TSAN=ON -DCG_BENCH=OFF >/dev/null
cmake --build build-tsan -j"$(nproc)"
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1 second_deadlock_stack=1}
export OMP_NUM_THREADS=1 CG_SOAK_SECONDS=${CG_SOAK_SECONDS:-60}
cd build-tsan
ctest --output-on-failure --timeout 900 \
    -R '^(test_sched|test_http|test_concurrency|test_index|test_disk|test_remote|test_engine|test_tiers_e2e|test_conformance|test_limits|test_gateway|test_status|test_quality|test_quality_http|test_events|test_shared_tier)$'
