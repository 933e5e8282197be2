// The official `openai` npm client against a real chunkgate + chunkgate-worker: completions
// and chat, streamed and not, usage.prompt_tokens_details.cached_tokens after the same
// documents come back reordered, chunk_cache, request ids, models, the SDK's API key as the
// gateway's --api-key, and the SDK's error classes for the gateway's errors.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';
import { MODEL, startStack } from './lib/stack.js';

const SEP = ' # # ';
const DOC_A = 'Document A. The lighthouse at Kerrow Point was automated in 1987 and its ' +
  'keepers moved to the harbour office.';
const DOC_B = 'Document B. The ferry to Inish Mór leaves at 09:30 and 16:15 from May to ' +
  'September; in winter only the morning crossing runs.';
const DOC_C = 'Document C. Tide tables for the bay are published each March by the county ' +
  'council and list both spring and neap tides.';

let stack;
let client;

const API_KEY = 'sk-compat-test-key';
const clientWith = (apiKey) => new OpenAI({
  baseURL: `${stack.gatewayUrl}/v1`,
  apiKey,
  maxRetries: 0, // an error must surface as the gateway's answer, not a retry
  timeout: 30000,
});

before(async () => {
  // With --api-key the inference routes take the SDK's key as their bearer token.
  stack = await startStack({ gatewayArgs: ['--api-key', API_KEY] });
  client = clientWith(API_KEY);
});

after(async () => {
  if (!stack) return;
  const codes = await stack.stop();
  assert.deepEqual(codes, { gateway: 0, worker: 0 }, 'both processes stop cleanly on SIGTERM');
});

// Fails with the processes' logs attached, so a broken run explains itself.
async function withLogs(fn) {
  try {
    return await fn();
  } catch (err) {
    err.message += `\n${stack.logs().slice(-4000)}`;
    throw err;
  }
}

// A greedy completion of a RAG prompt: the system prompt, documents and question joined by the
// separator.
const ragCompletion = (parts, maxTokens, extra = {}) => client.completions.create({
  model: MODEL,
  prompt: parts.join(SEP),
  max_tokens: maxTokens,
  temperature: 0,
  ...extra,
});

const hitTokens = (cc) => cc.segments.filter((s) => s.hit).reduce((n, s) => n + s.tokens, 0);

function checkCacheReport(cc, { chunks }) {
  assert.equal(cc.passthrough, false);
  assert.equal(cc.fallback, false, 'served on the main path');
  assert.equal(cc.worker, stack.workerUrl);
  assert.equal(cc.segments.length, 1 + chunks);
  assert.equal(cc.segments[0].role, 'system');
  for (const s of cc.segments) assert.match(s.key, /^[0-9a-f]{32}$/);
}

test('completions: cold, then the same documents reordered report cached_tokens', () => withLogs(async () => {
  const cold = await ragCompletion(
    ['You answer from the documents.', DOC_A, DOC_B, 'When does the ferry leave?'], 6);
  assert.equal(cold.object, 'text_completion');
  assert.equal(cold.model, MODEL);
  assert.equal(cold.choices.length, 1);
  assert.equal(typeof cold.choices[0].text, 'string');
  assert.ok(['length', 'stop'].includes(cold.choices[0].finish_reason));
  assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0, 'nothing cached yet');
  if (cold.choices[0].finish_reason === 'length') assert.equal(cold.usage.completion_tokens, 6);
  else assert.ok(cold.usage.completion_tokens < 6);
  assert.equal(cold.usage.total_tokens, cold.usage.prompt_tokens + cold.usage.completion_tokens);
  checkCacheReport(cold.chunk_cache, { chunks: 2 });
  assert.ok(cold.chunk_cache.segments.every((s) => !s.hit));
  assert.match(cold._request_id, /\S/, 'the SDK exposes X-Request-Id as _request_id');

  // Other system prompt, documents swapped: both documents' KV is reused.
  const warm = await ragCompletion(['Be brief.', DOC_B, DOC_A, 'Who automated the lighthouse?'], 6);
  const cc = warm.chunk_cache;
  checkCacheReport(cc, { chunks: 2 });
  assert.deepEqual(cc.segments.map((s) => s.hit), [false, true, true]);
  assert.deepEqual(cc.segments.slice(1).map((s) => s.key),
    cold.chunk_cache.segments.slice(1).map((s) => s.key).reverse(), 'same keys, other order');
  const cached = warm.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0, 'cached_tokens > 0 for reused documents');
  assert.equal(cached, hitTokens(cc), 'cached_tokens = the hit segments\' tokens');
  assert.ok(cached < warm.usage.prompt_tokens);
}));

