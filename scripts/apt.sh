# shellcheck shell=bash
# Sourced by the scripts that install Debian 12 packages they need (scripts/deps.sh,
# scripts/fuzz.sh, bench/passthrough.sh, tests/containers/check.sh).

# apt_missing PKG...: prints those of PKG that dpkg does not list as installed.
apt_missing() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
    done
}

# apt_install WHO PKG...: installs PKG (quietly, without recommends) as root; as another user,
# says which packages WHO needs and how to install them, and exits 1.
apt_install() {
    local who=$1
    shift
    if [ "$(id -u)" -ne 0 ]; then
        echo "$who: needs $* (as root: apt-get install -y $*)" >&2
        exit 1
    fi
    echo "$who: installing $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@"
}
