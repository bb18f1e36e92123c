// `fathom synth`: random-weight checkpoints of any DeepSeek shape, in the exact layouts real
// checkpoints use, so tests and benchmarks run without downloads.
//
// - Presets: "tiny" (V3-style, small enough for float64 references), "v2-lite" and "v3" (the
//   real shapes; --layers/--experts/--vocab shrink them keeping every per-layer shape real), or
//   a config.json.
// - Formats: Hugging Face (config.json, sharded safetensors + index, tokenizer.json,
//   tokenizer_config.json) in f32 / bf16 / fp8 (e4m3 + weight_scale_inv per 128x128 block on the
//   projections DeepSeek quantises, everything else as DeepSeek stores it), or GGUF (llama.cpp's
//   deepseek2 keys and tensor names, MLA flavour or legacy attn_kv_b, tokenizer embedded) in
//   f32 / f16 / bf16 / q8_0.
// - Weights: element i of a weight is a pure function of (seed, the weight's Hugging Face name,
//   i), so one seed gives the same underlying values in every dtype and format (twins compare).
//   Scales keep activations finite through every layer: projections ~ U(-a, a) with
//   a = sqrt(3 / fan_in), norms 1 + U(-0.1, 0.1), routing bias U(-0.1, 0.1), embeddings U(-1, 1).
// - Streams to disk in row bands: memory stays bounded (a V2-Lite FP8 checkpoint, ~16 GB, is
//   written with a few MB of buffers) and free disk space is checked first.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "formats/model_config.h"
#include "model/names.h"
#include "tensor/dtype.h"

namespace fathom {

enum class CheckpointFormat { kHf, kGguf };

struct SynthOptions {
  std::string preset = "tiny";  // tiny | v2-lite | v3 (ignored when config_path is set)
  std::string config_path;      // a config.json to take the shape from
  std::optional<int64_t> layers, experts, vocab;
  DType dtype = DType::kBF16;
  CheckpointFormat format = CheckpointFormat::kHf;
  std::string out;               // directory (hf) or .gguf file (gguf)
  uint64_t seed = 0;
  bool mtp = false;              // write the MTP module (num_nextn_predict_layers = 1)
  std::string tokenizer_path;    // tokenizer.json or a directory holding it; default: built-in
  uint64_t shard_bytes = uint64_t{4} << 30;
  // bf16/f32 output whose projection values are those of the FP8 checkpoint of the same seed,
  // dequantised (the "dequantised BF16 twin" of an FP8 checkpoint).
  bool fp8_dequantized = false;
  bool gguf_legacy_kvb = false;  // GGUF with attn_kv_b (older converters) instead of attn_k_b/v_b
  bool progress = true;
  // For exporters (`fathom export`): the model's config (instead of preset / config_path; the
  // overrides above still apply) and the values of every weight instead of the seeded random
  // ones: fills rows [r0, r1) of Hugging Face weight w (row-major f32).
  std::optional<ModelConfig> config;
  std::function<void(const HfWeight& w, int64_t r0, int64_t r1, float* out)> weight_rows;
};

struct SynthResult {
  ModelConfig config;
  std::vector<std::string> files;
  uint64_t bytes = 0;
  int64_t tensors = 0;
};

// The config a synth run would write (preset/config + overrides + tokenizer vocabulary).
Result<ModelConfig> synth_config(const SynthOptions& options, int64_t tokenizer_vocab_size);
Result<ModelConfig> preset_config(const std::string& preset);
Result<SynthResult> synthesize(const SynthOptions& options);

}  // namespace fathom
