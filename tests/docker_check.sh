#!/usr/bin/env bash
# Checks docker/ without a Docker engine: `docker-compose config` validates the compose file;
# then every path and port it names must exist in the project and agree with the Dockerfile,
# prometheus.yml, the Grafana provisioning and the binaries' own --help (env variables); the
# runtime image must install the package of every shared library the binaries link; and the
# container entrypoint and HEALTHCHECK commands are run for real against the built binaries.
# Exit 77 (ctest: skipped) when docker-compose is not installed.
# Environment (set by ctest): CHUNKGATE_BIN, CHUNKGATE_WORKER_BIN.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. "$root/tests/check_lib.sh"
need_tool docker-compose docker-compose
check_start

echo "== docker-compose config"
docker-compose -f docker/docker-compose.yml config -q
docker-compose -f docker/docker-compose.yml config >"$tmp/compose.yml"

echo "== promtool check config"
if command -v promtool >/dev/null; then
    promtool check config docker/prometheus/prometheus.yml
else
    echo "promtool not installed: prometheus.yml checked for paths and ports only"
fi

"$CHUNKGATE_BIN" --help >"$tmp/gateway.help"
"$CHUNKGATE_WORKER_BIN" serve --help >"$tmp/worker.help"
# Shared libraries each binary links directly, as "soname path" (path resolved by ldd). The
# sanitizer runtimes of a CG_SANITIZE build are left out: the image is built without them.
for b in "$CHUNKGATE_BIN" "$CHUNKGATE_WORKER_BIN"; do
    readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -Ev '^lib(a|ub|l|t)san\.' |
    while read -r so; do
        echo "$so $(ldd "$b" | awk -v so="$so" '$1 == so {print $3}')"
    done
done | sort -u >"$tmp/needed"
# The Debian package of each (usrmerge: dpkg may know the file under /lib or /usr/lib).
while read -r so path; do
    # The dynamic loader has no "=> path" in ldd's output; it is libc6's.
    [ -n "${path:-}" ] || { echo "$so libc6"; continue; }
    real=$(readlink -f "$path")
    pkg=""
    for p in "$real" "${real/#\/usr\/lib/\/lib}" "${real/#\/lib/\/usr\/lib}"; do
        pkg=$(dpkg -S "$p" 2>/dev/null | head -n1 | cut -d: -f1) && [ -n "$pkg" ] && break
    done
    echo "$so ${pkg:-?}"
done <"$tmp/needed" >"$tmp/needed_pkgs"

echo "== cross-checks"
python3 - "$root" "$tmp" <<'PY'
import json, os, re, sys, urllib.parse
import yaml

root, tmp = sys.argv[1], sys.argv[2]
errors = []
def check(ok, msg):
    if not ok:
        errors.append(msg)
    return ok

def rel(p):
    return os.path.relpath(p, root)

compose = yaml.safe_load(open(os.path.join(tmp, "compose.yml")))
services = compose["services"]
raw = yaml.safe_load(open(os.path.join(root, "docker/docker-compose.yml")))
check(set(raw["services"]) == {"gateway", "worker", "redis", "prometheus", "grafana"},
      f"compose services are {sorted(raw['services'])}, expected gateway, worker, redis, "
      "prometheus, grafana")

# --- Dockerfile: stages, ENV, EXPOSE, USER, HEALTHCHECK, ENTRYPOINT, COPY, apt packages.
def parse_dockerfile(path):
    lines, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.lstrip().startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append((cur + s).strip())
        cur = ""
    stages, st = {}, None
    for l in lines:
        word, _, rest = l.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest.strip(), re.I)
            st = {"base": m.group(1), "name": m.group(2), "env": {}, "expose": [], "user": None,
                  "health": None, "entrypoint": None, "copy": [], "apt": [], "run": []}
            stages[st["name"] or f"#{len(stages)}"] = st
        elif word == "ENV":
            for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                st["env"][k] = v.strip('"')
        elif word == "EXPOSE":
            st["expose"] += rest.split()
        elif word == "USER":
            st["user"] = rest.strip()
        elif word == "HEALTHCHECK":
            st["health"] = re.sub(r"^(--\S+\s+)*CMD\s+", "", rest.strip())
        elif word == "ENTRYPOINT":
            st["entrypoint"] = json.loads(rest)
        elif word == "COPY":
            st["copy"].append(rest.split())
        elif word == "RUN":
            st["run"].append(rest)
            for m in re.finditer(r"apt-get install ((?:(?!&&).)*)", rest):
                st["apt"] += [t for t in m.group(1).split() if not t.startswith("-")]
    return stages

