#!/usr/bin/env node
// chunkgate-worker against llama.cpp in one run, on the same checkpoint (an HF directory and
// its f16 GGUF from bench/gguf_write.py) and the same token ids, both on --threads threads,
// alternating engine by engine so the machine's noise hits both:
//   1. prefill of N ids, cold: the worker gets them as a plain prompt (ids) on POST
//      /v1/completions with max_tokens 1 (one causal forward, no cache); TTFT-derived tokens/s.
//      llama.cpp: evaluateWithoutGeneratingNewTokens on a cleared sequence.
//   2. decode: 1 + D greedy tokens after a 512-id prompt; the D tokens after the first, timed.
//   3. RAG through the gateway (build/server/chunkgate in front of the worker): K documents of
//      about W words; the first request (system 1, documents in order, question 1) is cold
//      and stores them; the second (system 2, documents reordered, question 2) is timed: its
//      TTFT against llama.cpp's cold prefill of as many tokens.
// Plus the worker's resident memory (VmRSS, VmHWM) after start, after the first forward
// (weights paged in), after the longest prefill, after RAG, against weight bytes + pool.
//
//   NODE_LLAMA_CPP_SKIP_DOWNLOAD=true node bench/llamacpp/versus.mjs --model-dir DIR|F.gguf --gguf F
//       [--build build] [--threads 2] [--reps 2] [--prefill 512,4096] [--decode 128]
//       [--docs 4] [--doc-words 1000] [--pool-mb 256] [--skip prefill,decode,rag,llama]
//       [--flash-attention both|off|on|auto] [--llama-threads 1] [--worker-b BIN] [--json out.json]
//       [--quant none|q8|q4] [--bandwidth MiB [--decode-bytes B]] [--worker-timeout-ms 600000]
// --bandwidth runs build/bench/bench_matmul --read-only MiB (a plain read with --threads
// threads) before each decode rep, and gives the worker's decode as GB/s of the bytes a token
// reads (--decode-bytes, else the weights in memory) and as a share of that read.
// --worker-timeout-ms is the gateway's wait for an assemble in part 3: the cold RAG request of a
// 7B model over 16k tokens runs for over half an hour.
// --quant starts the worker(s) with --quant (pass the GGUF of the same bits: gguf_write.py
// --type q8_0 / q4_0). --flash-attention both (the default) gives llama.cpp one context with
// flash attention off and one with it on, per thread count, and every measurement takes the
// faster of the two: llama.cpp at its best.
// --llama-threads adds llama.cpp contexts at other thread counts, measured right after the
// --threads one; the tables give the ratio to --threads and to the best of them. --worker-b
// starts a second chunkgate-worker binary (another build), measured right after the first in
// parts 1 and 2.
// Prints a table per part and one JSON object (--json writes it to a file too).
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

import {commonOptions, die, loadavg, log, median, memMiB, nowMs, parseArgs, randomIds,
        startServer, streamCompletion, tmpDir, waitReady, words} from "../worker_client.mjs";

const a = parseArgs(process.argv.slice(2));
if (!a["model-dir"] || !a.gguf) die("--model-dir DIR and --gguf FILE are required");
const {build, threads, reps, skip} = commonOptions(a);
const lens = String(a.prefill ?? "512,4096").split(",").map(Number);
const nDecode = Number(a.decode ?? 128);
const nDocs = Number(a.docs ?? 4);
const docWords = Number(a["doc-words"] ?? 1000);
const poolMb = Number(a["pool-mb"] ?? 256);
const fa = a["flash-attention"] ?? "both";
const faModes = fa === "both" ? ["off", "on"] : [fa];
const quant = a.quant ?? "none";
const bandwidthMib = Number(a.bandwidth ?? 0);
const workerTimeoutMs = String(a["worker-timeout-ms"] ?? 600000);

// ---------------------------------------------------------------- llama.cpp (in process)

// --skip llama: the worker alone (its speed and memory), no llama.cpp loaded
const noLlama = skip.has("llama");
const llama = noLlama ? null : await getLlama({gpu: false, build: "never", skipDownload: true,
                                               usePrebuiltBinaries: true, maxThreads: threads,
                                               logLevel: LlamaLogLevel.error});
