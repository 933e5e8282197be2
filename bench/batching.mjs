#!/usr/bin/env node
// Serving many requests at once (DESIGN §14) on one chunkgate-worker: continuous batching,
// chunked prefill between decode steps, TTFT under load. Every figure is a ratio against a
// baseline measured in the same run on the same worker.
//   1. aggregate decode tokens/s with C concurrent streams (C in --streams), against C = 1:
//      all streams start together (a --prompt-token prompt each, greedy, --decode tokens); the
//      rate counts the tokens of every stream inside the window where all C are decoding.
//   2. the longest gap between two tokens of --gap-streams running streams while a cold
//      request with --docs documents of --doc-words words (a "# #" prompt, max_tokens 1)
//      prefills, against that request's solo prefill time (the same shape, cold, idle
//      worker); for each --chunks pair prefill-chunk:prefill-budget (a worker per pair).
//   3. TTFT of --short-requests short requests (a --prompt-token prompt, max_tokens 1), one
//      after another, while --load-streams streams decode, against the same requests on the
//      idle worker: p50 and p99.
//
//   node bench/batching.mjs --model-dir DIR [--build build] [--threads 2] [--reps 2]
//       [--streams 1,2,4,8,16] [--decode 64] [--prompt 16] [--gap-streams 4] [--docs 8]
//       [--doc-words 200] [--chunks 256:256,128:128,512:512] [--load-streams 8]
//       [--short-requests 24] [--skip batch,gap,ttft] [--json out.json]
import fs from "node:fs";
import path from "node:path";
import process from "node:process";

import {commonOptions, die, loadavg, log, median, nowMs, parseArgs, percentile, randomIds, sleep,
        startServer, streamCompletion, tmpDir, waitReady, words} from "./worker_client.mjs";

const a = parseArgs(process.argv.slice(2));
if (!a["model-dir"]) die("--model-dir DIR is required");
const {build, threads, reps, skip} = commonOptions(a);
const streamCounts = String(a.streams ?? "1,2,4,8,16").split(",").map(Number);
const nDecode = Number(a.decode ?? 64);
const promptLen = Number(a.prompt ?? 16);
const gapStreams = Number(a["gap-streams"] ?? 4);
const nDocs = Number(a.docs ?? 8);
const docWords = Number(a["doc-words"] ?? 200);
const chunkPairs = String(a.chunks ?? "256:256,128:128,512:512").split(",")
    .map((p) => p.split(":").map(Number));
const loadStreams = Number(a["load-streams"] ?? 8);
const nShort = Number(a["short-requests"] ?? 24);
const LONG = 8192; // max_tokens of streams that are hung up once measured
const fmt = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "-");

const tmp = tmpDir("cg-batching-");
const workerBin = path.join(build, "worker/chunkgate-worker");
if (!fs.existsSync(workerBin)) die(`${workerBin} is missing: build first`);
const config = JSON.parse(fs.readFileSync(path.join(a["model-dir"], "config.json"), "utf8"));
const modelId = config._name_or_path;
// Prompt ids inside the vocabulary: [1000, 30000) on a real vocabulary, bytes on the tiny
// model's (256 bytes, then BOS and EOS).
const idMin = config.vocab_size > 30000 ? 1000 : 32;
const idMax = config.vocab_size > 30000 ? 30000 : 256;
const promptIds = (n, seed) => randomIds(n, seed, idMin, idMax);
let nWorkers = 0;

async function openWorker(chunk = 256, budget = 256) {
    const max = Math.max(...streamCounts, loadStreams, gapStreams) + 1;
    const dir = path.join(tmp, `w${nWorkers++}`);
    const w = await startServer(workerBin,
        ["serve", "--model", a["model-dir"], "--listen", "127.0.0.1:0", "--data-dir", dir,
         "--prefill-chunk", String(chunk), "--prefill-budget", String(budget),
         "--max-running", String(max)],
        `${dir}.log`, {OMP_NUM_THREADS: String(threads)});
    w.url = `http://127.0.0.1:${w.port}/v1/completions`;
    await waitReady(`http://127.0.0.1:${w.port}/healthz`);
    // warm-up: weights paged in
    await streamCompletion(w.url, {model: modelId, prompt: promptIds(16, 99), max_tokens: 2,
                                   temperature: 0});
    return w;
}

