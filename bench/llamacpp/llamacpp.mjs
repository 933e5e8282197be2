#!/usr/bin/env node
// llama.cpp baseline for chunkgate-worker, through node-llama-cpp's prebuilt CPU binaries:
// prefill and decode speed on given token ids, and next-token log-probabilities.
//
//   node llamacpp.mjs speed    --model M.gguf [--threads 2] [--prefill 512,4096] [--decode 128]
//                              [--ids-seed 1] [--id-min 1000] [--id-max 30000] [--dump-ids F]
//                              [--flash-attention auto|on|off] [--batch 512]
//   node llamacpp.mjs logprobs --model M.gguf (--ids '[1,2,3]' | --ids-file F) [--top 20]
//                              [--all | --positions 0,5,9] [--full F.f32] [--threads 2]
//
// CPU only (gpu: false), prebuilt binaries only (build: "never"), nothing downloaded
// (skipDownload); run with NODE_LLAMA_CPP_SKIP_DOWNLOAD=true as well, so no install step
// tries either. Prompts are token ids, so llama.cpp and chunkgate process the very same
// tokens; random prompts use xorshift32 (x ^= x << 13; x ^= x >>> 17; x ^= x << 5, from
// --ids-seed, 0 replaced by 1) mapped to id-min + x % (id-max - id-min).
// Output: one JSON object on stdout.
import fs from "node:fs";
import process from "node:process";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

import {die, parseArgs, randomIds} from "../worker_client.mjs";

function readIds(a) {
    let ids;
    if (a.ids !== undefined) ids = JSON.parse(a.ids);
    else if (a["ids-file"] !== undefined) ids = JSON.parse(fs.readFileSync(a["ids-file"], "utf8"));
    else die("--ids or --ids-file is required");
    if (!Array.isArray(ids) || ids.length === 0 || !ids.every(Number.isInteger))
        die("ids must be a non-empty JSON array of integers");
    return ids;
}

async function loadModel(a) {
    const threads = Number(a.threads ?? 2);
    const llama = await getLlama({
        gpu: false,
        build: "never",
        skipDownload: true,
        usePrebuiltBinaries: true,
        maxThreads: threads,
        logLevel: a.verbose ? LlamaLogLevel.info : LlamaLogLevel.error,
    });
    const model = await llama.loadModel({modelPath: a.model, gpuLayers: 0, useMmap: true});
    return {llama, model, threads};
}

function flashAttention(a) {
    const v = a["flash-attention"] ?? "off";
    if (v === "auto") return "auto";
    if (v === "on") return true;
    if (v === "off") return false;
    die("--flash-attention must be auto, on or off");
}

async function newContext(model, a, threads, size) {
    const batch = Number(a.batch ?? 512);
    return model.createContext({
        contextSize: size,
        batchSize: batch,
        threads: {ideal: threads, min: threads},
        flashAttention: flashAttention(a),
        sequences: 1,
    });
}

