#!/usr/bin/env bash
# Runs compat test files with node's built-in test runner (ctest calls it once per file).
# Exits 77, which ctest reports as skipped, with the reason, when node is missing or the npm
# packages of package-lock.json are not installed (scripts/test.sh runs `npm ci` here; when
# that failed, for example with the npm registry unreachable, its log says why).
set -uo pipefail
cd "$(dirname "$0")"
skip() {
    echo "SKIPPED: $*"
    exit 77
}
command -v node >/dev/null || skip "node is not installed (Debian 12: apt-get install nodejs npm; scripts/deps.sh does it)"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || skip "node $(node --version) is too old: the compat tests need node >= 18"
if ! why=$(node check-deps.js); then
    if [ -s .npm-ci.log ]; then
        err=$(grep -m2 -E '^npm (ERR!|error) (code |[A-Za-z]+Error)' .npm-ci.log || tail -n 3 .npm-ci.log)
        skip "$why; the last \`npm ci\` failed: $(tr '\n' ' ' <<<"$err")(tests/compat/.npm-ci.log)"
    fi
    skip "$why; run \`npm ci\` in tests/compat (scripts/test.sh does)"
fi
exec node --test "$@"