const lmodel = noLlama ? null : await llama.loadModel({modelPath: a.gguf, gpuLayers: 0, useMmap: true});
const ctxSize = Math.max(...lens, 512 + nDecode, nDocs * docWords * 1.3 + 512) + 512;
// One context per thread count: --threads (the comparison) first, then --llama-threads extras.
// llama.cpp's thread pool waits at its barriers by spinning, so on a shared 2-core machine 2
// threads can run far slower than 1: the extra 1-thread baseline shows that.
const llamaThreads = [...new Set([threads, ...String(a["llama-threads"] ?? "").split(",")
                                                   .filter(Boolean).map(Number)])];
const lctxs = [];
for (const t of noLlama ? [] : llamaThreads)
    for (const f of faModes) {
        const ctx = await lmodel.createContext({
            contextSize: Math.ceil(ctxSize), batchSize: 512, threads: {ideal: t, min: t},
            flashAttention: f === "auto" ? "auto" : f === "on", sequences: 1});
        lctxs.push({threads: t, fa: f, key: `${t} thr fa ${f}`, ctx, seq: ctx.getSequence()});
    }

async function llamaPrefillOne(seq, ids) {
    await seq.clearHistory();
    const t0 = nowMs();
    await seq.evaluateWithoutGeneratingNewTokens(ids);
    return (nowMs() - t0) / 1e3;
}

async function llamaDecodeOne(seq, prompt, n) {
    await seq.clearHistory();
    await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
    let k = 0, t0 = 0;
    for await (const tok of seq.evaluate(prompt.slice(-1), {temperature: 0})) {
        void tok;
        if (++k === 1) t0 = nowMs();
        if (k === n + 1) break;
    }
    return {tokens: k - 1, seconds: (nowMs() - t0) / 1e3};
}

// Every llama.cpp context in turn: {"T thr fa F": seconds}; s is the best (fewest seconds) of
// all, s_main the best at --threads (over the flash-attention settings), fa_main its setting.
async function llamaPrefill(ids) {
    const r = {by_ctx: {}};
    if (noLlama) return {...r, s: NaN, s_main: NaN};
    for (const c of lctxs) r.by_ctx[c.key] = await llamaPrefillOne(c.seq, ids);
    r.s = Math.min(...Object.values(r.by_ctx));
    const main = lctxs.filter((c) => c.threads === threads);
    const best = main.reduce((x, c) => (r.by_ctx[c.key] < r.by_ctx[x.key] ? c : x));
    r.s_main = r.by_ctx[best.key];
    r.fa_main = best.fa;
    return r;
}

async function llamaDecode(prompt, n) {
    const r = {by_ctx: {}};
    if (noLlama) return {...r, tok_s: NaN, tok_s_main: NaN};
    for (const c of lctxs) r.by_ctx[c.key] = await llamaDecodeOne(c.seq, prompt, n);
    const rate = (k) => r.by_ctx[k].tokens / r.by_ctx[k].seconds;
    r.tok_s = Math.max(...lctxs.map((c) => rate(c.key)));
    const main = lctxs.filter((c) => c.threads === threads);
    const best = main.reduce((x, c) => (rate(c.key) > rate(x.key) ? c : x));
    r.tok_s_main = rate(best.key);
    r.fa_main = best.fa;
    return r;
}

// ---------------------------------------------------------------- chunkgate (worker + gateway)

const tmp = tmpDir("cg-versus-");
const workerBin = path.join(build, "worker/chunkgate-worker");
const gatewayBin = path.join(build, "server/chunkgate");
for (const b of [workerBin, gatewayBin]) if (!fs.existsSync(b)) die(`${b} is missing: build first`);
// --model-dir may be a .gguf file: the worker then serves the very file llama.cpp maps (one copy
// of the weights in the page cache, which a 7B model on a 24 GB machine needs)
const isGguf = a["model-dir"].endsWith(".gguf");
const weightBytes = isGguf ? fs.statSync(a["model-dir"]).size
    : fs.readdirSync(a["model-dir"]).filter((f) => f.endsWith(".safetensors"))
        .reduce((s, f) => s + fs.statSync(path.join(a["model-dir"], f)).size, 0);
let modelId = isGguf ? null
    : JSON.parse(fs.readFileSync(path.join(a["model-dir"], "config.json"), "utf8"))._name_or_path;