test('completions: streamed, with usage and cached_tokens in the last event', () => withLogs(async () => {
  const stream = await ragCompletion(
    ['Answer in one line.', DOC_A, DOC_C, 'What is published in March?'], 5,
    { stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let cacheReport = null;
  let events = 0;
  for await (const chunk of stream) {
    events++;
    assert.equal(chunk.object, 'text_completion');
    if (chunk.chunk_cache) cacheReport = chunk.chunk_cache;
    for (const c of chunk.choices) text += c.text;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(events >= 2, `several events (${events})`);
  assert.equal(typeof text, 'string');
  assert.ok(cacheReport, 'chunk_cache on the first event');
  checkCacheReport(cacheReport, { chunks: 2 });
  assert.deepEqual(cacheReport.segments.map((s) => s.hit), [false, true, false], 'A cached, C new');
  assert.ok(usage, 'a usage event');
  assert.ok(usage.completion_tokens >= 1 && usage.completion_tokens <= 5, 'max_tokens honoured');
  assert.equal(usage.prompt_tokens_details.cached_tokens, hitTokens(cacheReport));
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0);
}));

test('chat: documents extension, cold then reordered, non-streamed', () => withLogs(async () => {
  const ask = (docs, system) => client.chat.completions.create({
    model: MODEL,
    messages: [
      { role: 'system', content: system },
      { role: 'user', content: 'Which document mentions tides?' },
    ],
    documents: docs, // chunkgate's extension: each document is a chunk
    max_completion_tokens: 4,
    temperature: 0,
  });
  const cold = await ask([DOC_C, DOC_B], 'You are the harbour assistant.');
  assert.equal(cold.object, 'chat.completion');
  assert.match(cold.id, /^chatcmpl-/);
  assert.equal(cold.choices[0].message.role, 'assistant');
  assert.equal(typeof cold.choices[0].message.content, 'string');
  assert.ok(cold.usage.completion_tokens <= 4, 'max_completion_tokens honoured');
  checkCacheReport(cold.chunk_cache, { chunks: 2 });

  const warm = await ask([DOC_B, DOC_C], 'You are the ferry assistant.');
  assert.deepEqual(warm.chunk_cache.segments.map((s) => s.hit), [false, true, true]);
  const cached = warm.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0);
  assert.equal(cached, hitTokens(warm.chunk_cache));
}));

test('chat: streamed deltas, and the SDK stream helper assembles the message', () => withLogs(async () => {
  const params = {
    model: MODEL,
    messages: [
      { role: 'system', content: 'Reply tersely.' },
      { role: 'user', content: `${DOC_A}${SEP}Is the lighthouse automated?` },
    ],
    max_tokens: 4,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  };
  const stream = await client.chat.completions.create(params);
  let content = '';
  const roles = [];
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      if (c.delta.role) roles.push(c.delta.role);
      content += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.deepEqual(roles, ['assistant'], 'role once, on the first delta');
  assert.ok(['length', 'stop'].includes(finish), `finish_reason ${finish}`);
  assert.ok(usage);
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, 'DOC_A cached by the first test');

  // The SDK's higher-level helper accumulates deltas into a ChatCompletion.
  const helper = client.chat.completions.stream({ ...params, stream: undefined });
  const final = await helper.finalChatCompletion();
  assert.equal(final.choices[0].message.role, 'assistant');
  assert.equal(final.choices[0].message.content, content, 'same greedy answer as the stream above');
  assert.equal(final.choices[0].finish_reason, finish);
}));

test('a client that abandons a stream leaves the gateway serving', () => withLogs(async () => {
  const stream = await client.completions.create({
    model: MODEL, prompt: `Be brief.${SEP}${DOC_B}${SEP}Count slowly.`, max_tokens: 200, stream: true,
  });
  for await (const chunk of stream) {
    assert.ok(chunk.choices);
    break; // leaving the loop aborts the request
  }
  const next = await client.completions.create({
    model: MODEL, prompt: `Be brief.${SEP}${DOC_B}${SEP}Ferry?`, max_tokens: 2,
  });
  assert.ok(next.chunk_cache.segments.every((s) => s.hit), 'both segments cached');
}));

test('models.list, and request ids round-trip', () => withLogs(async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(MODEL), `${MODEL} listed (${ids})`);

  const { data, response, request_id: rid } = await client.completions.create({
    model: MODEL, prompt: 'no separator here', max_tokens: 1,
  }, { headers: { 'X-Request-Id': 'compat-rid-1' } }).withResponse();
  assert.equal(response.status, 200);
  assert.equal(rid, 'compat-rid-1', 'the client\'s X-Request-Id is echoed');
  assert.equal(data.chunk_cache.passthrough, true, 'no separator: passed through');
  assert.equal(data.usage.prompt_tokens_details.cached_tokens, 0);
}));

test('errors: the SDK raises its typed errors with the OpenAI error body', () => withLogs(async () => {
  // Wrong type: the gateway validates before anything is forwarded.
  await assert.rejects(
    client.completions.create({ model: MODEL, prompt: 42, max_tokens: 1 }),
    (err) => {
      assert.ok(err instanceof OpenAI.APIError);
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.status, 400);
      assert.equal(err.type, 'invalid_request_error');
      assert.equal(err.code, 'invalid_type');
      assert.equal(err.param, 'prompt');
      assert.equal(typeof err.error.message, 'string');
      assert.match(err.requestID ?? '', /\S/, 'the error carries the request id');
      return true;
    });
  // A streamed request that is refused throws before any event, like OpenAI's API.
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [], stream: true }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && typeof err.code === 'string');
  // An unknown model: the worker's own 404, relayed in the OpenAI shape.
  await assert.rejects(
    client.completions.create({ model: 'no-such-model', prompt: `a${SEP}b${SEP}c`, max_tokens: 1 }),
    (err) => {
      assert.ok(err instanceof OpenAI.NotFoundError, `${err.constructor.name} ${err.status}`);
      assert.equal(err.status, 404);
      assert.equal(err.code, 'model_not_found');
      return true;
    });
  // A wrong API key: the SDK's AuthenticationError, before anything reaches a worker.
  await assert.rejects(
    clientWith('sk-wrong').completions.create({ model: MODEL, prompt: `a${SEP}b`, max_tokens: 1 }),
    (err) => {
      assert.ok(err instanceof OpenAI.AuthenticationError, `${err.constructor.name} ${err.status}`);
      assert.equal(err.status, 401);
      assert.equal(err.code, 'invalid_api_key');
      return true;
    });
  // The gateway keeps serving after the errors.
  const ok = await client.completions.create({ model: MODEL, prompt: `x${SEP}y`, max_tokens: 1 });
  assert.equal(ok.object, 'text_completion');
}));
