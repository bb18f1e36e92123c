// `fathom agent` against a real `fathom serve` (not a test double): the server renders the agent's
// tools into DeepSeek-V3's chat template, streams, and parses the model's tool-call tokens back into
// OpenAI tool_calls; the agent runs them through the `fathom mcp files` plugin and sends the
// results back. A random-weight model cannot decide to call a tool, so the model's outputs for
// the first three turns are forced with the server's test hook (--test-outputs): everything else
// runs for real. A second run, with no forced outputs left, lets the random model answer freely:
// the agent must still end cleanly (final answer or step limit), whatever the model emits.
import { spawn, execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const BIN = process.env.FATHOM_BIN;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'fathom-agent-serve-'));
const modelDir = path.join(tmp, 'tiny');
execFileSync(BIN, ['synth', '--preset', 'tiny', '--dtype', 'bf16', '--format', 'hf', '--out', modelDir, '--seed', '11'],
             { stdio: ['ignore', 'ignore', 'inherit'] });

const call = (name, args) =>
  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${JSON.stringify(args)}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>`;
const outputsFile = path.join(tmp, 'outputs.json');
fs.writeFileSync(outputsFile, JSON.stringify([
  call('files__write_file', { path: 'notes/hello.txt', content: 'hi from fathom serve\n' }),
  call('files__read_file', { path: 'notes/hello.txt' }),
  'The file says: hi from fathom serve.',
]));

const server = spawn(BIN, ['serve', '--model', modelDir, '--port', '0', '--test-outputs', outputsFile,
                           '--kv-cache-gb', '0.0625', '--max-context', '4096'],
                     { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, FATHOM_THREADS: '2' } });
let failures = 0;
// How the server ended, if it did before the test stopped it (a crash leaves no line on stderr).
let serverExit = null;
server.on('exit', (code, signal) => { serverExit = { code, signal }; });
try {
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
  const agent = (ws, task, extra = []) => {
    fs.mkdirSync(ws, { recursive: true });
    const r = spawnSync(BIN, ['agent', '--endpoint', `${base}/v1`, '--model', 'default', '--workspace', ws,
                              '--plugin', 'fathom mcp files', '--json', ...extra, task],
                        { encoding: 'utf8', timeout: 300000 });
    const lines = r.stdout.trim().split('\n');
    let result = null;
    for (let i = lines.length - 1; i >= 0 && !result; --i) {
      try { result = JSON.parse(lines[i]); } catch { /* streamed text */ }
    }
    return { code: r.status, out: r.stdout, err: r.stderr, result };
  };

  const ws1 = path.join(tmp, 'ws1');
  const traj = path.join(tmp, 'run1.traj.jsonl');
  const r1 = agent(ws1, 'Write a greeting to notes/hello.txt, read it back and tell me what it says.',
                   ['--trajectory', traj, '--max-steps', '6']);
  try {
    assert.equal(r1.code, 0, `agent exit ${r1.code}: ${r1.err}`);
    assert.equal(fs.readFileSync(path.join(ws1, 'notes/hello.txt'), 'utf8'), 'hi from fathom serve\n');
    assert.equal(r1.result?.status, 'final', r1.out);
    assert.equal(r1.result?.tool_calls, 2, r1.out);
    assert.ok(r1.out.includes('The file says: hi from fathom serve.'), r1.out);
    const events = fs.readFileSync(traj, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    assert.ok(JSON.stringify(events).includes('hi from fathom serve'), 'the read result is in the trajectory');
    console.log('ok   agent: write_file + read_file through fathom serve, final answer');
  } catch (e) {
    failures++;
    console.log(`FAIL agent scripted run: ${e.stack || e}`);
  }

  const r2 = agent(path.join(tmp, 'ws2'), 'List the files in the workspace, then say done.', ['--max-steps', '3']);
  try {
    assert.ok(r2.code === 0 || r2.code === 3, `agent exit ${r2.code}: ${r2.err}`);
    assert.ok(['final', 'step_limit'].includes(r2.result?.status), r2.out);
    console.log(`ok   agent: free-running random model ends cleanly (${r2.result.status})`);
  } catch (e) {
    failures++;
    console.log(`FAIL agent free run: ${e.stack || e}\nagent stdout (trajectory): ${r2.out}`);
  }
  let healthy = false;
  try {
    healthy = (await fetch(`${base}/health`)).status === 200;
  } catch (e) {
    console.log(`server unreachable: ${e.cause?.code || e}`);
  }
  if (!healthy) {
    failures++;
    console.log(`FAIL server unhealthy after the agent runs; server exit: ${JSON.stringify(serverExit)}`);
  }
} finally {
  server.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
