// End-to-end test of `fathom serve` with the official `openai` npm client (pinned in
// tests/npm/server). A tiny synthetic model (random weights, MTP on) is served; the checks cover
// chat and completions (plain and streamed), tool calls, JSON mode, errors, auth, limits, a slow
// client, 64 concurrent streams, client disconnects and the prefix cache, then /metrics.
// The tool-call round trip uses the server's test hook (--enable-test-hooks, request field
// "fathom_test_output"): a random-weight model cannot be asked to emit a call, so its output is
// forced while everything else (prompt rendering, parsing, streaming) runs for real.
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const BIN = process.env.FATHOM_BIN;
const SRC = process.env.FATHOM_SOURCE_DIR;
const require = createRequire(path.join(SRC, 'tests/npm/server/package.json'));
const { OpenAI } = require('openai');

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fathom-serve-'));
const modelDir = path.join(tmp, 'tiny');
execFileSync(BIN, ['synth', '--preset', 'tiny', '--dtype', 'bf16', '--format', 'hf', '--out', modelDir, '--seed', '7', '--mtp'],
             { stdio: ['ignore', 'ignore', 'inherit'] });

const KEY = 'sk-fathom-test';
// --speculation-always: drafts every step, so two runs of a request take the same path and the
// streamed and plain replies compared below are equal to the last bit (the default decides by
// timings; the engine's tests cover it).
const server = spawn(BIN, ['serve', '--model', modelDir, '--port', '0', '--api-key', KEY, '--enable-test-hooks',
                           '--speculation-always',
                           '--max-batch', '16', '--kv-cache-gb', '0.0625', '--max-context', '2048', '--max-body-mb', '1',
                           '--served-model-name', 'tiny-test'],
                     { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, FATHOM_THREADS: '2' } });
