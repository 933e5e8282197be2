#!/usr/bin/env bash
# Checks docker/ without a Docker engine: `docker-compose config` validates the compose file;
# then every path and port it names must exist in the project and agree with the Dockerfile,
# prometheus.yml, the Grafana provisioning and the binaries' own --help (env variables); the
# runtime image must install the package of every shared library the binaries link; and the
# container ENTRYPOINT + CMD and HEALTHCHECK are run for real against the built binaries (the
# check follows a --listen flag over the variable).
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
docker-compose -f docker/docker-compose.replicas.yml config -q

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
                  "health": None, "entrypoint": None, "cmd": None, "copy": [], "apt": [],
                  "run": []}
            stages[st["name"] or f"#{len(stages)}"] = st
        elif word == "ENV":
            for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                st["env"][k] = v.strip('"')
        elif word == "EXPOSE":
            st["expose"] += rest.split()
        elif word == "USER":
            st["user"] = rest.strip()
        elif word == "HEALTHCHECK":
            h = re.sub(r"^(--\S+\s+)*CMD\s+", "", rest.strip())
            st["health"] = json.loads(h) if h.startswith("[") else ["sh", "-c", h]
        elif word == "ENTRYPOINT":
            st["entrypoint"] = json.loads(rest)
        elif word == "CMD":
            st["cmd"] = json.loads(rest)
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
    # ENTRYPOINT + CMD: `docker run IMAGE COMMAND...` replaces only the CMD (the role).
    check(chain[0]["entrypoint"] == ["chunkgate-entrypoint"] and chain[0]["cmd"] == [name],
          f"{name}: ENTRYPOINT {chain[0]['entrypoint']} CMD {chain[0]['cmd']}, expected "
          f"[\"chunkgate-entrypoint\"] and [\"{name}\"]")
    check(user == "10001:10001", f"{name}: runs as {user}, not 10001:10001 (numeric: bind mounts)")
    check(any(re.search(r"groupadd --gid 10001 chunkgate", r) and
              re.search(r"useradd --uid 10001 --gid 10001 ", r) for s in chain for r in s["run"]),
          f"{name}: the chunkgate user is not created as 10001:10001")
    # Every ENV the image or the compose file sets for chunkgate must be a real option.
    svc_env = {k: v for k, v in (svc.get("environment") or {}).items()}
    for k in list(env) + list(svc_env):
        if k.startswith("CHUNKGATE_"):
            check(k in envs_for[name], f"{name}: {k} is not an option of the binary (--help)")
    if name == "worker":
        check(int(env.get("CHUNKGATE_WORKER_DISK_MB", "0")) > 0, "worker: the image has no disk tier by default")
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
        # The check must follow the program's real --listen, not a variable (run below).
        check(chain[0]["health"] == ["chunkgate-entrypoint", "healthcheck"],
              f"{name}: HEALTHCHECK is {chain[0]['health']}, not chunkgate-entrypoint healthcheck")
    with open(os.path.join(tmp, f"{name}.stage"), "w") as f:
        json.dump({"health": chain[0]["health"], "entrypoint": chain[0]["entrypoint"],
                   "cmd": chain[0]["cmd"], "env": env}, f)

listen_ports = {n: port_of((services[n].get("environment") or {}).get(listen_var[n], "x:0"))
                for n in ("gateway", "worker")}
listen_ports.update(prometheus="9090", grafana="3000", redis="6379")  # the images' defaults

for df, stages in stages_by_file.items():
    build = stages.get("build")
    if check(build is not None, f"{rel(df)}: no stage named build"):
        # The build stage installs what scripts/deps.sh installs to build.
        deps = open(os.path.join(root, "scripts/deps.sh")).read()
        pkgs = re.search(r"PKGS=\(([^)]*)\)", deps, re.S).group(1).split()
        need = [p for p in pkgs if p.endswith("-dev") or p in ("build-essential", "cmake", "pkg-config")]
        for p in need:
            check(p in build["apt"], f"{rel(df)}: build stage does not install {p} (scripts/deps.sh does)")
        # Only the programs: tests/ is not copied (an edit there must not rebuild the image).
        check(any("-DCG_TESTS=OFF" in r for r in build["run"]), f"{rel(df)}: the build stage does not configure with -DCG_TESTS=OFF")
        check(not any(a.startswith("tests") for c in build["copy"] for a in c[:-1]),
              f"{rel(df)}: the build stage copies tests/")
        check("check" not in build["apt"], f"{rel(df)}: the build stage installs check (tests are off)")
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
check(arg("--protected-mode") == "no", "redis: protected mode is on (Debian's redis-server then refuses the worker's container)")
# podman without systemd runs no health checks: a service_healthy condition would wait forever.
for name, svc in services.items():
    dep = svc.get("depends_on") or {}
    for d, cond in (dep.items() if isinstance(dep, dict) else []):
        check((cond or {}).get("condition") != "service_healthy",
              f"{name}: waits for {d} to be healthy (podman without systemd never reports it)")
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

