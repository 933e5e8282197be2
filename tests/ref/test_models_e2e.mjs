// Real-model checks end to end, against references nobody here wrote. For each real
// architecture preset (llama3, llama2, qwen2, qwen3) the worker serves a generated checkpoint
// that carries the real tokenizer files of an @lenml/tokenizer-* package, with a gateway in
// front (real processes, HTTP over loopback):
//   - /tokenize through the gateway equals @lenml/tokenizers on a multilingual corpus, with and
//     without special tokens, and /detokenize gives the text back (a text holding NUL is
//     refused with 400: JSON strings with \u0000 are not accepted anywhere);
//   - a chat's tokens (/tokenize with messages + documents) equal @lenml/tokenizers on the
//     @huggingface/jinja rendering of the model's template, the documents put into the system
//     message as DESIGN §13 says (llama2's template comes through --chat-template);
//   - chunk reuse through the gateway on the real tokenizer: documents reordered under a new
//     system prompt are all hits, each segment has exactly the tokens of its text encoded
//     alone (the system segment's BOS is the template's own; a plain "# #" prompt gets BOS
//     before the system segment only);
//   - chat answers take the chat shapes (JSON and SSE);
//   - a template the worker cannot render refuses the start with a clear message.
//
//   node tests/ref/test_models_e2e.mjs WORKER_BIN GATEWAY_BIN
// Exits 77 (skipped) when the npm packages are missing.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..");
const [workerBin, gatewayBin] = process.argv.slice(2);
if (!workerBin || !gatewayBin) {
  console.error("usage: node test_models_e2e.mjs WORKER_BIN GATEWAY_BIN");
  process.exit(2);
}
let lib, Template;
try {
  lib = await import("@lenml/tokenizers");
  ({ Template } = await import("@huggingface/jinja"));
} catch {
  console.log("SKIPPED: @lenml/tokenizers or @huggingface/jinja missing; run `npm ci` in tests/ref");
  process.exit(77);
}

const SEP = "# #";
let failures = 0;
function check(ok, what) {
  if (!ok) {
    failures++;
    console.log(`FAIL: ${what}`);
  }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "cg-models-"));
const procs = [];
process.on("exit", () => {
  for (const p of procs) p.kill("SIGKILL");
  fs.rmSync(tmp, { recursive: true, force: true });
});

// Starts a program and resolves with its port once it logs "listening on HOST:PORT".
function start(bin, args, name) {
  return new Promise((resolve, reject) => {
    const p = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
    procs.push(p);
    let log = "";
    const timer = setTimeout(() => reject(new Error(`${name} did not start:\n${log}`)), 60000);
    p.stderr.on("data", (d) => {
      log += d;
      const m = /listening on [^:]+:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ p, port: Number(m[1]), log: () => log });
      }
    });
    p.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited with ${code}:\n${log}`));
    });
  });
}

async function post(port, route, body) {
  const r = await fetch(`http://127.0.0.1:${port}${route}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, text, json: (() => { try { return JSON.parse(text); } catch { return null; } })() };
}

async function waitReady(port) {
  for (let i = 0; i < 300; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => null);
    if (r && r.status === 200) return;
    await new Promise((s) => setTimeout(s, 100));
  }
  throw new Error("the gateway never became ready");
}

const corpus = JSON.parse(fs.readFileSync(path.join(root, "tests/data/tokenizer_corpus.json"), "utf8")).texts;
const cases = JSON.parse(fs.readFileSync(path.join(root, "tests/data/chat_template_cases.json"), "utf8"));
const llama2Template = cases.templates.find((t) => t.name === "llama2").template;

const MODELS = [
  { preset: "llama3", pkg: "llama3_1" },
  { preset: "llama2", pkg: "llama2", template: llama2Template },
  { preset: "qwen2", pkg: "qwen2_5" },
  { preset: "qwen3", pkg: "qwen3" },
];

// The documents in the system message (DESIGN §13), written out independently here.
function foldDocuments(messages, docs) {
  if (!docs.length) return messages;
  const tail = docs.map((d) => ` ${SEP} ${d}`).join("") + ` ${SEP} `;
  const i = messages.findIndex((m) => m.role === "system");
  if (i < 0) return [{ role: "system", content: tail.slice(1) }, ...messages];
  return messages.map((m, k) => (k === i ? { ...m, content: (m.content ?? "") + tail } : m));
}

// Segments of a rendering as the splitter makes them: trimmed, empties dropped, the last one
// keeping its trailing whitespace.
function segments(text) {
  const parts = text.split(SEP);
  const out = [];
  parts.forEach((p, i) => {
    const last = i === parts.length - 1;
    const s = last ? p.replace(/^[ \t\n\r\f\v]+/, "") : p.replace(/^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$/g, "");
    if (s.trim().length) out.push(s);
  });
  return out;
}