const base = await new Promise((resolve, reject) => {
  let out = '';
  server.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening on (http:\/\/[^\s]+)/);
    if (m) resolve(m[1]);
  });
  server.on('exit', (code) => reject(new Error(`server exited with ${code} before listening`)));
  setTimeout(() => reject(new Error('server did not start in 120 s')), 120000);
});
console.log(`server at ${base}`);
const client = new OpenAI({ apiKey: KEY, baseURL: `${base}/v1`, maxRetries: 0, timeout: 300000 });
let failures = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}
async function raw(method, route, { body, headers = {}, key = KEY } = {}) {
  const h = { ...headers };
  if (key) h.Authorization = `Bearer ${key}`;
  if (body !== undefined) h['Content-Type'] = 'application/json';
  const r = await fetch(`${base}${route}`, { method, headers: h, body });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, text, json };
}
const metric = (text, name) => {
  const m = text.match(new RegExp(`^${name.replace(/[{}"=/]/g, (c) => '\\' + c)} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};
const SPECIALS = /<｜[^｜]*｜>/;
const user = (content) => [{ role: 'user', content }];

await check('GET /v1/models lists the served name and "default"', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids.sort(), ['default', 'tiny-test']);
});

const req = { model: 'tiny-test', messages: user('Tell me a story about a lighthouse.'), temperature: 0, seed: 11, max_tokens: 24 };
let plain;
await check('chat completion', async () => {
  plain = await client.chat.completions.create(req);
  const c = plain.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(plain.usage.prompt_tokens > 5 && plain.usage.completion_tokens > 0);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
  assert.ok(!SPECIALS.test(c.message.content), 'special tokens leaked into content');
});

await check('streamed chat equals the non-streamed one at temperature 0 with a seed', async () => {
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const d = chunk.choices[0].delta;
    if (d.role) role = d.role;
    if (d.content) text += d.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const CALL = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>';
await check('tool-call round trip (model output forced by the test hook)', async () => {
  const messages = user('What is the weather in Paris?');
  const r1 = await client.chat.completions.create({ model: 'default', messages, tools, fathom_test_output: CALL });
  const c1 = r1.choices[0];
  assert.equal(c1.finish_reason, 'tool_calls');
  assert.equal(c1.message.tool_calls.length, 1);
  const call = c1.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(call.id.startsWith('call_'));
  messages.push(c1.message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21, "sky": "clear"}' });
  const r2 = await client.chat.completions.create({ model: 'default', messages, tools,
                                                     fathom_test_output: 'It is 21 °C and clear in Paris.' });
  assert.equal(r2.choices[0].finish_reason, 'stop');
  assert.equal(r2.choices[0].message.content, 'It is 21 °C and clear in Paris.');
  assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens);
});

await check('a reply that starts tool outputs ends there (only the client writes them)', async () => {
  const out = CALL.replace('<｜tool▁calls▁end｜>', '') +
      '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temp_c": 99}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>It is 99 degrees.';
  const r = await client.chat.completions.create({ model: 'default', messages: user('Weather in Paris?'), tools,
                                                  fathom_test_output: out });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.ok(!(c.message.content ?? '').includes('99'), c.message.content);
  // without tools no call can start: the reply ends at the first marker, and no marker reaches content
  const plain = await client.chat.completions.create({ model: 'default', messages: user('Weather in Paris?'),
                                                      fathom_test_output: 'It may rain.' + out });
  assert.equal(plain.choices[0].finish_reason, 'stop');
  assert.equal(plain.choices[0].message.content, 'It may rain.');
  assert.equal(plain.choices[0].message.tool_calls, undefined);
});

// DeepSeek-V3's chat markers are added tokens not flagged special, so a detokenizer keeps their
// text; a reply that produces one (a confused model re-writing a tool output, or starting the next
// user turn) has ended its turn, and the marker must not reach the client.
await check('a chat marker ends the reply and never reaches content (streamed and not)', async () => {
  const history = [...user('Run ls'), { role: 'assistant', content: null, tool_calls: [
                     { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
                   { role: 'tool', tool_call_id: 'call_1', content: 'app\n' }];
  const cases = [
    ['Exit status 0.<｜tool▁output▁end｜><｜tool▁outputs▁end｜>It is done.', 'Exit status 0.', history, tools],
    ['Sure.<｜User｜>And now?', 'Sure.', user('Hi'), undefined],
    ['Fine<｜Assistant｜>again', 'Fine', user('Hi'), tools],
    ['x<｜tool▁output▁begin｜>y', 'x', history, undefined],
  ];
  for (const [out, want, messages, t] of cases) {
    const r = await client.chat.completions.create({ model: 'default', messages, tools: t, fathom_test_output: out });
    assert.equal(r.choices[0].finish_reason, 'stop', out);
    assert.equal(r.choices[0].message.content, want, out);
    const s = await client.chat.completions.create({ model: 'default', messages, tools: t, stream: true,
                                                    fathom_test_output: out });
    let content = '', finish = null;
    for await (const chunk of s) {
      content += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    }
    assert.equal(finish, 'stop', out);
    assert.equal(content, want, out);
  }
  // ignore_eos treats the markers as it treats EOS: the reply runs on, the markers are cut out
  const r = await client.chat.completions.create({ model: 'default', messages: user('Hi'), ignore_eos: true, max_tokens: 20,
                                                  fathom_test_output: 'Sure.<｜User｜>And<｜tool▁call▁begin｜> now?' });
  assert.equal(r.choices[0].message.content, 'Sure.And now?');
});

await check('streamed tool call arrives as tool_calls deltas', async () => {
  const stream = await client.chat.completions.create({ model: 'default', messages: user('Weather in Paris?'), tools,
                                                        stream: true, fathom_test_output: CALL });
  let name = '', args = '', finish = null, content = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    for (const tc of d.tool_calls ?? []) {
      if (tc.function?.name) name += tc.function.name;
      if (tc.function?.arguments) args += tc.function.arguments;
    }
    if (d.content) content += d.content;
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(name, 'get_weather');
  assert.deepEqual(JSON.parse(args), { city: 'Paris' });
  assert.equal(finish, 'tool_calls');
  assert.ok(!SPECIALS.test(content));
});

// Malformed tool-call markup (as a random or confused model emits it) must never take the server
// down: streamed and not, each output ends with a finish_reason and the server keeps serving.
const MALFORMED = [
  'text <｜tool▁call▁begin｜> junk <｜tool▁sep｜>',
  '<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
  'There is the station\\n"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
  'a <｜tool▁calls▁begin｜>',
  'b <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city"',
  '<｜tool▁outputs▁begin｜> x <｜tool▁call▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜><｜tool▁sep｜>',
  '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```<｜tool▁call▁end｜>' +
    '<｜tool▁call▁begin｜>function<｜tool▁sep｜>',
];
await check('malformed tool-call markup never crashes the server nor reaches content (streamed and not)', async () => {
  for (const out of MALFORMED) {
    const r = await client.chat.completions.create({ model: 'default', messages: user('Weather?'), tools,
                                                    fathom_test_output: out });
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), out);
    assert.ok(!SPECIALS.test(r.choices[0].message.content ?? ''), `${out} -> ${r.choices[0].message.content}`);
    const s = await client.chat.completions.create({ model: 'default', messages: user('Weather?'), tools,
                                                    stream: true, fathom_test_output: out });
    let finish = null, content = '';
    for await (const chunk of s) {
      content += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    }
    assert.ok(['stop', 'length', 'tool_calls'].includes(finish), out);
    assert.ok(!SPECIALS.test(content), `${out} -> ${content} (streamed)`);
  }
  assert.equal((await raw('GET', '/health')).status, 200);
});