// A decoding stream: prompt of promptLen ids from seed, greedy, max tokens; abort() hangs up.
function decodeStream(w, seed, max) {
    const ac = new AbortController();
    const p = streamCompletion(w.url, {model: modelId, prompt: promptIds(promptLen, seed),
                                       max_tokens: max, temperature: 0}, {signal: ac.signal});
    return {p, abort: () => ac.abort()};
}

const out = {threads, reps, model: modelId, load_before: loadavg(), batch: [], gap: [], ttft: []};

// A stream that must outlast the measurement: one that ends before it is hung up fails the run.
const ended = {n: 0, why: "", check() { if (this.n) die(`a load stream ended early: ${this.why}`); }};
function running(url, body, opts) {
    return streamCompletion(url, body, opts).then((r) => {
        if (!r.aborted && !opts.signal.aborted) {
            ended.n++;
            ended.why = `${r.status} ${r.body || JSON.stringify(r.error ?? r.events.at(-1)?.finish)}`;
            die(`a load stream ended early: ${ended.why}`);
        }
        return r;
    });
}

// ---------------------------------------------------------------- 1. aggregate decode rate
async function aggregate(w, c, rep) {
    const ss = Array.from({length: c}, (_, i) => decodeStream(w, 1000 * rep + 17 * i + 3, nDecode));
    const rs = await Promise.all(ss.map((s) => s.p));
    for (const r of rs) if (r.status !== 200) die(`stream failed: ${r.status} ${r.body}`);
    const start = Math.max(...rs.map((r) => r.first));
    const end = Math.min(...rs.map((r) => r.events.at(-1).t));
    let n = 0;
    for (const r of rs) n += r.events.filter((e) => e.text && e.t > start && e.t <= end).length;
    const tokens = rs.reduce((s, r) => s + (r.usage?.completion_tokens ?? 0), 0);
    return {streams: c, rep, window_s: (end - start) / 1e3, window_tokens: n,
            tok_s: n / ((end - start) / 1e3), completion_tokens: tokens, load: loadavg()};
}

if (!skip.has("batch")) {
    const w = await openWorker();
    for (let rep = 0; rep < reps; rep++) {
        const order = rep % 2 ? [...streamCounts].reverse() : streamCounts;
        for (const c of order) {
            const r = await aggregate(w, c, rep);
            out.batch.push(r);
            log(`batch rep ${rep}: ${c} streams ${fmt(r.tok_s)} tok/s (${r.window_tokens} tokens in ` +
                `${fmt(r.window_s, 2)} s, load ${fmt(r.load)})`);
        }
    }
    await w.stop();
}

// ---------------------------------------------------------------- 2. gaps during a cold prefill
let ragN = 0;
function ragPrompt() {
    const tag = `cold ${process.pid}.${ragN++}`;
    const parts = [words(30, ragN, `You are a careful assistant (${tag}):`)];
    for (let i = 0; i < nDocs; i++) parts.push(words(docWords, 97 * ragN + i, `Document ${i + 1} (${tag}):`));
    parts.push("What changed in the budget?");
    return parts.join(" # # ");
}

async function coldRequest(w) {
    const r = await streamCompletion(w.url, {model: modelId, prompt: ragPrompt(), max_tokens: 1,
                                             temperature: 0});
    if (r.status !== 200 || !r.first) die(`cold request failed: ${r.status} ${r.body}`);
    return {t0: r.t0, first: r.first, ttft_s: (r.first - r.t0) / 1e3,
            prompt_tokens: r.usage?.prompt_tokens};
}