const worker = await startServer(workerBin,
    ["serve", "--model", a["model-dir"], "--listen", "127.0.0.1:0", "--data-dir",
     path.join(tmp, "worker"), "--pool-mb", String(poolMb), "--quant", quant],
    path.join(tmp, "worker.log"), {OMP_NUM_THREADS: String(threads)});
const wurl = `http://127.0.0.1:${worker.port}`;
await waitReady(`${wurl}/healthz`);
const winfo = await (await fetch(`${wurl}/v1/info`)).json();
if (!modelId) modelId = (await (await fetch(`${wurl}/v1/models`)).json()).data[0].id;
// under --quant the weights in memory are the quantised copy the worker logs at start
const logged = fs.readFileSync(path.join(tmp, "worker.log"), "utf8").match(/weights \w+ \((\d+) MiB/);
const mem = {weights_mib: quant !== "none" && logged ? Number(logged[1]) : weightBytes / 2 ** 20, pool_mib: poolMb, after_start: memMiB(worker.proc.pid)};
// --worker-b BIN: another build of the worker, measured right after this one (prefill, decode)
let wurlB = null, workerB = null;
if (a["worker-b"]) {
    workerB = await startServer(a["worker-b"],
        ["serve", "--model", a["model-dir"], "--listen", "127.0.0.1:0", "--data-dir",
         path.join(tmp, "worker-b"), "--pool-mb", String(poolMb), "--quant", quant],
        path.join(tmp, "worker-b.log"), {OMP_NUM_THREADS: String(threads)});
    wurlB = `http://127.0.0.1:${workerB.port}`;
    await waitReady(`${wurlB}/healthz`);
}

async function workerPrefill(ids, url = wurl) {
    const r = await streamCompletion(`${url}/v1/completions`,
                                     {model: modelId, prompt: ids, max_tokens: 1, temperature: 0});
    if (r.status !== 200 || !r.first) die(`worker prefill failed: ${r.status} ${r.body ?? r.error}`);
    return (r.first - r.t0) / 1e3;
}

async function workerDecode(prompt, n, url = wurl) {
    const r = await streamCompletion(`${url}/v1/completions`,
                                     {model: modelId, prompt, max_tokens: n + 1, temperature: 0});
    if (r.status !== 200 || !r.first) die(`worker decode failed: ${r.status} ${r.body ?? r.error}`);
    const fin = r.events.at(-1).t;
    const tokens = (r.usage?.completion_tokens ?? 1) - 1;
    return {tokens, seconds: (fin - r.first) / 1e3};
}

// warm-up of both: every weight page touched once
await llamaPrefill(randomIds(16, 99));
await workerPrefill(randomIds(16, 99));
if (wurlB) await workerPrefill(randomIds(16, 99), wurlB);
mem.after_first_forward = memMiB(worker.proc.pid);

const out = {threads, reps, load_before: loadavg(), model: modelId, gguf: a.gguf, quant,
             worker_weights_dtype: winfo.weights_dtype,
             worker_kernels: (fs.readFileSync(path.join(tmp, "worker.log"), "utf8")
                 .match(/kernels (\w+)/) ?? [])[1],
             llama_cpp_release: llama?.llamaCppRelease, llama_cpu_variant: llamaCpuVariant(),
             flash_attention: faModes,
             llama_threads: llamaThreads,
             prefill: [], decode: [], rag: [], memory: mem};
// The CPU build of ggml that llama.cpp loaded (it picks the best its CPU runs: zen4, haswell,
// ...); a copy of node_modules with only libggml-cpu-haswell.so runs it as on an AVX2-only CPU.
function llamaCpuVariant() {
    const m = fs.readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-([\w-]+)\.so/);
    return m ? m[1] : undefined;
}
const first = (rep) => (rep % 2 === 0 ? "worker" : "llama.cpp"); // who goes first this rep