const DOCS = [
  "Rotary position embeddings rotate each query and key pair by an angle proportional to its position.",
  "東京は日本の首都です。人口は約1400万人で、世界最大の都市圏の一つです。",
  "The gateway keys every chunk with XXH3-128 and routes to the worker that holds most of them. 🚀",
  "مرحبا بالعالم. هذه وثيقة قصيرة باللغة العربية لاختبار الترميز.",
];

async function oneModel(m) {
  const dir = path.join(tmp, m.preset);
  const tokDir = path.join(here, "node_modules", "@lenml", `tokenizer-${m.pkg}`, "models");
  const gen = spawnSync(workerBin, ["generate-model", "--out", dir, "--preset", m.preset, "--tokenizer", tokDir], { encoding: "utf8" });
  if (gen.status !== 0) throw new Error(`generate-model ${m.preset}: ${gen.stderr}`);
  const read = (f) => JSON.parse(fs.readFileSync(path.join(tokDir, f), "utf8"));
  const cfg = read("tokenizer_config.json");
  const tok = lib.TokenizerLoader.fromPreTrained({ tokenizerJSON: read("tokenizer.json"), tokenizerConfig: cfg });
  const enc = (t, special) => Array.from(tok.encode(t, { add_special_tokens: special }));
  const args = ["serve", "--model", dir, "--listen", "127.0.0.1:0", "--data-dir", path.join(tmp, `w-${m.preset}`), "--pool-mb", "64"];
  let templateSrc = cfg.chat_template;
  if (m.template) {
    const f = path.join(tmp, `${m.preset}.jinja`);
    fs.writeFileSync(f, m.template);
    args.push("--chat-template", f);
    templateSrc = m.template;
  }
  const w = await start(workerBin, args, `worker ${m.preset}`);
  const g = await start(gatewayBin, ["--listen", "127.0.0.1:0", "--worker", `http://127.0.0.1:${w.port}`, "--data-dir", path.join(tmp, `g-${m.preset}`)], `gateway ${m.preset}`);
  await waitReady(g.port);
  const info = await fetch(`http://127.0.0.1:${w.port}/v1/info`).then((r) => r.json());
  const model = info.model;
  check(info.chat_template === templateSrc, `${m.preset}: /v1/info reports the template it renders with`);

  // 1. tokenizer parity and the round trip, through the gateway
  let n = 0;
  for (const text of corpus) {
    if (text.includes("\u0000")) {
      // NUL cannot travel in chunkgate's JSON: a clear 400, never a silent change
      const r = await post(g.port, "/tokenize", { model, prompt: text });
      check(r.status === 400 && r.json?.error?.code === "invalid_json", `${m.preset}: NUL in a prompt is refused: ${r.text.slice(0, 200)}`);
      continue;
    }
    for (const special of [true, false]) {
      const r = await post(g.port, "/tokenize", { model, prompt: text, add_special_tokens: special });
      const want = enc(text, special);
      check(r.status === 200 && same(r.json.tokens, want), `${m.preset}: /tokenize ${JSON.stringify(text).slice(0, 60)} special=${special}: ${r.text.slice(0, 200)} want ${JSON.stringify(want).slice(0, 200)}`);
      n++;
    }
    const ids = enc(text, false);
    const d = await post(g.port, "/detokenize", { model, tokens: ids });
    const wantText = !ids.length ? "" : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: cfg.clean_up_tokenization_spaces ?? false });
    check(d.status === 200 && d.json.prompt === wantText, `${m.preset}: /detokenize of ${JSON.stringify(text).slice(0, 60)} gave ${JSON.stringify(d.json?.prompt).slice(0, 80)} want ${JSON.stringify(wantText).slice(0, 80)}`);
  }

  // 2. chat tokens: the reference renders the folded conversation and tokenizes it
  const tpl = new Template(templateSrc);
  const bos = typeof cfg.bos_token === "string" ? cfg.bos_token : cfg.bos_token?.content ?? "";
  const eos = typeof cfg.eos_token === "string" ? cfg.eos_token : cfg.eos_token?.content ?? "";
  const convs = [
    { messages: [{ role: "system", content: "You answer from the documents." }, { role: "user", content: "Which city is the capital?" }], documents: DOCS },
    { messages: [{ role: "user", content: "Hello there, how are you?" }], documents: [] },
    { messages: [{ role: "user", content: "Summarise." }], documents: DOCS.slice(0, 2) },
    { messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }, { role: "assistant", content: "Hello!" }, { role: "user", content: "What now?" }], documents: [DOCS[2]] },
  ];
  const rendered = [];
  for (const c of convs) {
    const text = tpl.render({ messages: foldDocuments(c.messages, c.documents), add_generation_prompt: true, bos_token: bos, eos_token: eos });
    rendered.push(text);
    const r = await post(g.port, "/tokenize", { model, messages: c.messages, documents: c.documents });
    const want = enc(text, false);
    check(r.status === 200 && same(r.json.tokens, want), `${m.preset}: chat tokens differ for ${JSON.stringify(c).slice(0, 80)}:\n got  ${JSON.stringify(r.json?.tokens ?? r.text).slice(0, 300)}\n want ${JSON.stringify(want).slice(0, 300)}`);
  }

  // 3. reuse through the gateway: documents reordered under a new system prompt
  const ask = (system, docs) => post(g.port, "/v1/chat/completions", { model, messages: [{ role: "system", content: system }, { role: "user", content: "Which city is the capital?" }], documents: docs, max_tokens: 2, temperature: 0 });
  const first = await ask("You answer from the documents.", DOCS);
  check(first.status === 200 && first.json.object === "chat.completion" && first.json.choices?.[0]?.message?.role === "assistant", `${m.preset}: chat answer shape: ${first.text.slice(0, 300)}`);
  const order = [3, 1, 0, 2];
  const second = await ask("A different system prompt.", order.map((i) => DOCS[i]));
  const segs = second.json?.chunk_cache?.segments ?? [];
  const text2 = tpl.render({ messages: foldDocuments([{ role: "system", content: "A different system prompt." }, { role: "user", content: "Which city is the capital?" }], order.map((i) => DOCS[i])), add_generation_prompt: true, bos_token: bos, eos_token: eos });
  const want2 = segments(text2);
  check(segs.length === 5 && segs[0].role === "system" && !segs[0].hit, `${m.preset}: the new system prompt is a miss: ${JSON.stringify(segs).slice(0, 300)}`);
  for (let i = 1; i < 5; i++) check(segs[i]?.role === "chunk" && segs[i]?.hit === true, `${m.preset}: reordered document ${i} is a hit`);
  for (let i = 0; i < Math.min(segs.length, 5); i++)
    check(segs[i].tokens === enc(want2[i], false).length, `${m.preset}: segment ${i} has ${segs[i].tokens} tokens, its text alone has ${enc(want2[i], false).length}`);
  const chunkTokens = segs.slice(1).reduce((s, x) => s + x.tokens, 0);
  check(second.json?.usage?.prompt_tokens_details?.cached_tokens === chunkTokens, `${m.preset}: cached_tokens ${second.json?.usage?.prompt_tokens_details?.cached_tokens} = the documents' ${chunkTokens}`);

  // a plain "# #" prompt: BOS (when the tokenizer adds one) before the system segment only
  const plain = await post(g.port, "/v1/completions", { model, prompt: `Be exact. ${SEP} ${DOCS[0]} ${SEP} ${DOCS[1]} ${SEP} Question: which?\n`, max_tokens: 1, temperature: 0 });
  const ps = plain.json?.chunk_cache?.segments ?? [];
  check(ps.length === 3 && ps[0].tokens === enc("Be exact.", true).length && ps[1].tokens === enc(DOCS[0], false).length && ps[2].tokens === enc(DOCS[1], false).length, `${m.preset}: plain prompt segment tokens ${JSON.stringify(ps.map((s) => s.tokens))}`);
  check(plain.json?.usage?.prompt_tokens === enc("Be exact.", true).length + enc(DOCS[0], false).length + enc(DOCS[1], false).length + enc("Question: which?\n", false).length, `${m.preset}: plain prompt_tokens ${plain.json?.usage?.prompt_tokens}`);

  // a streamed chat answer
  const st = await fetch(`http://127.0.0.1:${g.port}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ model, messages: [{ role: "user", content: "Hi" }], documents: DOCS.slice(0, 1), max_tokens: 3, stream: true, stream_options: { include_usage: true } }) }).then((r) => r.text());
  const events = st.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
  check(events.at(-1) === "[DONE]" && JSON.parse(events[0]).object === "chat.completion.chunk" && JSON.parse(events[0]).choices[0].delta.role === "assistant" && JSON.parse(events.at(-2)).usage?.completion_tokens > 0, `${m.preset}: chat stream ${st.slice(0, 300)}`);
  w.p.kill("SIGTERM");
  g.p.kill("SIGTERM");
  console.log(`${m.preset}: ${n} tokenizations, ${corpus.length} round trips, ${convs.length} chats, reuse checked`);
}

for (const m of MODELS) {
  try {
    await oneModel(m);
  } catch (e) {
    check(false, `${m.preset}: ${String(e?.message ?? e).slice(0, 2000)}`);
  }
}

// A template the renderer does not implement refuses the start, naming the option.
{
  const f = path.join(tmp, "bad.jinja");
  fs.writeFileSync(f, "{% for m in messages %}{{ m.content | wordwrap(20) }}{% endfor %}");
  const r = spawnSync(workerBin, ["serve", "--model", path.join(tmp, "qwen3"), "--listen", "127.0.0.1:0", "--data-dir", path.join(tmp, "w-bad"), "--chat-template", f], { encoding: "utf8", timeout: 60000 });
  check(r.status !== 0 && /chat template/.test(r.stderr) && /wordwrap/.test(r.stderr), `an unrenderable template refuses the start: status ${r.status}: ${r.stderr.slice(-400)}`);
}

if (failures) {
  console.log(`${failures} failure(s)`);
  process.exit(1);
}
console.log("ok");