def env_of(stage_name, stages):
    """ENV of a stage including the stages it is built FROM."""
    env, chain, s = {}, [], stages.get(stage_name)
    while s:
        chain.append(s)
        s = stages.get(s["base"])
    for s in reversed(chain):
        env.update(s["env"])
    return env, chain

def user_of(chain):
    for s in chain:
        if s["user"]:
            return s["user"]
    return "root"

def port_of(addr):
    return addr.rsplit(":", 1)[1]

def container_port(p):
    """The container side of a `ports` entry ("127.0.0.1:8080:8080/tcp" or a mapping)."""
    return str(p["target"] if isinstance(p, dict) else p.split(":")[-1].split("/")[0])

def help_envs(path):
    return set(re.findall(r"`(CHUNKGATE_[A-Z_]+)`", open(path).read()))

gw_envs = help_envs(os.path.join(tmp, "gateway.help"))
wk_envs = help_envs(os.path.join(tmp, "worker.help"))
check("CHUNKGATE_LISTEN" in gw_envs and "CHUNKGATE_WORKER_LISTEN" in wk_envs,
      "could not read the env variables from the binaries' --help")
envs_for = {"gateway": gw_envs, "worker": wk_envs}
listen_var = {"gateway": "CHUNKGATE_LISTEN", "worker": "CHUNKGATE_WORKER_LISTEN"}

stages_by_file = {}
for name in ("gateway", "worker"):
    svc = services[name]
    b = svc.get("build")
    if not check(b is not None, f"{name}: no build section"):
        continue
    ctx = b["context"]
    check(os.path.realpath(ctx) == root, f"{name}: build context {ctx} is not the project root")
    df = os.path.join(ctx, b.get("dockerfile", "Dockerfile"))
    if not check(os.path.isfile(df), f"{name}: Dockerfile {df} does not exist"):
        continue
    stages = stages_by_file.setdefault(df, parse_dockerfile(df))
    target = b.get("target")
    if not check(target in stages, f"{name}: target {target} is not a stage of {rel(df)}"):
        continue
    env, chain = env_of(target, stages)
    for s in chain:
        check(s["base"] in stages or re.fullmatch(r"debian:(12|bookworm)(-slim)?", s["base"]),
              f"{rel(df)}: stage {s['name']} is based on {s['base']}, not Debian 12")
    check(not any(s["base"].startswith("debian:12") and not s["base"].endswith("-slim")
                  for s in chain), f"{name}: runtime image is not based on debian:12-slim")
    user = user_of(chain)
    check(user not in ("root", "0", "0:0"), f"{name}: the image runs as {user}")
    check(chain[0]["health"], f"{name}: stage {target} has no HEALTHCHECK")
    check(chain[0]["entrypoint"], f"{name}: stage {target} has no ENTRYPOINT")
    # Every ENV the image or the compose file sets for chunkgate must be a real option.
    svc_env = {k: v for k, v in (svc.get("environment") or {}).items()}
    for k in list(env) + list(svc_env):
        if k.startswith("CHUNKGATE_"):
            check(k in envs_for[name], f"{name}: {k} is not an option of the binary (--help)")
    lv = listen_var[name]
    listen = svc_env.get(lv, env.get(lv))
    if check(listen, f"{name}: {lv} is not set (the binary's default listens on 127.0.0.1 only)"):
        check(listen.startswith("0.0.0.0:"), f"{name}: {lv}={listen} is not reachable from other containers")
        port = port_of(listen)
        exposed = set(chain[0]["expose"]) | {str(p) for p in svc.get("expose", [])}
        check(port in exposed, f"{name}: listens on {port}, exposes {sorted(exposed)}")
        for p in svc.get("ports", []):
            target_port = container_port(p)
            check(target_port == port, f"{name}: publishes container port {target_port}, listens on {port}")
        check(lv in chain[0]["health"] or port in chain[0]["health"],
              f"{name}: HEALTHCHECK does not use the listen port: {chain[0]['health']}")
    with open(os.path.join(tmp, f"{name}.stage"), "w") as f:
        json.dump({"health": chain[0]["health"], "entrypoint": chain[0]["entrypoint"], "env": env}, f)

