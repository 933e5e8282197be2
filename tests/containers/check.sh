#!/usr/bin/env bash
# The container check (scripts/test.sh runs it when CG_CONTAINERS=1): builds both images of
# docker/Dockerfile with podman and runs gateway + worker + Redis from docker/docker-compose.yml
# with docker-compose, as a user deploys them, and shows that
#   - a second identical `# #` request hits;
#   - after `down` and `up` with the volumes kept, the chunks come from the worker's disk tier;
#   - a worker restarted on a new address serves through the gateway again within 15 s;
#   - a mounted sharded checkpoint (with a user's file beside it) is loaded and never touched;
#   - both containers run as 10001:10001 and pass their HEALTHCHECKs;
#   - docker/docker-compose.replicas.yml (two gateways behind nginx, two workers, chunk events
#     on Redis): every request after the first hits, through either gateway; with one gateway
#     killed nginx serves through the other, and the restarted one resumes the events.
# No image registry is used: debian:12 (tagged debian:12-slim too) is imported from a
# `debootstrap --variant=minbase bookworm` of the host's Debian mirror, and Redis and nginx are
# stand-ins built from Debian's redis-server and nginx-light (tests/containers/*.Dockerfile). Packages come from the
# Debian mirror only.
#
# Needs root on Debian 12; installs what is missing: podman runc netavark aardvark-dns
# iptables catatonit debootstrap docker-compose. podman runs with runc (crun refuses hybrid
# cgroup hosts) and with default ulimits within the hard limits (a container cannot raise them).
# docker-compose talks to `podman system service` through DOCKER_HOST. podman without systemd
# runs no health checks by itself: a loop here runs `podman healthcheck run`.
#
# State (containers.conf, the socket, logs) lives in $CG_CONTAINERS_DIR (default
# /var/tmp/chunkgate-containers); images stay in podman's store, so a second run only rebuilds
# what changed. On 2 busy cores: 3.5 to 5 min cold (debootstrap 1 min, the worker image 1 to
# 1.5 min) and 2 GB in podman's store (build-stage layers included); 35 to 65 s warm. One run
# at a time: the compose project (cgcheck) and the state directory are fixed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
dir=${CG_CONTAINERS_DIR:-/var/tmp/chunkgate-containers}
project=cgcheck
restart_limit_s=15
t0=$SECONDS
phase() { echo "== [$((SECONDS - t0))s] $*"; }
fail() {
    echo "FAIL: $*"
    exit 1
}

