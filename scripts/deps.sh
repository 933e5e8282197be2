#!/usr/bin/env bash
# Installs the Debian 12 packages chunkgate needs to build, test and run (as root, only the
# missing ones). Used by scripts/test.sh and scripts/run.sh.
set -euo pipefail
# prometheus: promtool (tests/metrics_check.sh); docker-compose: `docker-compose config`
# (tests/docker_check.sh); python3-yaml comes with it. nginx-light: the load balancer in front of
# three gateways (tests/test_replicas.c). chromium: headless render of the status
# page (tests/test_status.c; ~290 MB installed, the test skips without it). clang-format: the
# formatting check of scripts/test.sh. python3-torch and python3-numpy: the independent reference
# forward pass (tests/ref, the ref_* tests) and the training recipe (train/), for Debian's
# /usr/bin/python3. The container check
# (CG_CONTAINERS=1, tests/containers/check.sh) installs its own: podman runc netavark
# aardvark-dns iptables catatonit debootstrap.
PKGS=(build-essential cmake pkg-config libmicrohttpd-dev libjansson-dev libsqlite3-dev
      libxxhash-dev libcurl4-openssl-dev check libopenblas-dev libssl-dev libpcre2-dev libutf8proc-dev libhiredis-dev curl sqlite3
      redis-server redis-tools nginx-light prometheus docker-compose chromium valgrind clang-format python3-torch
      python3-numpy ${CG_EXTRA_PKGS:-})
# shellcheck source=scripts/apt.sh
. "$(dirname "$0")/apt.sh"
mapfile -t missing < <(apt_missing "${PKGS[@]}")
# Node and npm run the client-compatibility tests (tests/compat). Any node >= 18 will do (a
# NodeSource build, for one, bundles npm); Debian 12's own nodejs (18.x) and npm are
# installed only when no node is on the PATH at all.
command -v node >/dev/null || missing+=(nodejs npm)
[ ${#missing[@]} -eq 0 ] && exit 0
apt_install "scripts/deps.sh" "${missing[@]}"
