#!/usr/bin/env bash
# Installs dependencies (Debian 12, as root), builds chunkgate and chunkgate-worker
# warning-free, and runs every test with ctest. CG_SANITIZE=1 also runs the whole suite on an
# ASan+UBSan build in build-san/. CG_CONTAINERS=1 also builds the docker/ images with podman
# and runs them with docker-compose (tests/containers/check.sh: root, about 6 min cold).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)

# Every C file follows the committed .clang-format (Debian's clang-format 14).
git ls-files '*.c' '*.h' '*.inc' | xargs clang-format --dry-run -Werror
echo "clang-format: $(git ls-files '*.c' '*.h' '*.inc' | wc -l) files formatted"

# The npm packages of the tests, exactly as locked: tests/compat (client compatibility, the
# OpenAPI contract), tests/ref (the reference tokenizers and chat-template renderer) and
# bench/llamacpp (llama.cpp's prebuilt CPU build, which cross-checks the torch reference). A
# local `npm ci`, skipped when they are already installed. When it fails (no node, registry
# unreachable) those tests report SKIPPED with the reason instead of failing the run.
npm_deps() { # dir [npm ci options]
    local dir=$1; shift
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "$dir: node or npm not found, its tests will be SKIPPED"
        return 0
    fi
    if node tests/compat/check-deps.js "$dir" >/dev/null 2>&1; then
        rm -f "$dir/.npm-ci.log"
        return 0
    fi
    echo "npm ci in $dir"
    if (cd "$dir" && timeout 600 npm ci --no-audit --no-fund --prefer-offline --fetch-retries=1 \
            "$@" >.npm-ci.log 2>&1); then
        rm -f "$dir/.npm-ci.log"
    else
        local why
        why=$(grep -m2 -E '^npm (ERR!|error) (code |[A-Za-z]+Error)' "$dir/.npm-ci.log" || tail -n 3 "$dir/.npm-ci.log")
        echo "$dir: npm ci failed, its tests will be SKIPPED: $(tr '\n' ' ' <<<"$why")(log: $dir/.npm-ci.log)" >&2
    fi
}
npm_deps tests/compat
npm_deps tests/ref
# node-llama-cpp's prebuilt binaries only: nothing is downloaded from GitHub or compiled
NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm_deps bench/llamacpp --omit=optional

run_suite() { # build-dir, extra cmake args...
    local dir=$1; shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    local rc=0
    # two at a time on two cores: every suite takes its own ports (port 0) and directories
    (cd "$dir" && ctest --output-on-failure --timeout 900 -j"$jobs") || rc=$?
    # ctest does not show a skipped test's output; its first line says why it was skipped.
    grep -h '^SKIPPED: ' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null || true
    return $rc
}

run_suite build
if [ "${CG_SANITIZE:-0}" = 1 ]; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run_suite build-san -DCG_SANITIZE=ON -DCG_BENCH=OFF
fi
# Bounded fuzzing on top of the corpus replay that ctest already ran (needs clang; see
# scripts/fuzz.sh): each libFuzzer target runs for CG_FUZZ_SECONDS seconds.
if [ -n "${CG_FUZZ_SECONDS:-}" ]; then
    scripts/fuzz.sh
fi
if [ "${CG_CONTAINERS:-0}" = 1 ]; then
    tests/containers/check.sh
fi