// ---------------------------------------------------------------- 1. prefill
if (!skip.has("prefill")) {
    const ids = randomIds(Math.max(...lens), 1);
    for (let rep = 0; rep < reps; rep++)
        for (const n of lens) {
            const p = ids.slice(0, n);
            const row = {rep, tokens: n, first: first(rep), load: loadavg()};
            const w = async () => {
                row.worker_s = await workerPrefill(p);
                if (wurlB) row.worker_b_s = await workerPrefill(p, wurlB);
            };
            if (first(rep) === "worker") {
                await w();
                row.llama = await llamaPrefill(p);
            } else {
                row.llama = await llamaPrefill(p);
                await w();
            }
            if (n === Math.max(...lens)) mem[`after_prefill_${n}`] = memMiB(worker.proc.pid);
            row.worker_tok_s = n / row.worker_s;
            row.llama_tok_s = n / row.llama.s_main;
            row.llama_best_tok_s = n / row.llama.s;
            row.ratio = row.worker_tok_s / row.llama_tok_s;
            row.ratio_best = row.worker_tok_s / row.llama_best_tok_s;
            if (wurlB) row.ratio_b = row.worker_b_s / row.worker_s;
            out.prefill.push(row);
            log(`prefill ${n}: worker ${row.worker_tok_s.toFixed(1)} tok/s, llama.cpp ` +
                `${row.llama_tok_s.toFixed(1)} tok/s (best of ${llamaThreads} threads ${row.llama_best_tok_s.toFixed(1)}), ` +
                `ratio ${row.ratio.toFixed(2)} / ${row.ratio_best.toFixed(2)} (load ${row.load.toFixed(1)})` +
                (wurlB ? `; --worker-b ${(n / row.worker_b_s).toFixed(1)} tok/s (this build ${row.ratio_b.toFixed(2)}x)` : ""));
        }
}

// ---------------------------------------------------------------- 2. decode
// GB/s of a plain read of bandwidthMib MiB with the same threads (bench_matmul --read-only)
function readGBs() {
    const bin = path.join(build, "bench/bench_matmul");
    const txt = execFileSync(bin, ["--read-only", String(bandwidthMib), "--reps", "5"],
                             {env: {...process.env, OMP_NUM_THREADS: String(threads)}, encoding: "utf8"});
    const m = txt.match(/([\d.]+) GB\/s median/);
    if (!m) die(`bench_matmul --read-only printed no rate: ${txt}`);
    return Number(m[1]);
}
if (!skip.has("decode") && nDecode > 0) {
    const prompt = randomIds(512, 1);
    const decodeBytes = Number(a["decode-bytes"] ?? mem.weights_mib * 2 ** 20);
    for (let rep = 0; rep < reps; rep++) {
        const row = {rep, prompt_tokens: 512, first: first(rep), load: loadavg()};
        if (bandwidthMib > 0) row.read_gbs = readGBs();
        const w = async () => {
            row.worker = await workerDecode(prompt, nDecode);
            if (wurlB) row.worker_b = await workerDecode(prompt, nDecode, wurlB);
        };
        const l = async () => (row.llama = await llamaDecode(prompt, nDecode));
        if (first(rep) === "worker") await w(), await l();
        else await l(), await w();
        row.worker_tok_s = row.worker.tokens / row.worker.seconds;
        row.llama_tok_s = row.llama.tok_s_main;
        row.llama_best_tok_s = row.llama.tok_s;
        row.ratio = row.worker_tok_s / row.llama_tok_s;
        row.ratio_best = row.worker_tok_s / row.llama_best_tok_s;
        if (wurlB) row.ratio_b = row.worker_tok_s / (row.worker_b.tokens / row.worker_b.seconds);
        if (row.read_gbs) {
            row.decode_bytes = decodeBytes;
            row.worker_gbs = decodeBytes * row.worker_tok_s / 1e9;
            row.share_of_read = row.worker_gbs / row.read_gbs;
            log(`decode reads ${(decodeBytes / 1e9).toFixed(3)} GB a token: ${row.worker_gbs.toFixed(2)} GB/s, ` +
                `${row.share_of_read.toFixed(2)} of the plain read's ${row.read_gbs.toFixed(2)} GB/s`);
        }
        out.decode.push(row);
        log(`decode ${nDecode} (worker ${row.worker.tokens} tokens): worker ${row.worker_tok_s.toFixed(1)} ` +
            `tok/s, llama.cpp ${row.llama_tok_s.toFixed(1)} tok/s (best ${row.llama_best_tok_s.toFixed(1)}), ` +
            `ratio ${row.ratio.toFixed(2)} / ${row.ratio_best.toFixed(2)} (load ${row.load.toFixed(1)})` +
            (wurlB ? `; --worker-b ${(row.worker_b.tokens / row.worker_b.seconds).toFixed(1)} tok/s` : ""));
    }
}

