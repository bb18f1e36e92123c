// Smoke test of `fathom bench serve` (in-process engine) on a tiny synthetic MoE model (16
// experts, top-4). Checks that the figures follow from the workload (request and token counts,
// latency sample counts), that the roofline figures are consistent with the raw bytes, FLOPs and
// the measured machine in the same JSON, that a single stream reads exactly top-k experts per MoE
// layer per step, that the prefix case is served from the cache, and that bad options fail with an
// error naming the option; then the same load through a real `fathom serve` (--url). No timing
// assertions: speed is what the benchmark reports.
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const BIN = process.env.FATHOM_BIN;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fathom-bench-serve-'));
const modelDir = path.join(tmp, 'tiny');
const env = { ...process.env, FATHOM_NO_PROGRESS: '1', FATHOM_THREADS: '2' };
execFileSync(BIN, ['synth', '--preset', 'tiny', '--dtype', 'bf16', '--out', modelDir, '--seed', '3'],
             { stdio: ['ignore', 'ignore', 'inherit'], env });

function bench(args) {
  return spawnSync(BIN, ['bench', 'serve', '--model', modelDir, ...args], { encoding: 'utf8', env, timeout: 240000 });
}
const close = (a, b, rel = 1e-9) => Math.abs(a - b) <= rel * Math.max(Math.abs(a), Math.abs(b), 1e-30);