echo "== ENTRYPOINT + CMD and HEALTHCHECK, run against the built binaries"
bin="$tmp/bin"
mkdir -p "$bin"
ln -s "$CHUNKGATE_BIN" "$bin/chunkgate"
ln -s "$CHUNKGATE_WORKER_BIN" "$bin/chunkgate-worker"
ln -s "$root/docker/entrypoint.sh" "$bin/chunkgate-entrypoint"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
stage_json() { python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))[sys.argv[2]]))' "$tmp/$1.stage" "$2"; }
# Starts a stage as the image would: ENTRYPOINT, then CMD or the given command; pid in $started.
start_stage() { # stage, log, env assignments..., -- [command args...]
    local stage=$1 log=$2; shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    local -a cmd
    read -r -a ep <<<"$(stage_json "$stage" entrypoint)"
    if [ $# -gt 0 ]; then cmd=("$@"); else read -r -a cmd <<<"$(stage_json "$stage" cmd)"; fi
    env "${envs[@]}" "${ep[@]}" "${cmd[@]}" >"$log" 2>&1 &
    started=$!
    pids+=("$started")
}
# Runs the stage's HEALTHCHECK (exec form) for the process pid, as Docker runs it in the container.
healthcheck() { # stage, pid, env assignments...
    local stage=$1 pid=$2; shift 2
    local -a cmd
    read -r -a cmd <<<"$(stage_json "$stage" health)"
    env "$@" CHUNKGATE_HEALTH_PID="$pid" "${cmd[@]}"
}
wait_healthy() { # stage, pid, log, env assignments...
    local stage=$1 pid=$2 log=$3; shift 3
    for _ in $(seq 1 150); do
        healthcheck "$stage" "$pid" "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || { echo "FAIL: the $stage entrypoint exited"; cat "$log"; return 1; }
        sleep 0.1
    done
    echo "FAIL: the $stage HEALTHCHECK never passed"
    cat "$log"
    return 1
}
wport=$(free_port)
gport=$(free_port)
closed=$(free_port)
# The image's variables, with the listen port closed: the worker is given --listen, and its
# HEALTHCHECK must follow the flag, not the variable.
wenv=(PATH="$bin:$PATH" OMP_WAIT_POLICY=passive CHUNKGATE_WORKER_LISTEN="127.0.0.1:$closed"
      CHUNKGATE_WORKER_MODEL="$tmp/models/chunkgate-tiny" CHUNKGATE_WORKER_DATA_DIR="$tmp/worker"
      CHUNKGATE_WORKER_POOL_MB=32)
mkdir -p "$tmp/models"
start_stage worker "$tmp/worker.log" "${wenv[@]}" -- worker --listen "127.0.0.1:$wport"
wpid=$started
wait_healthy worker "$wpid" "$tmp/worker.log" "${wenv[@]}"
curl -fsS "http://127.0.0.1:$wport/healthz" >/dev/null || { echo "FAIL: the worker is not on its --listen port"; exit 1; }
[ -f "$tmp/models/chunkgate-tiny/config.json" ] && [ -f "$tmp/models/chunkgate-tiny/model.safetensors" ] || {
    echo "FAIL: the worker entrypoint did not generate the model"; exit 1; }
ls -A "$tmp/models" "$tmp/models/chunkgate-tiny" | grep -q 'chunkgate-generate' && { echo "FAIL: a temporary model dir was left behind"; exit 1; }
# The gateway by its CMD alone, listening where its variable says. The check reads the address
# from the gateway's own environment: the checker's empty variable must not make it probe port 80.
genv=(PATH="$bin:$PATH" CHUNKGATE_LISTEN="127.0.0.1:$gport" CHUNKGATE_WORKERS="http://127.0.0.1:$wport"
      CHUNKGATE_DATA_DIR="$tmp/gateway")
start_stage gateway "$tmp/gateway.log" "${genv[@]}" --
gpid=$started
wait_healthy gateway "$gpid" "$tmp/gateway.log" "${genv[@]}"
healthcheck gateway "$gpid" "${genv[@]}" CHUNKGATE_LISTEN= >/dev/null 2>&1 || {
    echo "FAIL: the gateway HEALTHCHECK follows the checker's (empty) variable, not the gateway's"; exit 1; }
curl -fsS "http://127.0.0.1:$gport/readyz" >/dev/null || { echo "FAIL: gateway not ready with the worker"; cat "$tmp/gateway.log"; exit 1; }
# A second start reuses the generated model (its bytes stay the same); a stopped program fails
# its check.
sum1=$(sha256sum "$tmp/models/chunkgate-tiny/model.safetensors")
kill "$gpid" "$wpid"
wait "$gpid" "$wpid" 2>/dev/null || true
if healthcheck worker "$wpid" "${wenv[@]}" >/dev/null 2>&1; then
    echo "FAIL: the worker HEALTHCHECK passes with the worker stopped"
    exit 1
fi
pids=()
start_stage worker "$tmp/worker2.log" "${wenv[@]}" -- worker "--listen=127.0.0.1:$wport"
wpid=$started
wait_healthy worker "$wpid" "$tmp/worker2.log" "${wenv[@]}"
grep -q "generating" "$tmp/worker2.log" && { echo "FAIL: the model was generated again"; exit 1; }
[ "$sum1" = "$(sha256sum "$tmp/models/chunkgate-tiny/model.safetensors")" ] || { echo "FAIL: the model changed"; exit 1; }
# A command instead of the CMD: generate-model runs, as README documents.
start_stage worker "$tmp/gen.log" "${wenv[@]}" -- chunkgate-worker generate-model --out "$tmp/models/other"
wait "$started" || { echo "FAIL: \`IMAGE chunkgate-worker generate-model\` failed"; cat "$tmp/gen.log"; exit 1; }
[ -f "$tmp/models/other/config.json" ] || { echo "FAIL: generate-model as a command wrote no model"; exit 1; }
echo "ok: ENTRYPOINT + CMD start both programs or a command, the model is generated once, HEALTHCHECK follows --listen and passes only when serving"
