// openapi/gateway.yaml and openapi/worker.yaml as the contract: real answers (and real error
// answers) of a running chunkgate + chunkgate-worker, checked with ajv against the schema of
// their operation and status. A field the code sends that the spec does not declare fails too.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { gatewaySpec, workerSpec } from './lib/spec.js';
import { ADMIN_TOKEN, MODEL, sseData, startStack } from './lib/stack.js';

const SEP = ' # # ';
const DOCS = [
  'Doc one: the orchard planted 140 pear trees in 2019 and lost eleven to frost in 2021.',
  'Doc two: the cider press is rented out on Saturdays from September to November.',
  'Doc three: volunteers get one crate of apples per four hours worked.',
];
const ADMIN = { Authorization: `Bearer ${ADMIN_TOKEN}` };

let stack;
const gw = gatewaySpec();
const wk = workerSpec();

before(async () => {
  // A small body limit so the 413 answer can be provoked cheaply.
  stack = await startStack({ gatewayArgs: ['--max-body-bytes', '64K'] });
});

after(async () => {
  if (stack) await stack.stop();
});

/**
 * Sends one request and checks the answer against spec's operation (method, route).
 * @returns {Promise<{status, headers, body, text}>}
 */
async function call(spec, base, method, route, { path: p, body, headers = {}, raw } = {}) {
  const init = { method: method.toUpperCase(), headers: { ...headers } };
  if (raw !== undefined) {
    init.body = raw;
    init.headers['Content-Type'] = 'application/json';
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const res = await fetch(base + (p ?? route), init);
  const ctype = res.headers.get('content-type') || '';
  let parsed;
  let text = null;
  if (ctype.startsWith('application/json')) parsed = await res.json();
  else if (ctype.startsWith('application/octet-stream')) parsed = Buffer.from(await res.arrayBuffer());
  else parsed = text = await res.text();
  try {
    spec.checkResponse(method, route, res.status, ctype, parsed);
  } catch (err) {
    err.message += `\n${stack.logs().slice(-3000)}`;
    throw err;
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}

const g = (method, route, opts) => call(gw, stack.gatewayUrl, method, route, opts);
const w = (method, route, opts) => call(wk, stack.workerUrl, method, route, opts);

function expectError(r, status, code) {
  assert.equal(r.status, status, JSON.stringify(r.body));
  assert.equal(r.body.error.code, code, JSON.stringify(r.body));
}

describe('gateway', () => {
  let keys = [];

  test('completions: JSON and streamed answers match Completion', async () => {
    const prompt = ['You answer from the documents.', DOCS[0], DOCS[1], 'How many trees?'].join(SEP);
    const cold = await g('post', '/v1/completions', { body: { model: MODEL, prompt, max_tokens: 3 } });
    assert.equal(cold.status, 200);
    assert.ok(cold.headers.get('x-request-id'));
    keys = cold.body.chunk_cache.segments.map((s) => s.key);

    const s = await g('post', '/v1/completions', {
      body: {
        model: MODEL, prompt: ['Terse.', DOCS[1], DOCS[0], 'Press?'].join(SEP), max_tokens: 3,
        stream: true, stream_options: { include_usage: true },
      },
    });
    assert.equal(s.status, 200);
    const events = sseData(s.text);
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    assert.ok(chunks.length >= 2);
    chunks.forEach((c, i) => gw.checkSchema('Completion', c, `stream event ${i}`));
    assert.ok(chunks[0].chunk_cache, 'chunk_cache on the first event');
    // include_usage: the usage comes in a last chunk of its own, with no choice.
    assert.deepEqual(chunks.at(-1).choices, []);
    assert.ok(chunks.at(-1).usage.prompt_tokens_details.cached_tokens > 0);
    chunks.slice(0, -1).forEach((c) => assert.ok(!c.usage, 'usage on a choice chunk'));
    // Without it the stream carries no usage, as OpenAI's does.
    const plain = await g('post', '/v1/completions', {
      body: { model: MODEL, prompt: ['Terse.', DOCS[1], 'Press?'].join(SEP), max_tokens: 2, stream: true },
    });
    assert.ok(sseData(plain.text).slice(0, -1).every((e) => !('usage' in JSON.parse(e))));

    // recompute_ratio and quality_probe: chunk_cache.recomputed_tokens and .quality, in JSON
    // and on the stream's last event.
    const probed = await g('post', '/v1/completions', {
      body: { model: MODEL, prompt, max_tokens: 3, temperature: 0, recompute_ratio: 0.5, quality_probe: true },
    });
    assert.ok(probed.body.chunk_cache.recomputed_tokens > 0);
    assert.equal(probed.body.chunk_cache.quality.tokens_compared, 3);
    const ps = await g('post', '/v1/completions', {
      body: { model: MODEL, prompt, max_tokens: 3, stream: true, quality_probe: true },
    });
    const pe = sseData(ps.text).slice(0, -1).map((e) => JSON.parse(e));
    pe.forEach((c, i) => gw.checkSchema('Completion', c, `probed stream event ${i}`));
    assert.ok(pe.at(-1).chunk_cache.quality, 'the comparison on the last event');
  });

  test('chat: JSON and streamed answers match ChatCompletion', async () => {
    const body = {
      model: MODEL,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Crates?' }],
      documents: [DOCS[2], DOCS[0]],
      max_tokens: 3,
    };
    const r = await g('post', '/v1/chat/completions', { body });
    assert.equal(r.status, 200);
    assert.equal(r.body.object, 'chat.completion');
    const s = await g('post', '/v1/chat/completions', { body: { ...body, stream: true } });
    const events = sseData(s.text);
    assert.equal(events.at(-1), '[DONE]');
    events.slice(0, -1).forEach((e, i) => gw.checkSchema('ChatCompletion', JSON.parse(e), `chat event ${i}`));
  });

  test('tokenize and detokenize through a worker', async () => {
    const t = await g('post', '/tokenize', { body: { model: MODEL, prompt: 'Pears and cider.' } });
    assert.equal(t.status, 200);
    assert.equal(t.body.count, t.body.tokens.length);
    const d = await g('post', '/detokenize', { body: { model: MODEL, tokens: t.body.tokens } });
    assert.equal(d.body.prompt, 'Pears and cider.');
  });

  test('models, health, readiness, metrics', async () => {
    const m = await g('get', '/v1/models');
    assert.ok(m.body.data.some((x) => x.id === MODEL));
    assert.equal((await g('get', '/healthz')).body.status, 'ok');
    assert.equal((await g('get', '/readyz')).status, 200);
    const metrics = await g('get', '/metrics');
    assert.match(metrics.text, /^chunkgate_requests_total\{/m);
  });

  test('admin: chunks list, pages, one chunk, lookup, pin, delete', async () => {
    const list = await g('get', '/v1/chunks', { headers: ADMIN });
    assert.equal(list.status, 200);
    assert.ok(list.body.data.length >= 4);
    const page = await g('get', '/v1/chunks', { path: '/v1/chunks?limit=2', headers: ADMIN });
    assert.equal(page.body.data.length, 2);
    assert.equal(page.body.has_more, true);
    const next = await g('get', '/v1/chunks', { path: `/v1/chunks?limit=2&after=${page.body.last_id}`, headers: ADMIN });
    assert.ok(next.body.data[0].id > page.body.last_id);

    const key = keys[1];
    const one = await g('get', '/v1/chunks/{key}', { path: `/v1/chunks/${key}`, headers: ADMIN });
    assert.equal(one.body.id, key);
    assert.ok(one.body.hit_count >= 1);

    const byKeys = await g('post', '/v1/chunks/lookup', { body: { keys }, headers: ADMIN });
    assert.ok(byKeys.body.data.every((d) => d.found));
    const byPrompt = await g('post', '/v1/chunks/lookup', {
      body: { model: MODEL, prompt: ['New system.', DOCS[0], 'q'].join(SEP) }, headers: ADMIN,
    });
    assert.deepEqual(byPrompt.body.data.map((d) => d.found), [false, true]);

    const pinned = await g('post', '/v1/chunks/{key}/pin', { path: `/v1/chunks/${key}/pin`, headers: ADMIN });
    assert.equal(pinned.body.pinned, true);
    expectError(await g('delete', '/v1/chunks/{key}', { path: `/v1/chunks/${key}`, headers: ADMIN }), 409, 'conflict');
    await g('post', '/v1/chunks/{key}/unpin', { path: `/v1/chunks/${key}/unpin`, headers: ADMIN });
    const del = await g('delete', '/v1/chunks/{key}', { path: `/v1/chunks/${key}`, headers: ADMIN });
    assert.equal(del.body.deleted, true);
    const gone = await g('get', '/v1/chunks/{key}', { path: `/v1/chunks/${key}`, headers: ADMIN });
    assert.equal(gone.status, 404);
  });

  test('admin: workers', async () => {
    const list = await g('get', '/v1/workers', { headers: ADMIN });
    assert.equal(list.body.data.length, 1);
    const id = list.body.data[0].id;
    assert.equal(list.body.data[0].url, stack.workerUrl);
    await g('get', '/v1/workers/{id}', { path: `/v1/workers/${id}`, headers: ADMIN });
    const synced = await g('post', '/v1/workers/{id}/sync', { path: `/v1/workers/${id}/sync`, headers: ADMIN });
    assert.equal(synced.body.healthy, true);
    expectError(await g('get', '/v1/workers/{id}', { path: '/v1/workers/999', headers: ADMIN }), 404, 'not_found');
  });

  test('errors match Error, with their documented statuses', async () => {
    expectError(await g('post', '/v1/completions', { raw: '{"model": ' }), 400, 'invalid_json');
    expectError(await g('post', '/v1/completions', { body: { model: MODEL } }), 400, 'missing_field');
    expectError(await g('post', '/v1/completions', { body: { model: MODEL, prompt: 42 } }), 400, 'invalid_type');
    expectError(await g('post', '/v1/completions', { body: { model: MODEL, prompt: ['a', 'b'] } }), 400, 'invalid_value');
    expectError(await g('post', '/v1/chat/completions', { body: { model: MODEL, messages: 'hi' } }), 400, 'invalid_type');
    expectError(await g('post', '/v1/completions', {
      body: { model: MODEL, prompt: 'x'.repeat(70 * 1024) },
    }), 413, 'request_too_large');
    expectError(await g('post', '/v1/completions', {
      body: { model: 'no-such-model', prompt: `a${SEP}b${SEP}c`, max_tokens: 1 },
    }), 404, 'model_not_found');
    expectError(await g('get', '/v1/chunks'), 401, 'invalid_api_key');
    expectError(await g('get', '/v1/chunks', { path: '/v1/chunks?limit=0', headers: ADMIN }), 400, 'invalid_value');
    expectError(await g('get', '/v1/chunks/{key}', { path: '/v1/chunks/nothex', headers: ADMIN }), 400, 'invalid_value');
    expectError(await g('delete', '/v1/workers', { path: '/v1/workers?url=http://127.0.0.1:1', headers: ADMIN }), 404, 'not_found');
    // Unknown routes and methods have no operation in the spec: their body is still an Error.
    for (const [method, p, status] of [['GET', '/v1/nope', 404], ['GET', '/v1/completions', 405]]) {
      const res = await fetch(stack.gatewayUrl + p, { method });
      assert.equal(res.status, status);
      gw.checkSchema('Error', await res.json(), `${method} ${p}`);
    }
  });
});

describe('worker', () => {
  test('info, models, health, metrics', async () => {
    const info = await w('get', '/v1/info');
    assert.equal(info.body.model, MODEL);
    assert.ok(info.body.n_kv_heads > 0);
    await w('get', '/v1/models');
    await w('get', '/healthz');
    const metrics = await w('get', '/metrics');
    assert.match(metrics.text, /^chunkgate_worker_pool_used_bytes /m);
  });

  test('assemble, logits, KV export, completion from the assembly', async () => {
    const segments = [
      { role: 'system', text: 'Reference worker.' },
      { role: 'chunk', text: DOCS[2] },
      { role: 'question', text: 'How many crates?' },
    ];
    const a = await w('post', '/v1/assemble', { body: { model: MODEL, segments } });
    assert.equal(a.status, 200);
    const id = a.body.assembly_id;
    const logits = await w('get', '/v1/assemblies/{id}/logits', { path: `/v1/assemblies/${id}/logits` });
    assert.equal(logits.status, 200);
    assert.equal(logits.body.length, 4 * Number(logits.headers.get('x-vocab-size')));
    const kv = await w('get', '/v1/assemblies/{id}/kv', { path: `/v1/assemblies/${id}/kv?heads=0-1` });
    assert.equal(kv.headers.get('x-kv-format'), 'CGKV1');
    assert.equal(kv.body.subarray(0, 4).toString(), 'CGKV');

    const c = await w('post', '/v1/completions', {
      body: { model: MODEL, kv_transfer_params: { assembly_id: id }, max_tokens: 2 },
    });
    assert.equal(c.body.usage.prompt_tokens, a.body.n_tokens);
    // Consumed: a second use is a 404.
    expectError(await w('post', '/v1/completions', {
      body: { model: MODEL, kv_transfer_params: { assembly_id: id }, max_tokens: 2 },
    }), 404, 'not_found');

    const b = await w('post', '/v1/assemble', { body: { segments } });
    assert.ok(b.body.segments.filter((s) => s.role !== 'question').every((s) => s.hit));
    const del = await w('delete', '/v1/assemblies/{id}', { path: `/v1/assemblies/${b.body.assembly_id}` });
    assert.equal(del.body.deleted, true);
    expectError(await w('delete', '/v1/assemblies/{id}', { path: `/v1/assemblies/${b.body.assembly_id}` }), 404, 'not_found');
  });

  test('completions: JSON and streamed events match Completion and CompletionChunk', async () => {
    const prompt = ['Sys.', DOCS[0], 'Trees?'].join(SEP);
    const r = await w('post', '/v1/completions', { body: { model: MODEL, prompt, max_tokens: 2, logprobs: 2 } });
    assert.equal(r.body.choices[0].logprobs.tokens.length, r.body.usage.completion_tokens);
    const s = await w('post', '/v1/completions', {
      body: { model: MODEL, prompt, max_tokens: 3, stream: true, stream_options: { include_usage: true }, logprobs: 1 },
    });
    const events = sseData(s.text);
    assert.equal(events.at(-1), '[DONE]');
    events.slice(0, -1).forEach((e, i) => wk.checkSchema('CompletionChunk', JSON.parse(e), `event ${i}`));
    assert.deepEqual(JSON.parse(events.at(-2)).choices, []);

    // echo with prompt logprobs (a prompt without separators), token-id prompts, stop.
    const e = await w('post', '/v1/completions', {
      body: { model: MODEL, prompt: 'Pears', max_tokens: 2, echo: true, logprobs: 1, temperature: 0 },
    });
    assert.equal(e.body.choices[0].logprobs.token_logprobs[0], null);
    assert.ok(e.body.choices[0].text.startsWith('Pears'));
    const ids = await w('post', '/tokenize', { body: { prompt: 'Pears' } });
    const byIds = await w('post', '/v1/completions', {
      body: { prompt: [ids.body.tokens], max_tokens: 2, temperature: 0, return_tokens_as_token_ids: true, logprobs: 0 },
    });
    assert.equal(byIds.body.choices[0].text, e.body.choices[0].text.slice('Pears'.length));
    assert.match(byIds.body.choices[0].logprobs.tokens[0], /^token_id:\d+$/);
    await w('post', '/v1/completions', { body: { prompt: 'Pears', max_tokens: 2, stop: ['\n', 'zz'] } });

    // quality_probe: chunk_cache in JSON, and one more event before [DONE] in a stream; the
    // comparison then shows in /healthz.
    const q = await w('post', '/v1/completions', {
      body: { model: MODEL, prompt, max_tokens: 3, temperature: 0, quality_probe: true, recompute_ratio: 0.3 },
    });
    assert.equal(q.body.chunk_cache.quality.tokens_compared, 3);
    const qs = await w('post', '/v1/completions', {
      body: { model: MODEL, prompt, max_tokens: 3, stream: true, quality_probe: true },
    });
    const qe = sseData(qs.text);
    qe.slice(0, -1).forEach((e, i) => wk.checkSchema('CompletionChunk', JSON.parse(e), `probe event ${i}`));
    assert.ok(JSON.parse(qe.at(-2)).chunk_cache.quality);
    const h = await w('get', '/healthz');
    assert.ok(h.body.canary.requests >= 2);
    assert.ok(h.body.canary.settings.length >= 1);
  });

  test('chat: JSON and streamed answers match ChatCompletion and ChatCompletionChunk', async () => {
    const body = {
      model: MODEL,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Crates?' }],
      documents: [DOCS[2]],
      max_tokens: 2,
      logprobs: true,
      top_logprobs: 2,
    };
    const r = await w('post', '/v1/chat/completions', { body });
    assert.equal(r.body.object, 'chat.completion');
    assert.equal(r.body.choices[0].logprobs.content.length, r.body.usage.completion_tokens);
    const s = await w('post', '/v1/chat/completions', {
      body: { ...body, stream: true, stream_options: { include_usage: true } },
    });
    const events = sseData(s.text);
    assert.equal(events.at(-1), '[DONE]');
    events.slice(0, -1).forEach((e, i) => wk.checkSchema('ChatCompletionChunk', JSON.parse(e), `chat event ${i}`));
    assert.equal(JSON.parse(events[0]).choices[0].delta.role, 'assistant');
    // The rendering tokenized as one piece (separators included).
    const t = await w('post', '/tokenize', { body: { ...body, return_token_strs: true } });
    assert.equal(t.body.token_strs.length, t.body.count);
  });

  test('inventory: chunks list, one chunk with head keys, KV export, delete', async () => {
    const list = await w('get', '/v1/chunks');
    assert.ok(list.body.data.length >= 3);
    const page = await w('get', '/v1/chunks', { path: '/v1/chunks?limit=1' });
    assert.equal(page.body.has_more, true);
    const key = list.body.data[0].key;
    const one = await w('get', '/v1/chunks/{key}', { path: `/v1/chunks/${key}` });
    assert.equal(one.body.head_keys.length, one.body.n_kv_heads);
    const kv = await w('get', '/v1/chunks/{key}/kv', { path: `/v1/chunks/${key}/kv?heads=1` });
    assert.equal(kv.status, 200);
    const del = await w('delete', '/v1/chunks/{key}', { path: `/v1/chunks/${key}` });
    assert.equal(del.body.deleted, true);
    expectError(await w('get', '/v1/chunks/{key}', { path: `/v1/chunks/${key}` }), 404, 'not_found');
  });

  test('errors match Error, with their documented statuses', async () => {
    expectError(await w('post', '/v1/assemble', { raw: 'not json' }), 400, 'invalid_json');
    expectError(await w('post', '/v1/assemble', {
      body: { segments: [{ role: 'chunk', text: 'abc', key: '0'.repeat(32) }, { role: 'question', text: 'q' }] },
    }), 400, 'chunk_key_mismatch');
    expectError(await w('post', '/v1/assemble', {
      body: { model: 'other', segments: [{ role: 'question', text: 'q' }] },
    }), 404, 'model_not_found');
    expectError(await w('post', '/v1/completions', { body: { prompt: 'x', best_of: 2 } }), 400, 'invalid_value');
    const { max_positions: maxPos } = (await w('get', '/v1/info')).body;
    expectError(await w('post', '/v1/completions', { body: { prompt: 'x', max_tokens: maxPos } }), 400, 'context_length_exceeded');
    expectError(await w('post', '/v1/completions', { body: { prompt: 'x', max_tokens: maxPos + 1 } }), 400, 'invalid_value');
    expectError(await w('post', '/v1/chat/completions', { body: { messages: [{ role: 'user', content: 'x' }], echo: true } }), 400, 'invalid_value');
    expectError(await w('post', '/detokenize', { body: { tokens: [1 << 30] } }), 400, 'invalid_value');
    expectError(await w('post', '/v1/completions', { body: { prompt: 'x', n: 2 } }), 400, 'invalid_value');
    expectError(await w('get', '/v1/chunks', { path: '/v1/chunks?limit=0' }), 400, 'invalid_value');
    expectError(await w('get', '/v1/chunks/{key}', { path: `/v1/chunks/${'f'.repeat(32)}` }), 404, 'not_found');
    expectError(await w('get', '/v1/assemblies/{id}/kv', { path: `/v1/assemblies/${'a'.repeat(32)}/kv` }), 404, 'not_found');
  });
});