listen_ports = {n: port_of((services[n].get("environment") or {}).get(listen_var[n], "x:0"))
                for n in ("gateway", "worker")}
listen_ports.update(prometheus="9090", grafana="3000", redis="6379")  # the images' defaults

for df, stages in stages_by_file.items():
    build = stages.get("build")
    if check(build is not None, f"{rel(df)}: no stage named build"):
        # The build stage installs what scripts/deps.sh installs to build.
        deps = open(os.path.join(root, "scripts/deps.sh")).read()
        pkgs = re.search(r"PKGS=\(([^)]*)\)", deps, re.S).group(1).split()
        need = [p for p in pkgs if p.endswith("-dev") or p in ("build-essential", "cmake", "pkg-config", "check")]
        for p in need:
            check(p in build["apt"], f"{rel(df)}: build stage does not install {p} (scripts/deps.sh does)")
    for s in stages.values():
        for args in s["copy"]:
            if any(a.startswith("--from") for a in args):
                continue
            for src in [a for a in args if not a.startswith("--")][:-1]:
                check(os.path.exists(os.path.join(root, src)), f"{rel(df)}: COPY source {src} does not exist")
    # The runtime stage installs the package of every library the binaries link.
    runtime_apt = {p for s in stages.values() if s["name"] != "build" for p in s["apt"]}
    for line in open(os.path.join(tmp, "needed_pkgs")):
        so, pkg = line.split()
        check(pkg == "libc6" or pkg in runtime_apt,
              f"{rel(df)}: the runtime image lacks {pkg} (for {so})")
    check("curl" in runtime_apt, f"{rel(df)}: HEALTHCHECK uses curl, the runtime image lacks it")
    copies = [c for s in stages.values() for c in s["copy"] if not any(a.startswith("--from") for a in c)]
    for s in stages.values():
        for arg in (s["entrypoint"] or [])[:1]:
            srcs = [c for c in copies if c[-1].endswith("/" + arg)]
            if check(srcs, f"{rel(df)}: ENTRYPOINT {arg} is not copied into the image"):
                src = os.path.join(root, srcs[0][-2])
                check(os.access(src, os.X_OK), f"{rel(src)} is not executable")

# --- The gateway finds the worker by service name and port.
gw_env = services["gateway"].get("environment") or {}
for url in (gw_env.get("CHUNKGATE_WORKERS") or "").split(","):
    u = urllib.parse.urlparse(url.strip())
    check(u.hostname in services, f"gateway: worker {url} is not a compose service")
    check(str(u.port) == listen_ports.get(u.hostname), f"gateway: worker {url} does not use the worker's port {listen_ports.get(u.hostname)}")
check(gw_env.get("CHUNKGATE_WORKERS"), "gateway: no CHUNKGATE_WORKERS")

# --- The worker's shared KV tier is the redis service: a URL the worker accepts, pointing at the
# service's port; Redis bounds its memory with allkeys-lru and is not published on the host.
wk_env = services["worker"].get("environment") or {}
remote = wk_env.get("CHUNKGATE_WORKER_REMOTE", "")
u = urllib.parse.urlparse(remote)
if check(u.scheme in ("redis", "redis+cluster"), f"worker: CHUNKGATE_WORKER_REMOTE={remote!r} is not a redis:// URL"):
    check(u.hostname in services, f"worker: remote tier {remote} is not a compose service")
    check(str(u.port) == listen_ports.get(u.hostname), f"worker: remote tier {remote} does not use port {listen_ports.get(u.hostname)}")
    check(not u.username and not u.password, "worker: the remote URL carries credentials")
red = services["redis"]
cmd = [str(a) for a in red.get("command", [])]
def arg(name):
    return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None
check(arg("--maxmemory-policy") == "allkeys-lru", f"redis: maxmemory-policy is {arg('--maxmemory-policy')}, not allkeys-lru")
check(arg("--maxmemory") not in (None, "0"), "redis: no --maxmemory")
check(not red.get("ports"), "redis: published on the host")
check(red.get("healthcheck"), "redis: no healthcheck")
check("redis" in (services["worker"].get("depends_on") or {}), "worker: does not depend on redis")
image = red.get("image", "")
check(re.fullmatch(r"redis:[0-9.]+-bookworm", image), f"redis: image {image} is not a Debian 12 (bookworm) one")