// Streams decoding (their token arrival times recorded), a cold request in the middle.
async function gapMeasure(w, rep) {
    const acs = [], times = [], ps = [];
    for (let i = 0; i < gapStreams; i++) {
        const ac = new AbortController();
        const t = [];
        acs.push(ac);
        times.push(t);
        ps.push(running(w.url, {model: modelId, prompt: promptIds(promptLen, 5000 + 31 * i + rep),
                                         max_tokens: LONG, temperature: 0},
                                 {signal: ac.signal, onEvent: (e) => t.push(e.t)}));
    }
    // every stream decoding, and a few steps to measure the undisturbed gap
    while (times.some((t) => t.length < 6)) await sleep(20);
    ended.check();
    const cold = await coldRequest(w);
    await sleep(300);
    for (const ac of acs) ac.abort();
    await Promise.all(ps);
    let maxGap = 0;
    const steady = [];
    for (const t of times) {
        for (let k = 1; k < t.length; k++) {
            const g = t[k] - t[k - 1];
            // a gap overlapping the cold request's prefill [t0, first]
            if (t[k] > cold.t0 && t[k - 1] < cold.first) maxGap = Math.max(maxGap, g);
            else if (t[k] <= cold.t0) steady.push(g);
        }
    }
    return {cold, max_gap_s: maxGap / 1e3, steady_gap_s: median(steady) / 1e3};
}

if (!skip.has("gap")) {
    for (const [chunk, budget] of chunkPairs) {
        const w = await openWorker(chunk, budget);
        for (let rep = 0; rep < reps; rep++) {
            const row = {chunk, budget, rep, load: loadavg()};
            if (rep % 2 === 0) {
                row.solo = await coldRequest(w);
                Object.assign(row, await gapMeasure(w, rep));
            } else {
                Object.assign(row, await gapMeasure(w, rep));
                row.solo = await coldRequest(w);
            }
            row.gap_over_solo = row.max_gap_s / row.solo.ttft_s;
            row.ttft_over_solo = row.cold.ttft_s / row.solo.ttft_s;
            out.gap.push(row);
            log(`gap chunk ${chunk} budget ${budget} rep ${rep}: solo prefill ${fmt(row.solo.ttft_s, 2)} s ` +
                `(${row.solo.prompt_tokens} tokens), under ${gapStreams} streams ${fmt(row.cold.ttft_s, 2)} s; ` +
                `max gap ${fmt(row.max_gap_s * 1e3, 0)} ms = ${fmt(100 * row.gap_over_solo)}% of solo ` +
                `(steady gap ${fmt(row.steady_gap_s * 1e3, 0)} ms, load ${fmt(row.load)})`);
        }
        await w.stop();
    }
}

// ---------------------------------------------------------------- 3. TTFT under load
async function shortTtfts(w, seed0) {
    const t = [];
    for (let i = 0; i < nShort; i++) {
        const r = await streamCompletion(w.url, {model: modelId, prompt: promptIds(promptLen, seed0 + i),
                                                 max_tokens: 1, temperature: 0});
        if (r.status !== 200 || !r.first) die(`short request failed: ${r.status} ${r.body}`);
        t.push((r.first - r.t0) / 1e3);
        await sleep(50 + ((seed0 + i) * 37) % 150); // arrivals spread over the decode steps
    }
    return t;
}