await check('free-running random output with tools (special tokens kept) streams to a finish', async () => {
  for (let seed = 1; seed <= 6; ++seed) {
    const s = await client.chat.completions.create({ model: 'default', messages: user('Weather?'), tools, stream: true,
                                                    temperature: 1.5, seed, max_tokens: 300 });
    let finish = null;
    for await (const chunk of s) if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    assert.ok(['stop', 'length', 'tool_calls'].includes(finish), `seed ${seed}`);
  }
  assert.equal((await raw('GET', '/health')).status, 200);
});

await check('a call cut off by max_tokens comes back as plain content with finish_reason length', async () => {
  const r = await client.chat.completions.create({ model: 'default', messages: user('Weather?'), tools, max_tokens: 8,
                                                   fathom_test_output: CALL });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'length');
  assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
  assert.ok(!SPECIALS.test(c.message.content ?? ''), `special tokens leaked: ${c.message.content}`);
});

await check('response_format json_object constrains the output to JSON', async () => {
  const r = await client.chat.completions.create({ model: 'default', messages: user('Give me JSON.'), temperature: 0.8, seed: 5,
                                                   max_tokens: 48, response_format: { type: 'json_object' } });
  const text = r.choices[0].message.content;
  assert.ok(text.trimStart().startsWith('{'), text);
  if (r.choices[0].finish_reason === 'stop') JSON.parse(text);
});

await check('response_format json_schema: every reply follows the schema', async () => {
  // No free strings: the grammar bounds the object's length, so it closes within max_tokens.
  const schema = { type: 'object', additionalProperties: false, required: ['color', 'n', 'ok', 'tags'],
                   properties: { color: { enum: ['red', 'green', 'blue'] }, n: { type: 'integer' }, ok: { type: 'boolean' },
                                 tags: { type: 'array', items: { enum: ['a', 'b'] }, minItems: 1, maxItems: 2 } } };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: 'default', messages: user('Describe a thing.'), temperature: 0.9, seed, max_tokens: 400,
      response_format: { type: 'json_schema', json_schema: { name: 'thing', schema, strict: true } } });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v).sort(), ['color', 'n', 'ok', 'tags'], c.message.content);
    assert.ok(['red', 'green', 'blue'].includes(v.color) && Number.isInteger(v.n) && typeof v.ok === 'boolean', c.message.content);
    assert.ok(v.tags.length >= 1 && v.tags.length <= 2 && v.tags.every((t) => t === 'a' || t === 'b'), c.message.content);
  }
  const bad = await raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { enum: [] } } } } } }) });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'response_format.json_schema.schema', bad.text);
});

await check('logit_bias forces a token; ids outside the vocabulary are a 400', async () => {
  // +100 on one token: every sampled token is that one.
  const forced = await client.completions.create({ model: 'tiny-test', prompt: 'Once upon a time', max_tokens: 5,
                                                   temperature: 0.8, seed: 3, logprobs: 1, logit_bias: { 300: 100 } });
  const ft = forced.choices[0].logprobs.tokens;
  assert.equal(ft.length, 5, JSON.stringify(forced.choices[0]));
  assert.ok(ft.every((t) => t === ft[0]), JSON.stringify(ft));
  const bad = await raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, logit_bias: { 99999999: 5 } }) });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'logit_bias', bad.text);
});

await check('completions, plain and streamed, agree', async () => {
  const p = { model: 'tiny-test', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
  const a = await client.completions.create(p);
  let text = '';
  for await (const chunk of await client.completions.create({ ...p, stream: true })) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, a.choices[0].text);
  assert.equal(a.object, 'text_completion');
});