# --- Bind mounts exist in the project; named volumes are declared.
mounts = {}
for name, svc in services.items():
    for v in svc.get("volumes", []):
        src, _, rest = v.partition(":") if isinstance(v, str) else (v.get("source"), None, v.get("target"))
        target = rest.split(":")[0] if isinstance(v, str) else rest
        if src.startswith("/"):
            check(os.path.exists(src), f"{name}: bind mount source {src} does not exist")
            check(os.path.realpath(src).startswith(root + os.sep), f"{name}: bind mount {src} is outside the project")
        else:
            check(src in (compose.get("volumes") or {}), f"{name}: volume {src} is not declared")
        mounts.setdefault(name, {})[target] = src

def host_path(service, container_path):
    """The project file mounted at container_path in service, or None."""
    for target, src in mounts.get(service, {}).items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return src + container_path[len(target):] if src.startswith("/") else None
    return None

check(host_path("worker", "/models") is None and "/models" in mounts.get("worker", {}),
      "worker: /models is not a named volume (the generated model must persist)")
for name in ("gateway", "worker"):
    check("/var/lib/chunkgate" in mounts.get(name, {}), f"{name}: its data dir /var/lib/chunkgate is not a volume")

# --- Prometheus: config file mounted where --config.file says; targets are services:ports.
prom = services["prometheus"]
cfg_arg = next((a.split("=", 1)[1] for a in prom.get("command", []) if a.startswith("--config.file=")),
               "/etc/prometheus/prometheus.yml")
cfg_path = host_path("prometheus", cfg_arg)
if check(cfg_path and os.path.isfile(cfg_path), f"prometheus: {cfg_arg} is not mounted from a project file"):
    pcfg = yaml.safe_load(open(cfg_path))
    jobs = {}
    for sc in pcfg["scrape_configs"]:
        for stc in sc.get("static_configs", []):
            for t in stc["targets"]:
                host, port = t.rsplit(":", 1)
                jobs[sc["job_name"]] = host
                check(host in services, f"prometheus.yml: target {t} is not a compose service")
                check(port == listen_ports.get(host), f"prometheus.yml: target {t}, but {host} listens on {listen_ports.get(host)}")
    check({"gateway", "worker"} <= set(jobs.values()), f"prometheus.yml scrapes {jobs}, not both gateway and worker")
for p in prom.get("ports", []):
    check(container_port(p) == "9090", "prometheus: container port is not 9090")

# --- Grafana: provisioning mounted, datasource points at prometheus, dashboards load.
graf = services["grafana"]
prov = host_path("grafana", "/etc/grafana/provisioning")
if check(prov and os.path.isdir(prov), "grafana: /etc/grafana/provisioning is not mounted from the project"):
    ds_uids = set()
    for f in sorted(os.listdir(os.path.join(prov, "datasources"))):
        for ds in yaml.safe_load(open(os.path.join(prov, "datasources", f)))["datasources"]:
            ds_uids.add(ds["uid"])
            u = urllib.parse.urlparse(ds["url"])
            check(u.hostname in services and str(u.port) == listen_ports.get(u.hostname),
                  f"grafana datasource {ds['name']}: {ds['url']} is not a compose service's port")
    dash_files = []
    for f in sorted(os.listdir(os.path.join(prov, "dashboards"))):
        for pv in yaml.safe_load(open(os.path.join(prov, "dashboards", f)))["providers"]:
            d = host_path("grafana", pv["options"]["path"])
            if check(d and os.path.isdir(d), f"grafana provider {pv['name']}: {pv['options']['path']} is not mounted from the project"):
                dash_files += [os.path.join(d, x) for x in sorted(os.listdir(d)) if x.endswith(".json")]
    check(dash_files, "grafana: no dashboard JSON is provisioned")
    for df in dash_files:
        dash = json.load(open(df))
        for p in dash["panels"]:
            for t in [p] + p.get("targets", []):
                if "datasource" in t:
                    check(t["datasource"].get("uid") in ds_uids,
                          f"{rel(df)}: panel {p['title']!r} uses datasource {t['datasource']}, not a provisioned one")
            check(p.get("targets"), f"{rel(df)}: panel {p['title']!r} has no query")