// ---------------------------------------------------------------- 3. RAG through the gateway
if (!skip.has("rag")) {
    const gw = await startServer(gatewayBin,
        ["--listen", "127.0.0.1:0", "--worker", wurl, "--data-dir", path.join(tmp, "gateway"),
         "--worker-timeout-ms", workerTimeoutMs, "--health-timeout-ms", "30000",
         "--health-interval-ms", "5000"],
        path.join(tmp, "gateway.log"));
    const gurl = `http://127.0.0.1:${gw.port}`;
    await waitReady(`${gurl}/readyz`);
    for (let rep = 0; rep < reps; rep++) {
        const tag = `run ${process.pid}.${rep}`;
        const docs = Array.from({length: nDocs}, (_, i) =>
            words(docWords, 100 * rep + i + 11, `Document ${i + 1} (${tag}):`));
        const sys1 = words(30, 1 + rep, `You are a careful assistant (${tag}). Answer from the documents only:`);
        const sys2 = words(30, 51 + rep, `Terse mode (${tag}): cite the document, then answer in one sentence:`);
        const ask = async (parts) => {
            const r = await streamCompletion(`${gurl}/v1/completions`,
                {model: modelId, prompt: parts.join(" # # "), max_tokens: 1, temperature: 0});
            if (r.status !== 200 || !r.first) die(`gateway request failed: ${r.status} ${r.body ?? r.error}`);
            const cc = r.events[0].data.chunk_cache;
            return {ttft_s: (r.first - r.t0) / 1e3, prompt_tokens: r.usage?.prompt_tokens,
                    cached_tokens: r.usage?.prompt_tokens_details?.cached_tokens,
                    hits: cc?.segments?.filter((s) => s.hit).length, segments: cc?.segments?.length};
        };
        const order = docs.map((_, i) => i).reverse(); // reordered: last document first
        order.push(order.shift()); // ... and the first not last either: 2,1,0,3 for 4
        const row = {rep, load: loadavg()};
        row.cold = await ask([sys1, ...docs, "What did the harbour survey find?"]);
        const warmParts = [sys2, ...order.map((i) => docs[i]), "Which budget line grew, and by how much?"];
        // llama.cpp prefills as many tokens as the warm request holds: known after it, or
        // from the previous rep (same document sizes) when llama.cpp goes first
        const prev = out.rag.at(-1);
        if (first(rep) === "worker" || !prev) {
            row.warm = await ask(warmParts);
            row.llama_tokens = row.warm.prompt_tokens;
            row.llama = await llamaPrefill(randomIds(row.llama_tokens, 7));
        } else {
            row.llama_tokens = prev.warm.prompt_tokens;
            row.llama = await llamaPrefill(randomIds(row.llama_tokens, 7));
            row.warm = await ask(warmParts);
        }
        row.llama_cold_s = row.llama.s_main;
        row.speedup = row.llama.s_main / row.warm.ttft_s;
        row.speedup_best = row.llama.s / row.warm.ttft_s;
        row.speedup_vs_cold = row.cold.ttft_s / row.warm.ttft_s;
        out.rag.push(row);
        log(`RAG rep ${rep}: cold TTFT ${(row.cold.ttft_s * 1e3).toFixed(0)} ms (${row.cold.prompt_tokens} tokens), ` +
            `warm ${(row.warm.ttft_s * 1e3).toFixed(0)} ms (${row.warm.cached_tokens} of ${row.warm.prompt_tokens} reused, ` +
            `${row.warm.hits}/${row.warm.segments} segments hit); llama.cpp cold ` +
            `${(row.llama_cold_s * 1e3).toFixed(0)} ms: ${row.speedup.toFixed(1)}x (best llama.cpp ` +
            `${(row.llama.s * 1e3).toFixed(0)} ms: ${row.speedup_best.toFixed(1)}x) (load ${row.load.toFixed(1)})`);
    }
    mem.after_rag = memMiB(worker.proc.pid);
    await gw.stop();
}
await worker.stop();
if (workerB) await workerB.stop();
out.load_after = loadavg();
for (const k of Object.keys(mem))
    if (mem[k] && mem[k].rss) mem[k].ratio_to_weights_plus_pool = mem[k].rss / (mem.weights_mib + poolMb);