try {
  // 1. JSON figures.
  const PROMPT = 32, GEN = 8, RPC = 2, PREFIX = 512;
  const r = bench(['--concurrency', '1,4', '--prompt-tokens', String(PROMPT), '--gen-tokens', String(GEN),
                   '--requests-per-client', String(RPC), '--prefix-tokens', String(PREFIX), '--prefix-repeats', '2',
                   '--json']);
  assert.equal(r.status, 0, `bench serve failed: ${r.stderr}`);
  const lines = r.stdout.trim().split('\n');
  const j = JSON.parse(lines[lines.length - 1]);
  assert.equal(j.http, 'excluded (in-process engine)');
  assert.ok(j.bandwidth_gbs > 0 && j.peak_bf16_gflops > 0 && j.peak_gflops > 0);
  // the outer roofline uses the higher of the readings before and after the run
  assert.equal(j.bandwidth_gbs, Math.max(j.bandwidth_before_gbs, j.bandwidth_after_gbs));
  assert.equal(j.routed_experts, 16);
  assert.equal(j.experts_per_token, 4);
  assert.deepEqual(j.levels.map((l) => l.concurrency), [1, 4]);
  for (const l of j.levels) {
    const reqs = l.concurrency * RPC;
    assert.equal(l.requests, reqs);
    assert.equal(l.output_tokens, reqs * GEN, 'every request generates exactly --gen-tokens');
    assert.equal(l.prompt_tokens, reqs * PROMPT);
    assert.ok(close(l.output_tokens_per_s, l.output_tokens / l.seconds));
    assert.equal(l.ttft_ms.n, reqs);
    assert.equal(l.itl_ms.n, reqs * (GEN - 1));
    for (const s of [l.ttft_ms, l.itl_ms, l.tpot_ms, l.e2e_ms]) {
      assert.ok(s.p50 >= 0 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max, JSON.stringify(s));
    }
    assert.ok(l.ttft_ms.max <= l.e2e_ms.max);
    // Each level's roofline divides by the mean of the readings right before and after it.
    assert.ok(l.bandwidth_before_gbs > 0 && l.bandwidth_after_gbs > 0);
    assert.ok(close(l.bandwidth_gbs, (l.bandwidth_before_gbs + l.bandwidth_after_gbs) / 2));
    const d = l.decode, o = l.decode_outer;
    // The outer measure: the same steps against the run-wide reading.
    assert.deepEqual([o.steps, o.tokens, o.weight_bytes, o.kv_bytes], [d.steps, d.tokens, d.weight_bytes, d.kv_bytes]);
    assert.ok(close(o.memory_seconds, (o.weight_bytes + o.kv_bytes) / (j.bandwidth_gbs * 1e9), 1e-6));
    // The first token of a request comes from its prefill step; the rest from decode steps.
    assert.ok(d.tokens > 0 && d.tokens <= l.output_tokens - reqs, JSON.stringify(d));
    // Without --ab every step runs on variant 0.
    assert.deepEqual([d.ab.variant0_tokens, d.ab.variant1_tokens, d.ab.variant1_seconds, d.ab.variant0_over_variant1],
                     [d.tokens, 0, 0, 0]);
    assert.ok(close(d.ab.variant0_seconds, d.seconds));
    assert.ok(d.steps > 0 && d.weight_bytes > 0 && d.kv_bytes > 0 && d.linear_flops > 0 && d.attention_flops > 0);
    assert.ok(close(d.batch_mean, d.tokens / d.steps));
    assert.ok(d.batch_mean <= l.concurrency + 1e-9);
    // The roofline follows from the raw figures and the machine measured in the same run.
    assert.ok(close(d.memory_seconds, (d.weight_bytes + d.kv_bytes) / (l.bandwidth_gbs * 1e9), 1e-6));
    assert.ok(close(d.compute_seconds, d.linear_flops / (j.peak_gflops * 1e9) + d.attention_flops / (j.peak_bf16_gflops * 1e9), 1e-6));
    assert.ok(d.roofline_seconds >= Math.max(d.memory_seconds, d.compute_seconds) * (1 - 1e-9));
    assert.ok(d.roofline_seconds <= (d.memory_seconds + d.compute_seconds) * (1 + 1e-9));
    assert.ok(close(d.roofline_fraction, d.roofline_seconds / d.seconds));
    assert.ok(d.forward_seconds <= d.seconds * (1 + 1e-9));
    // Each routed expert the batch selected is counted once per layer per step.
    assert.ok(d.experts_per_moe_layer >= 4 - 1e-9 && d.experts_per_moe_layer <= Math.min(16, 4 * d.batch_mean) + 1e-9,
              `experts per layer ${d.experts_per_moe_layer}`);
  }
  const single = j.levels[0].decode;
  assert.equal(single.batch_mean, 1);
  assert.ok(close(single.experts_per_moe_layer, 4), 'a single token reads exactly its top-4 experts');
  assert.ok(j.levels[1].decode.weight_bytes / j.levels[1].decode.steps > single.weight_bytes / single.steps,
            'a batch of 4 reads more distinct experts per step than one token');
  assert.equal(j.prefix.prefix_tokens, PREFIX);
  assert.equal(j.prefix.cached_tokens, PREFIX, 'the whole page-aligned prefix comes from the cache');
  assert.ok(j.prefix.uncached_ttft_ms > 0 && j.prefix.cached_ttft_ms > 0);
  assert.ok(close(j.prefix.speedup, j.prefix.uncached_ttft_ms / j.prefix.cached_ttft_ms));

  // 2. The table precedes the JSON line.
  assert.match(r.stdout, /machine: read [\d.]+ GB\/s/);
  assert.match(r.stdout, /conc\s+reqs\s+out tok\/s\s+TTFT p50\/p99 ms\s+ITL p50\/p99 ms\s+steps/);
  assert.match(r.stdout, /\n\s+4\s+8\s+[\d.]+ /);
  assert.match(r.stdout, /prefix cache: 512-token prefix \+ 32: TTFT uncached [\d.]+ ms, cached [\d.]+ ms \(512 tokens/);

  // 2b. --ab: the engine alternates the two variants step by step; the decode steps split between
  // them and the ratio is their seconds per token.
  {
    const a = bench(['--concurrency', '2', '--prompt-tokens', '32', '--gen-tokens', '12', '--prefix-tokens', '0',
                     '--ab', '--json']);
    assert.equal(a.status, 0, `bench serve --ab failed: ${a.stderr}`);
    const al = a.stdout.trim().split('\n');
    const d = JSON.parse(al[al.length - 1]).levels[0].decode;
    assert.equal(d.ab.variant0_tokens + d.ab.variant1_tokens, d.tokens);
    assert.ok(d.ab.variant0_tokens > 0 && d.ab.variant1_tokens > 0, JSON.stringify(d.ab));
    assert.ok(Math.abs(d.ab.variant0_tokens - d.ab.variant1_tokens) <= 2 * 2, 'alternate steps of up to 2 tokens');
    assert.ok(close(d.ab.variant0_seconds + d.ab.variant1_seconds, d.seconds, 1e-9));
    assert.ok(close(d.ab.variant0_over_variant1, (d.ab.variant0_seconds / d.ab.variant0_tokens) /
                                                 (d.ab.variant1_seconds / d.ab.variant1_tokens), 1e-9));
    assert.match(a.stdout, /A\/B at 2 clients: variant 0 [\d.]+ ms\/token \(\d+ tokens\), variant 1 [\d.]+ ms\/token/);
  }

  // 3. Bad options: exit 1 and an error naming the problem (checked before the model loads).
  const bad = [
    [['--concurrency', '0'], /--concurrency: 0 is outside 1\.\.256/],
    [['--concurrency', '1,x'], /--concurrency/],
    [['--gen-tokens', '0'], /--gen-tokens 0 must be at least 1/],
    [['--prompt-tokens', '-3'], /--prompt-tokens -3/],
    [['--prefix-tokens', '-1'], /--prefix-tokens -1/],
    [['--kv-dtype', 'int4'], /int4/],
    [['--kv-cache-gb', '0'], /--kv-cache-gb/],
    [['--prefix-tokens', '100000'], /--prefix-tokens 100000 \+ --prompt-tokens 128 exceed the model's context/],
    [['--bogus'], /--bogus/],
    [['--api-key', 'k'], /--api-key and --served-model apply to a server: give its --url/],
    [['--url', 'ftp://x'], /--url 'ftp:\/\/x' must start with http:\/\//],
    [['--ab', '--url', 'http://127.0.0.1:1'], /--ab alternates the in-process engine's steps: it does not apply with --url/],
  ];
  for (const [args, re] of bad) {
    const b = bench(args);
    assert.equal(b.status, 1, `${args.join(' ')} should fail: ${b.stdout} ${b.stderr}`);
    assert.match(b.stderr, /fathom bench serve: error: /);
    assert.match(b.stderr, re, `${args.join(' ')}: ${b.stderr}`);
  }
  const missing = spawnSync(BIN, ['bench', 'serve', '--model', path.join(tmp, 'nope')], { encoding: 'utf8', env });
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /nope/);
  // 4. --url: the same load through a real `fathom serve`, streamed /v1/completions.
  const server = spawn(BIN, ['serve', '--model', modelDir, '--port', '0', '--max-batch', '8', '--api-key', 'k1'],
                       { stdio: ['ignore', 'pipe', 'inherit'], env });
  try {
    let timer;
    const url = await new Promise((resolve, reject) => {
      let out = '';
      server.stdout.on('data', (d) => {
        out += d;
        const m = out.match(/listening on (http:\/\/[^\s]+)/);
        if (m) resolve(m[1]);
      });
      server.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
      timer = setTimeout(() => reject(new Error('server did not start in 60 s')), 60000);
    }).finally(() => clearTimeout(timer));
    const run = (args) => new Promise((resolve) => {
      const p = spawn(BIN, ['bench', 'serve', '--model', modelDir, '--url', url, ...args], { env });
      let stdout = '', stderr = '';
      p.stdout.on('data', (d) => { stdout += d; });
      p.stderr.on('data', (d) => { stderr += d; });
      p.on('exit', (status) => resolve({ status, stdout, stderr }));
    });
    const h = await run(['--api-key', 'k1', '--concurrency', '1,3', '--prompt-tokens', '16', '--gen-tokens', '6',
                         '--prefix-tokens', '128', '--json']);
    assert.equal(h.status, 0, h.stderr);
    const hl = h.stdout.trim().split('\n');
    const hj = JSON.parse(hl[hl.length - 1]);
    assert.equal(hj.mode, 'http');
    for (const l of hj.levels) {
      assert.equal(l.requests, l.concurrency);
      assert.equal(l.output_tokens, l.concurrency * 6, 'usage.completion_tokens of every request');
      assert.equal(l.ttft_ms.n, l.concurrency);
      // a chunk per token (no MTP module here), those that add no text included
      assert.equal(l.itl_ms.n, l.concurrency * 5, 'inter-token gaps of every request');
      assert.equal(l.decode, null, 'no step roofline over HTTP');
      assert.equal(l.decode_outer, null);
      assert.equal(l.bandwidth_gbs, null);
    }
    assert.equal(hj.prefix.cached_tokens, 128, 'usage.prompt_tokens_details.cached_tokens');
    // A second run against the same server still measures an uncached prefix.
    const again = await run(['--api-key', 'k1', '--concurrency', '1', '--prompt-tokens', '16', '--gen-tokens', '2',
                             '--prefix-tokens', '128', '--json']);
    assert.equal(again.status, 0, again.stderr);
    const noKey = await run(['--concurrency', '1']);
    assert.equal(noKey.status, 1);
    assert.match(noKey.stderr, /HTTP 401/);
    const wrongName = await run(['--api-key', 'k1', '--served-model', 'nope']);
    assert.equal(wrongName.status, 1);
    assert.match(wrongName.stderr, /does not serve a model named 'nope'/);
  } finally {
    server.kill('SIGTERM');
  }
  const down = bench(['--url', 'http://127.0.0.1:1', '--concurrency', '1']);
  assert.equal(down.status, 1);
  assert.match(down.stderr, /cannot reach http:\/\/127\.0\.0\.1:1/);
  console.log('bench serve smoke: ok');
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