home = (graf.get("environment") or {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
if home:
    hp = host_path("grafana", home)
    check(hp and os.path.isfile(hp), f"grafana: home dashboard {home} is not a mounted project file")
for p in graf.get("ports", []):
    check(container_port(p) == "3000", "grafana: container port is not 3000")

if errors:
    print("\n".join("FAIL: " + e for e in errors))
    sys.exit(1)
print(f"ok: compose services {sorted(services)}, Dockerfile stages {sorted(s for f in stages_by_file.values() for s in f)}")
PY

echo "== entrypoint and HEALTHCHECK, run against the built binaries"
bin="$tmp/bin"
mkdir -p "$bin"
ln -s "$CHUNKGATE_BIN" "$bin/chunkgate"
ln -s "$CHUNKGATE_WORKER_BIN" "$bin/chunkgate-worker"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Runs the stage's HEALTHCHECK command the way Docker does (sh -c) with the given env.
healthcheck() { # stage, env assignments...
    local stage=$1; shift
    local cmd
    cmd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["health"])' "$tmp/$stage.stage")
    env "$@" sh -c "$cmd"
}
wait_healthy() { # stage, pid, env assignments...
    local stage=$1 pid=$2; shift 2
    for _ in $(seq 1 150); do
        healthcheck "$stage" "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { echo "FAIL: the $stage entrypoint exited"; cat "$tmp/$stage.log"; return 1; }
        sleep 0.1
    done
    echo "FAIL: the $stage HEALTHCHECK never passed"
    cat "$tmp/$stage.log"
    return 1
}
wport=$(free_port)
wenv=(PATH="$bin:$PATH" OMP_WAIT_POLICY=passive CHUNKGATE_WORKER_LISTEN="127.0.0.1:$wport"
      CHUNKGATE_WORKER_MODEL="$tmp/models/chunkgate-tiny" CHUNKGATE_WORKER_DATA_DIR="$tmp/worker"
      CHUNKGATE_WORKER_POOL_MB=32)
mkdir -p "$tmp/models"
if healthcheck worker "${wenv[@]}" >/dev/null 2>&1; then
    echo "FAIL: the worker HEALTHCHECK passes with nothing listening"
    exit 1
fi
env "${wenv[@]}" docker/entrypoint.sh worker >"$tmp/worker.log" 2>&1 &
pids+=($!)
wait_healthy worker "${pids[0]}" "${wenv[@]}"
[ -f "$tmp/models/chunkgate-tiny/config.json" ] && [ -f "$tmp/models/chunkgate-tiny/model.safetensors" ] || {
    echo "FAIL: the worker entrypoint did not generate the model"; exit 1; }
ls "$tmp/models" | grep -q '\.tmp\.' && { echo "FAIL: a temporary model dir was left behind"; exit 1; }
gport=$(free_port)
genv=(PATH="$bin:$PATH" CHUNKGATE_LISTEN="127.0.0.1:$gport" CHUNKGATE_WORKERS="http://127.0.0.1:$wport"
      CHUNKGATE_DATA_DIR="$tmp/gateway")
env "${genv[@]}" docker/entrypoint.sh gateway >"$tmp/gateway.log" 2>&1 &
pids+=($!)
wait_healthy gateway "${pids[1]}" "${genv[@]}"
curl -fsS "http://127.0.0.1:$gport/readyz" >/dev/null || { echo "FAIL: gateway not ready with the worker"; cat "$tmp/gateway.log"; exit 1; }
# A second start reuses the generated model (its bytes stay the same).
sum1=$(sha256sum "$tmp/models/chunkgate-tiny/model.safetensors")
kill "${pids[1]}" "${pids[0]}"
wait "${pids[1]}" "${pids[0]}" 2>/dev/null || true
pids=()
env "${wenv[@]}" docker/entrypoint.sh worker >"$tmp/worker2.log" 2>&1 &
pids+=($!)
wait_healthy worker "${pids[0]}" "${wenv[@]}"
grep -q "generating" "$tmp/worker2.log" && { echo "FAIL: the model was generated again"; exit 1; }
[ "$sum1" = "$(sha256sum "$tmp/models/chunkgate-tiny/model.safetensors")" ] || { echo "FAIL: the model changed"; exit 1; }
echo "ok: entrypoints start both programs, the model is generated once, HEALTHCHECK passes only when serving"