// Every generated token reaches a streamed client with its log-probability, also the tokens that
// add no text (a random-weight model's special tokens, a character's first bytes): a chunk per
// engine step, as vLLM's completions stream sends, and chat chunks carry logprobs.content.
await check('streamed completions and chat carry every token and its logprobs', async () => {
  const p = { model: 'tiny-test', prompt: [5, 6, 7, 8, 9, 10, 11, 12], max_tokens: 24, temperature: 0, ignore_eos: true,
              logprobs: 1 };
  const plain = await client.completions.create(p);
  const want = plain.choices[0].logprobs;
  assert.equal(want.tokens.length, 24, JSON.stringify(plain.choices[0]));
  const tokens = [], lps = [];
  let chunks = 0, usage = null;
  for await (const chunk of await client.completions.create({ ...p, stream: true, stream_options: { include_usage: true } })) {
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c || c.finish_reason) continue;
    ++chunks;
    tokens.push(...c.logprobs.tokens);
    lps.push(...c.logprobs.token_logprobs);
  }
  assert.equal(usage.completion_tokens, 24);
  assert.deepEqual(tokens, want.tokens);
  lps.forEach((v, i) => assert.ok(Math.abs(v - want.token_logprobs[i]) < 1e-3, `token ${i}: ${v} vs ${want.token_logprobs[i]}`));
  assert.ok(chunks >= 12, `${chunks} chunks for 24 tokens (one per step; two tokens where a draft is accepted)`);
  const q = { model: 'tiny-test', messages: user('Tell me a story'), max_tokens: 16, temperature: 0, logprobs: true,
              top_logprobs: 2, ignore_eos: true };
  const chat = await client.chat.completions.create(q);
  const chatWant = chat.choices[0].logprobs.content;
  assert.equal(chatWant.length, 16);
  const got = [];
  for await (const chunk of await client.chat.completions.create({ ...q, stream: true })) {
    const c = chunk.choices[0];
    if (c?.logprobs?.content) got.push(...c.logprobs.content);
  }
  assert.deepEqual(got.map((e) => e.token), chatWant.map((e) => e.token));
  got.forEach((e, i) => {
    assert.ok(Math.abs(e.logprob - chatWant[i].logprob) < 1e-3, `chat token ${i}`);
    assert.equal(e.top_logprobs.length, 2);
  });
});

await check('bad requests get OpenAI error objects with the right status', async () => {
  const cases = [
    [raw('POST', '/v1/chat/completions', { body: '{"model": "tiny-test", "messages": [' }), 400, null],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, temperature: 'hot' }) }), 400, 'temperature'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, temperature: 3 }) }), 400, 'temperature'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, top_p: 0 }) }), 400, 'top_p'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, max_tokens: -1 }) }), 400, 'max_tokens'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, n: 2 }) }), 400, 'n'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, messages: [{ role: 'tool', content: 'x', tool_call_id: 'a' }] }) }), 400, 'messages[0].role'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, messages: [] }) }), 400, 'messages'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, model: 'gpt-4' }) }), 404, 'model'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, messages: user('word '.repeat(3000)) }) }), 400, 'messages'],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify(req), key: null }), 401, null],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify(req), key: 'sk-wrong' }), 401, null],
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, messages: user('x'.repeat(2 << 20)) }) }), 413, null],
    [raw('GET', '/v1/nope'), 404, null],
    // 200000 nested arrays (400 KB) in a tool's parameters: dumping them recursed per level and
    // the server died of a stack overflow; refused before parsing now, and the server serves on.
    [raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] })
      .replace('{"type":"object"}', '{"type":"object","properties":{"a":' + '['.repeat(200000) + ']'.repeat(200000) + '}}') }), 400, null],
  ];
  for (const [p, status, param] of cases) {
    const r = await p;
    assert.equal(r.status, status, `${r.status} ${r.text.slice(0, 200)}`);
    assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string', r.text.slice(0, 200));
    assert.ok('type' in r.json.error && 'param' in r.json.error && 'code' in r.json.error);
    if (param) assert.equal(r.json.error.param, param);
  }
  const nf = await raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, model: 'gpt-4' }) });
  assert.equal(nf.json.error.code, 'model_not_found');
  const long = await raw('POST', '/v1/chat/completions', { body: JSON.stringify({ ...req, messages: user('word '.repeat(3000)) }) });
  assert.equal(long.json.error.code, 'context_length_exceeded');
  const health = await raw('GET', '/health', { key: null });
  assert.equal(health.status, 200);
});

