// Reference renderer for the chat-template parity tests (tests/test_chat_template.c): renders
// every case of a cases file (tests/data/chat_template_cases.json) with @huggingface/jinja,
// the Jinja implementation transformers.js uses for apply_chat_template, and prints one JSON
// document: {"results": [{"id", "ok": true, "out"} | {"id", "ok": false, "stage", "error"}]}.
//
//   node tests/ref/render.mjs tests/data/chat_template_cases.json [source root]
//   node tests/ref/render.mjs --case-map
//
// --case-map prints, for every code point whose toUpperCase() or toLowerCase() is not itself,
// one line "cp upper-cps lower-cps" (cps comma-separated, hex): the case mapping the upper,
// lower, capitalize filters and methods and the lower/upper tests use.
//
// Case ids and variables are expanded exactly as the C suite expands them: every template x
// every conversation (unless the conversation names its templates) x add_generation_prompt
// false/true, then every feature template. Paths in the file are relative to the source root
// (default: two levels above this script).
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = dirname(fileURLToPath(import.meta.url));
if (process.argv[2] === "--case-map") {
  const hex = (s) => Array.from(s, (ch) => ch.codePointAt(0).toString(16)).join(",");
  const lines = [];
  for (let c = 0; c <= 0x10ffff; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const s = String.fromCodePoint(c);
    const u = s.toUpperCase(), l = s.toLowerCase();
    if (u !== s || l !== s) lines.push(`${c.toString(16)} ${hex(u)} ${hex(l)}`);
  }
  process.stdout.write(lines.join("\n") + "\n");
  process.exit(0);
}
const casesPath = process.argv[2];
if (!casesPath) {
  console.error("usage: node render.mjs CASES.json [SOURCE_ROOT]");
  process.exit(2);
}
const root = process.argv[3] ?? resolve(here, "..", "..");
const spec = JSON.parse(readFileSync(resolve(root, casesPath), "utf8"));

// Strings reach the C side as UTF-8: a lone surrogate becomes U+FFFD, as writing it would.
const wellFormed = (s) => (typeof s.toWellFormed === "function" ? s.toWellFormed() : s);

function templateSource(t) {
  if (typeof t.template === "string") return t.template;
  const cfg = JSON.parse(readFileSync(resolve(root, t.config), "utf8"));
  if (typeof cfg.chat_template !== "string") throw new Error(`${t.config}: no chat_template string`);
  return cfg.chat_template;
}

function run(id, source, vars) {
  let tpl;
  try {
    tpl = new Template(source);
  } catch (e) {
    return { id, ok: false, stage: "parse", error: wellFormed(String(e?.message ?? e)) };
  }
  try {
    return { id, ok: true, out: wellFormed(tpl.render(vars)) };
  } catch (e) {
    return { id, ok: false, stage: "render", error: wellFormed(String(e?.message ?? e)) };
  }
}

const results = [];
for (const t of spec.templates ?? []) {
  const source = templateSource(t);
  for (const conv of spec.conversations ?? []) {
    if (conv.templates && !conv.templates.includes(t.name)) continue;
    for (const agp of [false, true]) {
      const vars = {
        messages: conv.messages,
        bos_token: t.bos_token,
        eos_token: t.eos_token,
        add_generation_prompt: agp,
        ...(conv.vars ?? {}),
      };
      results.push(run(`${t.name}/${conv.name}/${agp ? "gen" : "nogen"}`, source, vars));
    }
  }
}
for (const f of spec.features ?? []) {
  results.push(run(`feature/${f.name}`, f.template, f.vars ?? {}));
}
process.stdout.write(JSON.stringify({ results }) + "\n");