if (!skip.has("ttft")) {
    const w = await openWorker();
    for (let rep = 0; rep < reps; rep++) {
        const row = {rep, load_streams: loadStreams, load: loadavg()};
        const loaded = async () => {
            const acs = [], ps = [], counts = [];
            for (let i = 0; i < loadStreams; i++) {
                const ac = new AbortController();
                acs.push(ac);
                counts.push(0);
                ps.push(running(w.url, {model: modelId,
                                                 prompt: promptIds(promptLen, 7000 + 13 * i + rep),
                                                 max_tokens: LONG, temperature: 0},
                                         {signal: ac.signal, onEvent: () => counts[i]++}));
            }
            while (counts.some((c) => c < 3)) await sleep(20);
            ended.check();
            const c0 = counts.reduce((s, c) => s + c, 0), t0 = nowMs();
            row.loaded = await shortTtfts(w, 9000 + 100 * rep);
            row.load_decode_tok_s = (counts.reduce((s, c) => s + c, 0) - c0) / ((nowMs() - t0) / 1e3);
            for (const ac of acs) ac.abort();
            await Promise.all(ps);
        };
        const idle = async () => (row.idle = await shortTtfts(w, 9000 + 100 * rep));
        if (rep % 2 === 0) await idle(), await loaded();
        else await loaded(), await idle();
        for (const k of ["idle", "loaded"]) {
            row[`${k}_p50_s`] = median(row[k]);
            row[`${k}_p99_s`] = percentile(row[k], 99);
        }
        out.ttft.push(row);
        log(`TTFT rep ${rep}: idle p50 ${fmt(row.idle_p50_s * 1e3, 0)} ms p99 ${fmt(row.idle_p99_s * 1e3, 0)} ms; ` +
            `under ${loadStreams} streams p50 ${fmt(row.loaded_p50_s * 1e3, 0)} ms p99 ` +
            `${fmt(row.loaded_p99_s * 1e3, 0)} ms (streams ran at ${fmt(row.load_decode_tok_s)} tok/s, load ${fmt(row.load)})`);
    }
    await w.stop();
}
out.load_after = loadavg();

// ---------------------------------------------------------------- summary
const bm = (xs, d = 1, best = Math.max) => `${fmt(best(...xs), d)} / ${fmt(median(xs), d)}`;
if (out.batch.length) {
    console.log(`\n| streams | aggregate decode tok/s (best / median) | x 1 stream (best / median, same rep) |`);
    console.log(`|---|---|---|`);
    for (const c of streamCounts) {
        const r = out.batch.filter((x) => x.streams === c);
        const ratio = r.map((x) => x.tok_s / out.batch.find((y) => y.rep === x.rep && y.streams === 1)?.tok_s);
        console.log(`| ${c} | ${bm(r.map((x) => x.tok_s))} | ${bm(ratio, 2)} |`);
    }
}
if (out.gap.length) {
    console.log(`\n| prefill-chunk:budget | solo prefill s (tokens) | under ${gapStreams} streams s | steady gap ms | max gap ms | max gap / solo (best / median) |`);
    console.log(`|---|---|---|---|---|---|`);
    for (const [chunk, budget] of chunkPairs) {
        const r = out.gap.filter((x) => x.chunk === chunk && x.budget === budget);
        console.log(`| ${chunk}:${budget} | ${bm(r.map((x) => x.solo.ttft_s), 2, Math.min)} (${r[0].solo.prompt_tokens}) | ` +
                    `${bm(r.map((x) => x.cold.ttft_s), 2, Math.min)} | ${bm(r.map((x) => x.steady_gap_s * 1e3), 0, Math.min)} | ` +
                    `${bm(r.map((x) => x.max_gap_s * 1e3), 0, Math.min)} | ${bm(r.map((x) => 100 * x.gap_over_solo), 1, Math.min)}% |`);
    }
}
if (out.ttft.length) {
    const g = (k) => out.ttft.map((x) => x[k] * 1e3);
    console.log(`\n| short request TTFT ms (${nShort} per rep) | p50 (best / median) | p99 (best / median) |`);
    console.log(`|---|---|---|`);
    console.log(`| idle worker | ${bm(g("idle_p50_s"), 0, Math.min)} | ${bm(g("idle_p99_s"), 0, Math.min)} |`);
    console.log(`| ${loadStreams} streams decoding | ${bm(g("loaded_p50_s"), 0, Math.min)} | ${bm(g("loaded_p99_s"), 0, Math.min)} |`);
}
console.log(`load average ${fmt(out.load_before)} -> ${fmt(out.load_after)}`);
const json = JSON.stringify(out);
if (a.json) fs.writeFileSync(a.json, json + "\n");
console.log(json);
fs.rmSync(tmp, {recursive: true, force: true});