await check('a slow client does not stop the others', async () => {
  const sock = net.connect(new URL(base).port, '127.0.0.1');
  await new Promise((r) => sock.on('connect', r));
  sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');  // and then nothing more
  const r = await client.chat.completions.create({ ...req, max_tokens: 4 });
  assert.ok(r.choices[0].message.content !== undefined);
  sock.destroy();
});

// Debian's compiled cpp-httplib listens with a backlog of 5; with both cores in the engine, 32
// clients connecting at once overflowed it and some connections were reset. The server raises it.
await check('the listening socket queues 1024 connections (capped by somaxconn)', async () => {
  const port = new URL(base).port;
  const somaxconn = Number(fs.readFileSync('/proc/sys/net/core/somaxconn', 'utf8'));
  const line = execFileSync('ss', ['-ltnH', `sport = :${port}`], { encoding: 'utf8' }).trim();
  const backlog = Number(line.split(/\s+/)[2]);  // State Recv-Q Send-Q ...: Send-Q is the backlog
  assert.equal(backlog, Math.min(1024, somaxconn), line);
});

await check('64 concurrent streams all complete', async () => {
  const one = async (i) => {
    const s = await client.chat.completions.create({ model: 'tiny-test', messages: user(`Request number ${i}: say something.`),
                                                     max_tokens: 16, temperature: 0.7, seed: i, stream: true });
    let n = 0;
    for await (const chunk of s) if (chunk.choices[0]?.delta?.content) n++;
    return n;
  };
  const results = await Promise.allSettled(Array.from({ length: 64 }, (_, i) => one(i)));
  const failed = results.filter((r) => r.status === 'rejected');
  assert.equal(failed.length, 0, failed.map((f) => String(f.reason)).join('\n'));
  const m = (await raw('GET', '/metrics')).text;
  assert.ok(metric(m, 'fathom_requests_total{route="/v1/chat/completions",status="200"}') >= 64);
  assert.ok(metric(m, 'fathom_generation_tokens_total') >= 64);
  assert.ok(/fathom_time_to_first_token_seconds_count \d+/.test(m));
});

await check('a client that disconnects mid-stream releases its pages', async () => {
  const ctl = new AbortController();
  // ignore_eos: the random model's greedy reply would end at a chat marker after ~50 tokens
  const s = await client.chat.completions.create({ ...req, max_tokens: 1500, ignore_eos: true, stream: true },
                                                 { signal: ctl.signal });
  let n = 0;
  try {
    for await (const chunk of s) {
      if (++n === 3) ctl.abort();
    }
  } catch {}
  let m = '';
  for (let i = 0; i < 100; i++) {
    m = (await raw('GET', '/metrics')).text;
    if (metric(m, 'fathom_requests_cancelled_total') >= 1 && metric(m, 'fathom_kv_cache_pages_used') === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(metric(m, 'fathom_requests_cancelled_total') >= 1, 'no cancellation recorded');
  assert.equal(metric(m, 'fathom_kv_cache_pages_used'), 0);
});

await check('a shared long prefix is served from the prefix cache', async () => {
  const long = 'The lighthouse keeper wrote in his log every night. '.repeat(40);
  const a = await client.chat.completions.create({ model: 'tiny-test', messages: user(long + 'First question?'), max_tokens: 2 });
  const b = await client.chat.completions.create({ model: 'tiny-test', messages: user(long + 'Second question?'), max_tokens: 2 });
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(b.usage));
  assert.ok(b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens);
  const m = (await raw('GET', '/metrics')).text;
  assert.ok(metric(m, 'fathom_prefix_cache_hit_pages_total') >= 1);
  assert.ok(metric(m, 'fathom_spec_decode_draft_tokens_total') > 0, 'MTP speculation never ran');
  // --speculation-always: every decode step drafted
  assert.ok(metric(m, 'fathom_spec_decode_steps_drafting_total') > 0);
  assert.equal(metric(m, 'fathom_spec_decode_steps_plain_total'), 0);
});

await check('fathom chat streams a reply', async () => {
  const out = execFileSync(BIN, ['chat', '--url', base, '--api-key', KEY, '--max-tokens', '8', '--temperature', '0'],
                           { input: 'Hello there\n', encoding: 'utf8' });
  assert.ok(out.length > 0);
});

server.kill('SIGTERM');
await new Promise((r) => server.on('exit', r));
fs.rmSync(tmp, { recursive: true, force: true });
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
