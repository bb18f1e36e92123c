// End-to-end test of `fathom serve --kv-store` with real processes: a `fathom store server` on a
// temporary target and `fathom serve` on a tiny synthetic model (random weights, MTP on).
//
//  1. Reference answers come from servers without the store: every prompt prefilled whole (prefix
//     cache off), and every prompt with its shared prefix already in memory. The two can differ:
//     a cached prefix leaves a smaller prefill batch, and the matmul kernels round differently at
//     <= 16 and > 16 rows per expert (docs/engine.md), which can flip a near-tie greedy token of
//     this random-weight model. So each answer is held to the reference with the same number of
//     cached prompt tokens, bit for bit.
//  2. A server with the store answers a long prompt (several 64-token pages) and writes its
//     pages through; it is stopped with SIGTERM. A new server answers a prompt sharing that
//     prefix: the pages come from the store (store hit and imported pages in /metrics, cached
//     prompt tokens in the usage) and the tokens equal those of the prefix held in memory.
//  3. The same after kill -9 of the serving process (write-through, not shutdown, kept the pages).
//  4. The store killed mid-run, and the store down when the server starts: requests still
//     succeed with the reference tokens, and the failures are counted.
// Uses Node's own fetch; no npm packages.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const BIN = process.env.FATHOM_BIN;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fathom-kvstore-'));
const modelDir = path.join(tmp, 'tiny');
execFileSync(BIN, ['synth', '--preset', 'tiny', '--dtype', 'bf16', '--format', 'hf', '--out', modelDir, '--seed', '5', '--mtp'],
             { stdio: ['ignore', 'ignore', 'inherit'] });

const children = new Set();
process.on('exit', () => { for (const c of children) c.kill('SIGKILL'); fs.rmSync(tmp, { recursive: true, force: true }); });

// Spawns a command and resolves with the first stdout match of `re`.
function start(args, re, what) {
  const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, FATHOM_THREADS: '2' } });
  children.add(proc);
  proc.on('exit', () => children.delete(proc));
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(re);
      if (m) resolve({ proc, match: m[1] });
    });
    proc.on('exit', (code, sig) => reject(new Error(`${what} exited (${code ?? sig}) before it was ready`)));
    setTimeout(() => reject(new Error(`${what} not ready in 120 s`)), 120000);
  });
}
const exited = (proc) => new Promise((resolve) => {
  if (proc.exitCode !== null || proc.signalCode !== null) resolve(proc.exitCode ?? proc.signalCode);
  else proc.on('exit', (code, sig) => resolve(code ?? sig));
});

async function startStore(listen = '127.0.0.1:0') {
  const { proc, match } = await start(['store', 'server', '--target', path.join(tmp, 'target'), '--listen', listen,
                                       '--capacity', '256M', '--group-size', '4M'],
                                      /ready listen=(\S+)/, 'store server');
  return { proc, addr: match };
}
async function startServe(store, extra = []) {
  // --speculation-always: every run of a request takes the same path (drafting where it measures
  // faster decides by timings), so the servers' tokens can be compared
  const args = ['serve', '--model', modelDir, '--port', '0', '--max-batch', '4', '--kv-cache-gb', '0.0625',
                '--max-context', '2048', '--served-model-name', 'tiny', '--speculation-always', ...extra];
  if (store) args.push('--kv-store', store, '--kv-store-timeout-ms', '3000');
  const { proc, match } = await start(args, /listening on (http:\/\/\S+)/, 'fathom serve');
  return { proc, base: match };
}

