#!/usr/bin/env bash
# The README's configuration tables must list every option that `--help` prints, with the same
# environment variable and default, so the docs cannot drift from the option tables in code.
# Usage: readme_check.sh CHUNKGATE_BIN CHUNKGATE_WORKER_BIN README
set -euo pipefail
gw=$1 worker=$2 readme=$3
fail=0
check() { # label, help text
    local label=$1 help=$2 n=0
    while IFS= read -r row; do
        n=$((n + 1))
        # A help row: | `--flag` | `ENV` | TYPE | default | description |
        flag=$(cut -d'|' -f2 <<<"$row" | tr -d ' ')
        env=$(cut -d'|' -f3 <<<"$row" | tr -d ' ')
        def=$(cut -d'|' -f5 <<<"$row" | sed 's/^ *//; s/ *$//')
        line=$(grep -F -- "| $flag |" "$readme" | grep -F -- "$env" | head -1 || true)
        if [ -z "$line" ]; then
            echo "README.md: $label option $flag ($env) is missing"
            fail=1
        elif ! grep -qF -- "| $def |" <<<"$line"; then
            echo "README.md: $label option $flag: default should be '$def': $line"
            fail=1
        fi
    done < <(grep -E '^\| `--' <<<"$help")
    [ "$n" -gt 5 ] || { echo "$label --help printed only $n options"; fail=1; }
    echo "$label: $n options checked"
}
check chunkgate "$("$gw" --help)"
check chunkgate-worker "$("$worker" serve --help)"
exit $fail