async function speed(a) {
    const {llama, model, threads} = await loadModel(a);
    const lens = String(a.prefill ?? "512,4096").split(",").map(Number);
    const nDecode = Number(a.decode ?? 128);
    const seed = Number(a["ids-seed"] ?? 1);
    const idMin = Number(a["id-min"] ?? 1000);
    const idMax = Number(a["id-max"] ?? 30000);
    const maxLen = Math.max(...lens, 512);
    const ids = randomIds(maxLen + 1, seed, idMin, idMax);
    if (a["dump-ids"]) fs.writeFileSync(a["dump-ids"], JSON.stringify(ids) + "\n");
    const ctxSize = Math.max(...lens) + nDecode + 256;
    const ctx = await newContext(model, a, threads, ctxSize);
    const seq = ctx.getSequence();
    const res = {
        engine: "llama.cpp",
        binding: "node-llama-cpp",
        llama_cpp_release: llama.llamaCppRelease,
        cpu: llama.systemInfo.trim(),
        model: a.model,
        threads,
        context_size: ctx.contextSize,
        batch_size: ctx.batchSize,
        flash_attention: ctx.flashAttention,
        ids_seed: seed,
        id_range: [idMin, idMax],
        prefill: [],
    };
    // Warm-up: touches every weight page of the mmapped file once.
    await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, 16));
    await seq.clearHistory();
    for (const n of lens) {
        await seq.clearHistory();
        const t0 = process.hrtime.bigint();
        await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, n));
        const s = Number(process.hrtime.bigint() - t0) / 1e9;
        res.prefill.push({tokens: n, seconds: s, tokens_per_s: n / s});
    }
    if (nDecode > 0) {
        // Greedy decode after a 512-token prompt: the first generated token ends the prefill
        // of the prompt's last token; the next nDecode tokens are timed.
        const prompt = ids.slice(0, 512);
        await seq.clearHistory();
        await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
        const out = [];
        let t0 = 0n;
        for await (const tok of seq.evaluate(prompt.slice(-1), {temperature: 0})) {
            out.push(tok);
            if (out.length === 1) t0 = process.hrtime.bigint();
            if (out.length === nDecode + 1) break;
        }
        const s = Number(process.hrtime.bigint() - t0) / 1e9;
        res.decode = {prompt_tokens: 512, tokens: out.length - 1, seconds: s,
                      tokens_per_s: (out.length - 1) / s, greedy_ids: out};
    }
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
    return res;
}

function logProbs(probs, V) {
    // probs: Map<token, probability> over the whole vocabulary, as llama.cpp's softmax gives
    // them (float32; renormalised here so they sum to 1 in double precision).
    const lp = new Float64Array(V).fill(-Infinity);
    let sum = 0;
    for (const v of probs.values()) sum += v;
    const lsum = Math.log(sum);
    for (const [t, v] of probs) lp[t] = Math.log(v) - lsum;
    return lp;
}

async function logprobs(a) {
    const {llama, model, threads} = await loadModel(a);
    const ids = readIds(a);
    const top = Number(a.top ?? 20);
    const ctx = await newContext(model, a, threads, Math.max(ids.length + 16, 256));
    const seq = ctx.getSequence();
    const want = a.positions ? String(a.positions).split(",").map(Number)
        : a.all ? ids.map((_, i) => i) : [ids.length - 1];
    if (!want.every((p) => Number.isInteger(p) && p >= 0 && p < ids.length))
        die("--positions outside the ids");
    const wantSet = new Set(want);
    const input = ids.map((t, i) => (wantSet.has(i) ? [t, {generateNext: {probabilities: true}}] : t));
    const out = await seq.controlledEvaluate(input);
    const res = {engine: "llama.cpp", llama_cpp_release: llama.llamaCppRelease, model: a.model,
                 n_tokens: ids.length, vocab_size: 0, positions: want, top: []};
    const full = a.full ? fs.openSync(a.full, "w") : null;
    for (const i of want) {
        const pr = out[i]?.next?.probabilities;
        if (!pr) die(`no probabilities for position ${i}`);
        let V = 0;
        for (const t of pr.keys()) V = Math.max(V, t + 1);
        res.vocab_size = V;
        const lp = logProbs(pr, V);
        const order = Array.from(lp.keys()).sort((x, y) => lp[y] - lp[x]).slice(0, top);
        res.top.push(order.map((t) => [t, lp[t]]));
        if (full) fs.writeSync(full, Buffer.from(Float32Array.from(lp).buffer));
    }
    if (full) fs.closeSync(full);
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
    return res;
}

const a = parseArgs(process.argv.slice(2));
const cmd = a._[0];
if (!a.model) die("--model is required");
let result;
if (cmd === "speed") result = await speed(a);
else if (cmd === "logprobs") result = await logprobs(a);
else die("usage: llamacpp.mjs speed|logprobs --model M.gguf [options]");
process.stdout.write(JSON.stringify(result) + "\n");