async function complete(base, prompt) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', prompt, max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 0 }),
  });
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  return { text: body.choices[0].text, tokens: body.choices[0].logprobs?.tokens, usage: body.usage };
}
async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  return (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
}
async function waitFor(base, name, atLeast) {
  for (let i = 0; i < 200; i++) {
    const v = (await metrics(base))(name);
    if (v >= atLeast) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${name} never reached ${atLeast}`);
}

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

const A = 'The lighthouse keeper wrote in his log every night, counting ships and storms. '.repeat(24);
const B = 'A river runs through the old town, under seven stone bridges and past the mill. '.repeat(24);
const prompts = { a1: A + 'What did he see first?', a2: A + 'Which storm was the worst?',
                  b1: B + 'Name the bridges.', b2: B + 'Who owns the mill?' };
const refCold = {}, refWarm = {};
const cachedOf = (r) => r.usage.prompt_tokens_details?.cached_tokens ?? 0;
// `got` (an answer to prompts[key]) against the reference with as many cached prompt tokens.
const same = (got, key) => {
  const want = cachedOf(got) > 0 ? refWarm[key] : refCold[key];
  assert.equal(cachedOf(got), cachedOf(want), `cached prompt tokens of ${key}`);
  assert.equal(got.text, want.text);
  if (want.tokens) assert.deepEqual(got.tokens, want.tokens);
};
const partner = { a1: 'a2', a2: 'a1', b1: 'b2', b2: 'b1' };

await check('reference answers from servers without the store', async () => {
  let s = await startServe(null, ['--no-prefix-cache']);
  for (const [k, p] of Object.entries(prompts)) refCold[k] = await complete(s.base, p);
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
  s = await startServe(null);
  for (const k of Object.keys(prompts)) {
    await complete(s.base, prompts[partner[k]]);  // puts the shared prefix in memory
    refWarm[k] = await complete(s.base, prompts[k]);
    assert.ok(cachedOf(refWarm[k]) >= 3 * 64, JSON.stringify(refWarm[k].usage));
  }
  assert.ok(Array.isArray(refCold.a1.tokens) && refCold.a1.tokens.length === 12, 'no tokens in the logprobs');
  assert.ok(refCold.a1.usage.prompt_tokens >= 4 * 64, `the prompt is only ${refCold.a1.usage.prompt_tokens} tokens`);
  assert.equal(cachedOf(refCold.a1), 0);
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
});

const store = await startStore();
console.log(`store at ${store.addr}`);
const pagesOf = (usage) => Math.floor((usage.prompt_tokens - 1) / 64);

await check('a restarted server (SIGTERM) reads the shared prefix back from the store', async () => {
  let s = await startServe(store.addr);
  const cold = await complete(s.base, prompts.a1);
  same(cold, 'a1');
  await waitFor(s.base, 'fathom_kv_store_pages_written_total', pagesOf(cold.usage));
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
  s = await startServe(store.addr);
  const warm = await complete(s.base, prompts.a2);
  same(warm, 'a2');
  const m = await metrics(s.base);
  assert.ok(m('fathom_kv_store_hit_pages_total') >= 3, `hit pages ${m('fathom_kv_store_hit_pages_total')}`);
  assert.equal(m('fathom_kv_store_imported_pages_total'), m('fathom_kv_store_hit_pages_total'));
  assert.ok(warm.usage.prompt_tokens_details.cached_tokens >= 3 * 64, JSON.stringify(warm.usage));
  assert.ok(m('fathom_prefix_cache_hit_pages_total') >= 3);
  assert.equal(m('fathom_kv_store_import_errors_total'), 0);
  assert.equal(m('fathom_kv_store_up'), 1);
  // The same prompt as the cold run, now with the prefix in memory.
  same(await complete(s.base, prompts.a1), 'a1');
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
});

let serve3;
await check('after kill -9 the write-through pages are in the store', async () => {
  let s = await startServe(store.addr);
  const cold = await complete(s.base, prompts.b1);
  same(cold, 'b1');
  assert.equal(cold.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  await waitFor(s.base, 'fathom_kv_store_pages_written_total', pagesOf(cold.usage));
  s.proc.kill('SIGKILL');
  await exited(s.proc);
  s = serve3 = await startServe(store.addr);
  const warm = await complete(s.base, prompts.b2);
  same(warm, 'b2');
  const m = await metrics(s.base);
  assert.ok(m('fathom_kv_store_hit_pages_total') >= 3);
  assert.ok(warm.usage.prompt_tokens_details.cached_tokens >= 3 * 64, JSON.stringify(warm.usage));
});

await check('the store killed mid-run: requests still succeed, failures are counted', async () => {
  const s = serve3;
  store.proc.kill('SIGKILL');
  await exited(store.proc);
  const r = await complete(s.base, prompts.a2);  // not in this server's memory: asks the dead store
  same(r, 'a2');
  const m = await metrics(s.base);
  assert.ok(m('fathom_kv_store_errors_total') >= 1);
  assert.equal(m('fathom_kv_store_up'), 0);
  assert.equal(m('fathom_requests_failed_total'), 0);
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
});

await check('the store down when the server starts: requests succeed cold', async () => {
  const s = await startServe(store.addr);
  const r = await complete(s.base, prompts.b1);
  same(r, 'b1');
  assert.equal(r.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
  const m = await metrics(s.base);
  assert.ok(m('fathom_kv_store_errors_total') >= 1);
  assert.equal(m('fathom_requests_failed_total'), 0);
  s.proc.kill('SIGTERM');
  assert.equal(await exited(s.proc), 0);
});

await check('a bad --kv-store is refused with a clear error', async () => {
  let err = '';
  try {
    execFileSync(BIN, ['serve', '--model', modelDir, '--kv-store', 'nohost'], { stdio: ['ignore', 'ignore', 'pipe'] });
  } catch (e) {
    err = String(e.stderr);
  }
  assert.match(err, /--kv-store 'nohost': expected HOST:PORT/);
});

console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
