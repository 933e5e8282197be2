# Shared by the shell checks (tests/metrics_check.sh, tests/docker_check.sh), sourced after
# `set -euo pipefail`: skipping without a tool, the binaries from the environment, and a
# temporary directory plus background processes ($pids) cleaned up at exit.

# need_tool TOOL PACKAGE: exit 77 (ctest: skipped) with the reason when TOOL is missing.
need_tool() {
    if ! command -v "$1" >/dev/null; then
        echo "SKIPPED: $1 is not installed (Debian package $2; scripts/deps.sh installs it)"
        exit 77
    fi
}

# check_start: the binaries from the environment, then $tmp and $pids, cleaned up at exit.
check_start() {
    : "${CHUNKGATE_BIN:?set CHUNKGATE_BIN to the built chunkgate}"
    : "${CHUNKGATE_WORKER_BIN:?set CHUNKGATE_WORKER_BIN to the built chunkgate-worker}"
    tmp=$(mktemp -d)
    pids=()
    trap cleanup EXIT
}

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
