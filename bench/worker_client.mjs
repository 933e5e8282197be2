// Process and HTTP plumbing shared by the serving benchmarks (bench/batching.mjs,
// bench/llamacpp/versus.mjs): start chunkgate-worker / chunkgate on free ports, send completions
// and time every streamed event, read a process's resident memory, summarise samples.
import {spawn} from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import process from "node:process";

export function parseArgs(argv) {
    const a = {_: []};
    for (let i = 0; i < argv.length; i++) {
        const k = argv[i];
        if (!k.startsWith("--")) {
            a._.push(k);
            continue;
        }
        const name = k.slice(2);
        const next = argv[i + 1];
        if (next === undefined || next.startsWith("--")) a[name] = true;
        else a[name] = argv[++i];
    }
    return a;
}

// The options every serving benchmark takes: --build (the build folder), --threads and --reps
// (2 each by default) and --skip (a comma list of the parts not to run).
export function commonOptions(a) {
    return {
        build: a.build ?? "build",
        threads: Number(a.threads ?? 2),
        reps: Number(a.reps ?? 2),
        skip: new Set(String(a.skip ?? "").split(",")),
    };
}

// Progress lines go to stderr; stdout carries the results.
export const log = (s) => process.stderr.write(s + "\n");

export function die(msg) {
    process.stderr.write(`${path.basename(process.argv[1])}: ${msg}\n`);
    process.exit(2);
}

// An xorshift32 stream from seed (0 -> 1): each call gives the next unsigned value.
function xorshift32(seed) {
    let x = (seed >>> 0) || 1;
    return () => {
        x ^= x << 13;
        x >>>= 0;
        x ^= x >>> 17;
        x ^= x << 5;
        x >>>= 0;
        return x;
    };
}

// The prompt ids of bench/llamacpp/llamacpp.mjs: xorshift32 from seed, mapped to [idMin, idMax).
export function randomIds(n, seed, idMin = 1000, idMax = 30000) {
    const next = xorshift32(seed);
    return Array.from({length: n}, () => idMin + (next() % (idMax - idMin)));
}

// Word-like English text of about nWords words (common words: about one token each for
// byte-level BPE vocabularies), seeded, on one line, starting with tag.
const WORDS = ("the harbour survey council records annual report members river bridge budget " +
               "museum archive rainfall gauge valley ferry quorum bylaws data changed water " +
               "city north south east west year month week time people number part place " +
               "case point group problem fact system program question work government").split(" ");
export function words(nWords, seed, tag) {
    const next = xorshift32(seed);
    const out = [tag];
    for (let i = 0; i < nWords; i++) {
        const x = next();
        out.push(WORDS[x % WORDS.length] + (x % 16 === 0 ? "." : ""));
    }
    return out.join(" ");
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

// Starts bin with args, stderr and stdout into logPath; resolves {proc, port} once it logged
// "listening on 127.0.0.1:PORT". Killed with the benchmark.
export async function startServer(bin, args, logPath, env = {}) {
    const log = fs.openSync(logPath, "w");
    const proc = spawn(bin, args, {stdio: ["ignore", log, log], env: {...process.env, ...env}});
    fs.closeSync(log);
    const kill = () => {
        try {
            proc.kill("SIGKILL");
        } catch {}
    };
    process.on("exit", kill);
    for (let i = 0; i < 1200; i++) {
        const m = /listening on 127\.0\.0\.1:(\d+)/.exec(fs.readFileSync(logPath, "utf8"));
        if (m) return {proc, port: Number(m[1]), stop: async () => stopServer(proc)};
        if (proc.exitCode !== null) break;
        await sleep(50);
    }
    kill();
    die(`${bin} did not start; log ${logPath}:\n${fs.readFileSync(logPath, "utf8")}`);
}

async function stopServer(proc) {
    if (proc.exitCode !== null) return;
    const done = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
    await done;
    clearTimeout(t);
}

// GET url until it answers 200 (up to ms).
export async function waitReady(url, ms = 60000) {
    const t0 = Date.now();
    while (Date.now() - t0 < ms) {
        const st = await new Promise((res) => {
            const r = http.get(url, (rs) => {
                rs.resume();
                rs.on("end", () => res(rs.statusCode));
            });
            r.on("error", () => res(0));
        });
        if (st === 200) return;
        await sleep(50);
    }
    die(`${url} never answered 200`);
}

// POSTs body (an object) as JSON to url with stream on. Resolves {status, t0, events: [{t,
// text, finish, data}], usage, first, last, error}: every data event with a choice and its
// arrival time (ms, nowMs's clock), the usage event. first: the arrival of the first such
// event (the first token), last: of the last one with text. opts.signal (an AbortSignal)
// hangs up; the promise then resolves with what had arrived, aborted set.
export function streamCompletion(url, body, opts = {}) {
    return new Promise((resolve) => {
        const t0 = nowMs();
        const out = {status: 0, t0, events: [], usage: null, first: 0, last: 0, body: ""};
        const payload = JSON.stringify({...body, stream: true,
                                        stream_options: {include_usage: true}});
        const u = new URL(url);
        const req = http.request({host: u.hostname, port: u.port, path: u.pathname, method: "POST",
                                  agent: false, signal: opts.signal,
                                  headers: {"Content-Type": "application/json",
                                            "Content-Length": Buffer.byteLength(payload)}},
                                 (rs) => {
            out.status = rs.statusCode;
            let buf = "";
            rs.setEncoding("utf8");
            rs.on("data", (d) => {
                const t = nowMs();
                if (rs.statusCode !== 200) {
                    out.body += d;
                    return;
                }
                buf += d;
                let i;
                while ((i = buf.indexOf("\n\n")) >= 0) {
                    const ev = buf.slice(0, i);
                    buf = buf.slice(i + 2);
                    if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
                    const j = JSON.parse(ev.slice(6));
                    if (j.error) out.error = j.error;
                    if (j.usage) out.usage = j.usage;
                    const c = j.choices && j.choices[0];
                    if (!c) continue;
                    if (!out.first) out.first = t;
                    const e = {t, text: c.text ?? "", finish: c.finish_reason ?? null, data: j};
                    if (e.text) out.last = t;
                    out.events.push(e);
                    if (opts.onEvent) opts.onEvent(e, out);
                }
            });
            rs.on("end", () => resolve(out));
            rs.on("error", () => resolve({...out, aborted: true}));
        });
        req.on("error", (e) => resolve({...out, aborted: opts.signal?.aborted ?? false,
                                        error: out.error ?? String(e)}));
        req.end(payload);
    });
}

// VmRSS and VmHWM of pid, in MiB (from /proc/PID/status).
export function memMiB(pid) {
    const s = fs.readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = (k) => Number((new RegExp(`${k}:\\s+(\\d+)`).exec(s) || [0, 0])[1]);
    return {rss: kb("VmRSS") / 1024, hwm: kb("VmHWM") / 1024};
}

export function loadavg() {
    return os.loadavg()[0];
}

export function median(xs) {
    const s = [...xs].sort((a, b) => a - b);
    const n = s.length;
    return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : NaN;
}

export function percentile(xs, p) {
    const s = [...xs].sort((a, b) => a - b);
    if (!s.length) return NaN;
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

export function tmpDir(prefix) {
    return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}