// ---------------------------------------------------------------- summary
const fmt = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "-");
const bm = (xs, d = 1, best = Math.max) => `${fmt(best(...xs), d)} / ${fmt(median(xs), d)}`;
console.log(`best / median over ${reps} reps; worker weights ${out.worker_weights_dtype}, kernels ` +
            `${out.worker_kernels}; llama.cpp (ggml-cpu ${out.llama_cpu_variant}) at ${threads} threads (the faster of flash attention ` +
            `${faModes.join(" / ")}), and the best of ${llamaThreads.join(", ")} threads in each measurement`);
console.log(`| part | chunkgate-worker | llama.cpp ${threads} thr | ratio | llama.cpp best | ratio to best |`);
console.log(`|---|---|---|---|---|---|`);
for (const n of lens) {
    const r = out.prefill.filter((x) => x.tokens === n);
    if (!r.length) continue;
    const g = (k) => r.map((x) => x[k]);
    console.log(`| prefill ${n}, tok/s | ${bm(g("worker_tok_s"))} | ${bm(g("llama_tok_s"))} | ${bm(g("ratio"), 2)} | ${bm(g("llama_best_tok_s"))} | ${bm(g("ratio_best"), 2)} |`);
}
if (wurlB)
    for (const n of lens) {
        const r = out.prefill.filter((x) => x.tokens === n);
        if (r.length) console.log(`| prefill ${n}: --worker-b time / this build's | ${bm(r.map((x) => x.ratio_b), 2)} | | | | |`);
    }
if (out.decode.length) {
    const g = (k) => out.decode.map((x) => x[k]);
    if (wurlB) console.log(`| decode: this build's rate / --worker-b's | ${bm(g("ratio_b"), 2)} | | | | |`);
    console.log(`| decode ${nDecode} after 512, tok/s | ${bm(g("worker_tok_s"))} | ${bm(g("llama_tok_s"))} | ${bm(g("ratio"), 2)} | ${bm(g("llama_best_tok_s"))} | ${bm(g("ratio_best"), 2)} |`);
}
if (out.rag.length) {
    const w = out.rag.map((x) => x.warm.ttft_s * 1e3), l = out.rag.map((x) => x.llama.s_main * 1e3),
          lb = out.rag.map((x) => x.llama.s * 1e3);
    console.log(`| RAG TTFT ms (warm, gateway) vs cold prefill | ${bm(w, 0, Math.min)} | ${bm(l, 0, Math.min)} | ${bm(out.rag.map((x) => x.speedup))}x | ${bm(lb, 0, Math.min)} | ${bm(out.rag.map((x) => x.speedup_best))}x |`);
    const c = out.rag.map((x) => x.cold.ttft_s * 1e3);
    console.log(`RAG: ${out.rag[0].warm.prompt_tokens} prompt tokens, ${out.rag[0].warm.cached_tokens} reused; ` +
                `chunkgate cold TTFT ${bm(c, 0, Math.min)} ms (cold / warm ${bm(out.rag.map((x) => x.speedup_vs_cold))}x)`);
}
console.log(`\nworker memory (MiB): weights ${fmt(mem.weights_mib)}, pool ${poolMb}`);
for (const [k, v] of Object.entries(mem))
    if (v && v.rss) console.log(`  ${k}: VmRSS ${fmt(v.rss)} (${fmt(v.ratio_to_weights_plus_pool, 2)}x weights + pool), VmHWM ${fmt(v.hwm)}`);
console.log(`load average ${fmt(out.load_before)} -> ${fmt(out.load_after)}`);
const json = JSON.stringify(out);
if (a.json) fs.writeFileSync(a.json, json + "\n");
console.log(json);
for (const c of lctxs) await c.ctx.dispose();
if (lmodel) await lmodel.dispose();
if (llama) await llama.dispose();
fs.rmSync(tmp, {recursive: true, force: true});
