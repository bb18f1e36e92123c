// `fathom synth`: write a random-weight checkpoint of any DeepSeek shape (see model/synth.h).
#include <nlohmann/json.hpp>

#include <cstdio>

#include "base/progress.h"
#include "base/strings.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/command.h"
#include "model/synth.h"

namespace fathom::cli {
namespace {

int run_synth(int argc, char** argv) {
  SynthOptions o;
  std::string dtype = "bf16", format = "hf", shard = "4G", flavour = "mla";
  std::optional<int64_t> seed;
  bool json_out = false;
  Args args(argv[0],
            "Write a random-weight DeepSeek checkpoint in the exact real layouts (Hugging Face safetensors or "
            "GGUF),\nso tests and benchmarks run without downloads. One seed gives the same weights in every "
            "dtype and format.");
  args.usage("--preset tiny|v2-lite|v3 [--config config.json] --dtype DTYPE --format hf|gguf --out PATH [options]");
  args.option("--preset", &o.preset, "tiny (V3-style, float64-testable), v2-lite or v3 (real shapes)", "NAME");
  args.option("--config", &o.config_path, "take the shape from this config.json instead of a preset", "FILE");
  args.option("--layers", &o.layers, "override num_hidden_layers (per-layer shapes stay real)");
  args.option("--experts", &o.experts, "override n_routed_experts (routing groups adjusted to fit)");
  args.option("--vocab", &o.vocab, "override vocab_size (>= the tokenizer's size)");
  args.option("--dtype", &dtype, "hf: f32|bf16|fp8; gguf: f32|f16|bf16|q8_0", "DTYPE");
  args.option("--format", &format, "hf (config.json + sharded safetensors) or gguf", "FORMAT");
  args.option("--out", &o.out, "output directory (hf) or .gguf file (gguf)", "PATH");
  args.option("--seed", &seed, "weights seed [0]");
  args.flag("--mtp", &o.mtp, "include the multi-token-prediction module (num_nextn_predict_layers = 1)");
  args.option("--tokenizer", &o.tokenizer_path, "tokenizer.json (or its directory) to ship; default: built-in", "PATH");
  args.option("--shard-size", &shard, "largest safetensors shard", "SIZE");
  args.flag("--fp8-dequantized", &o.fp8_dequantized, "bf16/f32 twin of the fp8 checkpoint of the same seed");
  args.option("--gguf-flavour", &flavour, "mla (attn_k_b/attn_v_b, current llama.cpp) or legacy (attn_kv_b)", "NAME");
  args.flag("--json", &json_out, "print one JSON object describing what was written");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (seed) o.seed = static_cast<uint64_t>(*seed);
  auto dt = parse_dtype(dtype);
  if (!dt.ok()) return fail(args.command(), dt.status());
  o.dtype = *dt;
  if (format == "hf") {
    o.format = CheckpointFormat::kHf;
  } else if (format == "gguf") {
    o.format = CheckpointFormat::kGguf;
  } else {
    return fail(args.command(), invalid_argument("--format '{}' is not hf or gguf", format));
  }
  if (flavour != "mla" && flavour != "legacy") {
    return fail(args.command(), invalid_argument("--gguf-flavour '{}' is not mla or legacy", flavour));
  }
  o.gguf_legacy_kvb = flavour == "legacy";
  auto shard_bytes = parse_size(shard, "--shard-size");
  if (!shard_bytes.ok()) return fail(args.command(), shard_bytes.status());
  o.shard_bytes = *shard_bytes;
  Timer timer;
  auto r = synthesize(o);
  if (!r.ok()) return fail(args.command(), r.status());
  const ParamCounts p = r->config.param_counts();
  if (json_out) {
    nlohmann::json j = {{"out", o.out},         {"format", format},      {"dtype", dtype},
                        {"files", r->files},    {"bytes", r->bytes},     {"tensors", r->tensors},
                        {"params_total", p.total}, {"params_active", p.active}, {"params_mtp", p.mtp},
                        {"seconds", timer.elapsed_s()}};
    print_json_line(j.dump());
  } else {
    std::printf("wrote %s: %lld tensors, %s in %zu file(s), %.3fB parameters (%.3fB active), %.1f s\n", o.out.c_str(),
                static_cast<long long>(r->tensors), format_bytes(r->bytes).c_str(), r->files.size(),
                static_cast<double>(p.total) / 1e9, static_cast<double>(p.active) / 1e9, timer.elapsed_s());
  }
  return 0;
}

}  // namespace

FATHOM_COMMAND("synth", "Write a random-weight checkpoint (HF safetensors or GGUF) of any DeepSeek shape", run_synth);

}  // namespace fathom::cli