[ "$(id -u)" -eq 0 ] || fail "the container check needs root (podman, debootstrap, apt-get)"
pkgs=(podman runc netavark aardvark-dns iptables catatonit debootstrap docker-compose)
# shellcheck source=scripts/apt.sh
. "$root/scripts/apt.sh"
mapfile -t missing < <(apt_missing "${pkgs[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    phase "installing ${missing[*]}"
    apt_install containers/check.sh "${missing[@]}" >/dev/null
fi

mkdir -p "$dir"
hn=$(ulimit -Hn)
hu=$(ulimit -Hu)
[ "$hn" = unlimited ] && hn=1048576
[ "$hu" = unlimited ] || [ "$hu" -gt 32768 ] && hu=32768
cat >"$dir/containers.conf" <<EOF
# Written by tests/containers/check.sh.
[containers]
default_ulimits = ["nofile=$hn:$hn", "nproc=$hu:$hu"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$dir/containers.conf"

# --- Base images, without a registry.
if ! podman image exists debian:12; then
    phase "debian:12 from debootstrap"
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    mirror=${mirror:-http://deb.debian.org/debian}
    rootfs=$(mktemp -d "$dir/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
        { tail -n 20 "$dir/debootstrap.log"; fail "debootstrap failed"; }
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/"
        rm -f "$rootfs/etc/apt/sources.list"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --quiet - debian:12 >/dev/null
    rm -rf "$rootfs"
fi
podman tag debian:12 debian:12-slim
if ! podman image exists redis:7.0-bookworm; then
    phase "redis:7.0-bookworm stand-in from Debian's redis-server"
    podman build --format docker --pull=never -f tests/containers/redis.Dockerfile \
        -t redis:7.0-bookworm tests/containers >"$dir/build-redis.log" 2>&1 ||
        { tail -n 30 "$dir/build-redis.log"; fail "building the Redis stand-in"; }
fi

if ! podman image exists nginx:stable-bookworm; then
    phase "nginx:stable-bookworm stand-in from Debian's nginx-light"
    podman build --format docker --pull=never -f tests/containers/nginx.Dockerfile \
        -t nginx:stable-bookworm tests/containers >"$dir/build-nginx.log" 2>&1 ||
        { tail -n 30 "$dir/build-nginx.log"; fail "building the nginx stand-in"; }
fi

# --- The images, as the compose file names them (podman's layer cache: warm runs are quick).
for target in worker gateway; do
    image=chunkgate-worker:local
    [ "$target" = gateway ] && image=chunkgate:local
    phase "podman build --target $target"
    podman build --format docker --pull=never -f docker/Dockerfile --target "$target" -t "$image" . \
        >"$dir/build-$target.log" 2>&1 || { tail -n 30 "$dir/build-$target.log"; fail "building $image"; }
    [ -n "$(podman image inspect --format '{{.Config.Healthcheck}}' "$image" | grep -v '^<nil>$')" ] ||
        fail "$image has no HEALTHCHECK"
done

# --- docker-compose through podman's Docker API.
sock="$dir/podman.sock"
rm -f "$sock"
podman system service --time=0 "unix://$sock" >"$dir/service.log" 2>&1 &
service_pid=$!
export DOCKER_HOST="unix://$sock"
for _ in $(seq 1 100); do
    curl -fsS --unix-socket "$sock" http://d/_ping >/dev/null 2>&1 && break
    sleep 0.1
done
compose() { docker-compose --ansi never -p "$project" -f docker/docker-compose.yml "$@"; }
replicas() { docker-compose --ansi never -p "${project}r" -f docker/docker-compose.replicas.yml "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export CHUNKGATE_PORT=${CHUNKGATE_PORT:-$(free_port)}
gw="http://127.0.0.1:$CHUNKGATE_PORT"
tmp=$(mktemp -d)
health_pid=
cleanup() {
    local rc=$?
    set +e
    if [ $rc -ne 0 ] && [ -S "$sock" ]; then
        echo "--- docker-compose logs (last lines)"
        compose logs --tail=30 2>&1 || true
        replicas logs --tail=30 2>&1 || true
    fi
    [ -n "$health_pid" ] && { kill "$health_pid"; wait "$health_pid"; } 2>/dev/null
    podman rm -f -v --ignore -t 5 cgcheck-sharded >/dev/null 2>&1 || true
    podman rm -f -v --ignore -t 0 cgcheck-placeholder >/dev/null 2>&1 || true
    compose down -v -t 10 >/dev/null 2>&1 || true
    replicas down -v -t 10 >/dev/null 2>&1 || true
    kill "$service_pid" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$tmp"
    exit $rc
}
trap cleanup EXIT
# A previous run's leftovers.
compose down -v -t 5 >/dev/null 2>&1 || true
replicas down -v -t 5 >/dev/null 2>&1 || true
podman rm -f -v --ignore -t 0 cgcheck-sharded cgcheck-placeholder >/dev/null 2>&1 || true

cid() { compose ps -q "$1"; }
# podman without systemd runs no health checks: run them every 3 s while the check runs.
health_loop() {
    set +e # a failing check is the container's state, not the loop's end
    while sleep 3; do
        for s in gateway worker redis; do
            c=$(cid "$s" 2>/dev/null) && [ -n "$c" ] && podman healthcheck run "$c" >/dev/null 2>&1
        done
    done
}
health_of() { podman inspect --format '{{.State.Health.Status}}' "$1" 2>/dev/null || echo none; }
wait_healthy() { # service, seconds
    local c end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do
        c=$(cid "$1")
        [ -n "$c" ] && podman healthcheck run "$c" >/dev/null 2>&1 && [ "$(health_of "$c")" = healthy ] && return 0
        sleep 1
    done
    fail "$1 is not healthy after $2 s (health: $(health_of "$(cid "$1")"))"
}

prompt='You are terse. # # The ferry to the island leaves at nine and returns at five. # # When does the ferry leave?'
# ask FILE: one completion through the gateway; its JSON in FILE. 0 when the worker answered it.
ask() {
    curl -fsS -m 30 "$gw/v1/completions" -H 'Content-Type: application/json' -o "$1" \
        -d "$(python3 -c 'import json,sys; print(json.dumps({"model":"chunkgate-tiny","max_tokens":4,"temperature":0,"prompt":sys.argv[1]}))' "$prompt")" \
        2>/dev/null || return 1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["chunk_cache"]["fallback"] is False else 1)' "$1" 2>/dev/null
}
# The chunk segment's hit and tier: "true disk".
chunk_of() {
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
s = [x for x in d["chunk_cache"]["segments"] if x["role"] == "chunk"][0]
print(str(s["hit"]).lower(), s.get("tier") or "-", d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))' "$1"
}
wait_served() { # seconds; 0 when a request was answered by the worker within them
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        ask "$tmp/answer.json" && return 0
        sleep 0.5
    done
    return 1
}
as_user() { # container: "uid gid" of its PID 1 (real, effective, saved, fs)
    podman exec "$1" sh -c "sed -n 's/^\\(Uid\\|Gid\\):\\t//p' /proc/1/status" | tr '\t\n' '  '
}

phase "docker-compose up (redis, worker, gateway) on 127.0.0.1:$CHUNKGATE_PORT"
compose up -d --no-build redis worker gateway >"$dir/up.log" 2>&1 || { cat "$dir/up.log"; fail "compose up"; }
health_loop &
health_pid=$!
wait_served 180 || fail "the gateway did not serve through the worker within 180 s"

phase "a second identical request hits"
ask "$tmp/first.json" || fail "first request"
ask "$tmp/second.json" || fail "second request"
read -r hit tier cached <<<"$(chunk_of "$tmp/second.json")"
[ "$hit" = true ] && [ "$cached" -gt 0 ] || fail "the second request did not hit: hit=$hit tier=$tier cached_tokens=$cached"
echo "ok: hit from tier $tier, $cached cached tokens"

phase "both containers run as 10001:10001 and pass their health checks"
for s in worker gateway; do
    ids=$(as_user "$(cid "$s")")
    [ "$ids" = "10001 10001 10001 10001 10001 10001 10001 10001 " ] || fail "$s runs as uid/gid $ids"
    wait_healthy "$s" 60
done
wait_healthy redis 30
echo "ok: worker and gateway run as 10001:10001 and are healthy"

phase "a worker restarted on a new address serves again within ${restart_limit_s} s"
net=$(podman inspect --format '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$(cid worker)")
old_ip=$(podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(cid worker)")
stopping=$SECONDS
compose stop -t 30 worker >/dev/null 2>&1
echo "worker stopped in $((SECONDS - stopping)) s (SIGTERM: its RAM chunks go to the disk tier)"
compose rm -f worker >/dev/null 2>&1
# Whatever the address allocator does, the old address is taken meanwhile.
podman run -d --rm --name cgcheck-placeholder --network "$net" debian:12 sleep 600 >/dev/null
compose up -d --no-build --no-deps worker >/dev/null 2>&1
started=$SECONDS
new_ip=$(podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(cid worker)")
[ "$new_ip" != "$old_ip" ] || fail "the worker kept its address $old_ip"
wait_served "$restart_limit_s" || fail "not served within ${restart_limit_s} s after the worker moved from $old_ip to $new_ip"
echo "ok: served $((SECONDS - started)) s after the worker moved from $old_ip to $new_ip"
podman rm -f -v -t 0 cgcheck-placeholder >/dev/null

phase "down and up with the volumes kept: the chunks come from the disk tier"
compose down -t 60 >/dev/null 2>&1
compose up -d --no-build redis worker gateway >"$dir/up2.log" 2>&1 || { cat "$dir/up2.log"; fail "compose up again"; }
wait_served 120 || fail "the gateway did not serve after down/up"
read -r hit tier cached <<<"$(chunk_of "$tmp/answer.json")"
[ "$hit" = true ] && [ "$tier" = disk ] || fail "after down/up the chunk is hit=$hit tier=$tier, not a disk-tier hit"
echo "ok: hit from the disk tier after down/up ($cached cached tokens)"
wait_healthy worker 60
wait_healthy gateway 60

phase "a mounted sharded checkpoint is loaded and never touched"
mkdir -p "$tmp/sharded"
chown 10001:10001 "$tmp/sharded"
podman run --rm -v "$tmp/sharded:/out" chunkgate-worker:local \
    chunkgate-worker generate-model --out /out/model --shards 2 >"$dir/sharded-gen.log" 2>&1 ||
    { cat "$dir/sharded-gen.log"; fail "\`podman run IMAGE chunkgate-worker generate-model\` failed"; }
m="$tmp/sharded/model"
[ -f "$m/model.safetensors.index.json" ] && [ ! -e "$m/model.safetensors" ] || fail "no sharded checkpoint: $(ls "$m")"
echo "my notes" >"$m/NOTES.txt"
tree_sum() { (cd "$1" && find . -printf '%y %p %s %u:%g %m\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
before=$(tree_sum "$m")
# (podman complains on stderr that without systemd it cannot time the health checks.)
podman run -d --name cgcheck-sharded -v "$m:/models/chunkgate-tiny" chunkgate-worker:local \
    >/dev/null 2>"$dir/sharded-run.log"
end=$((SECONDS + 60))
until podman healthcheck run cgcheck-sharded >/dev/null 2>&1; do
    [ "$(podman inspect --format '{{.State.Running}}' cgcheck-sharded)" = true ] ||
        { podman logs cgcheck-sharded | tail -n 20; fail "the worker exited on the sharded checkpoint"; }
    [ $SECONDS -lt $end ] || fail "the worker on the sharded checkpoint is not healthy after 60 s"
    sleep 1
done
podman logs cgcheck-sharded 2>&1 | grep -q generating && fail "the entrypoint generated a model over the sharded checkpoint"
podman stop -t 30 cgcheck-sharded >/dev/null 2>>"$dir/sharded-run.log"
[ "$(tree_sum "$m")" = "$before" ] || fail "the sharded checkpoint changed: $(diff <(echo "$before") <(tree_sum "$m") || true)"
echo "ok: the worker served the sharded checkpoint; not a file of it (nor NOTES.txt) changed"

phase "two gateways behind nginx, chunk events on Redis (docker/docker-compose.replicas.yml)"
compose down -v -t 30 >/dev/null 2>&1
export CHUNKGATE_PORT=$(free_port)
gw="http://127.0.0.1:$CHUNKGATE_PORT"
replicas up -d --no-build >"$dir/up-replicas.log" 2>&1 || { cat "$dir/up-replicas.log"; fail "compose up (replicas)"; }
# served once, then twice in a row: round robin has reached both gateways
wait_served 180 || fail "nginx did not serve through a gateway and a worker within 180 s"
end=$((SECONDS + 60))
until ask "$tmp/r1.json" && ask "$tmp/r2.json"; do
    [ $SECONDS -lt $end ] || fail "the two gateways behind nginx do not both serve after 60 s"
    sleep 0.5
done
for i in 1 2 3 4; do
    ask "$tmp/r.json" || fail "request $i through nginx"
    read -r hit tier cached <<<"$(chunk_of "$tmp/r.json")"
    [ "$hit" = true ] || fail "request $i through nginx did not hit (tier $tier)"
done
# Each gateway answered some of them, and learned placements from the workers' events.
metric() { # service, series: its value on that gateway (0 when absent)
    podman exec "$(replicas ps -q "$1")" curl -fsS http://127.0.0.1:8080/metrics |
        awk -v s="$2" '$1 == s {v = $2} END {print v + 0}'
}
for g in gateway-a gateway-b; do
    served=$(metric "$g" 'chunkgate_requests_total{route="completions",code="200"}')
    applied=$(metric "$g" chunkgate_events_applied_total)
    [ "${served%.*}" -gt 0 ] && [ "${applied%.*}" -gt 0 ] ||
        fail "$g: $served completions answered, $applied chunk events applied"
    echo "$g: $served completions answered, $applied chunk events applied"
done
echo "ok: every request after the first hit, through either gateway"
podman kill -s KILL "$(replicas ps -q gateway-a)" >/dev/null
for i in 1 2 3; do
    ask "$tmp/r.json" || fail "request $i through nginx after gateway-a was killed"
done
replicas start gateway-a >/dev/null 2>&1
end=$((SECONDS + 60))
until replicas logs gateway-a 2>&1 | grep -q "chunk events: resuming"; do
    [ $SECONDS -lt $end ] || fail "the restarted gateway-a did not resume the chunk events"
    sleep 1
done
echo "ok: with gateway-a killed nginx served through gateway-b; restarted, gateway-a resumed the events"

phase "done in $((SECONDS - t0)) s; images and disk:"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'chunkgate|redis|nginx|debian' | sort -u
du -sh /var/lib/containers/storage 2>/dev/null || true
