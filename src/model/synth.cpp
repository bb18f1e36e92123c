// Synthetic checkpoints: presets, the value generator and the HF / GGUF writers.
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/log.h"
#include "base/progress.h"
#include "base/rng.h"
#include "base/thread_pool.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/names.h"
#include "tensor/convert.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

constexpr int64_t kBand = kFp8BlockSize;  // rows generated at a time (one FP8 block row)

// ---- presets -------------------------------------------------------------------------------

ModelConfig tiny_preset() {
  ModelConfig c;
  c.architecture = "DeepseekV3ForCausalLM";
  c.model_type = "deepseek_v3";
  c.vocab_size = 0;  // follows the tokenizer
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.n_shared_experts = 1;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.first_k_dense_replace = 1;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 32;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.max_position_embeddings = 16384;
  c.rope_scaling = {true, 4.0, 4096, 32.0, 1.0, 1.0, 1.0};
  return c;
}

ModelConfig v2_lite_preset() {
  ModelConfig c;
  c.architecture = "DeepseekV2ForCausalLM";
  c.model_type = "deepseek_v2";
  c.vocab_size = 102400;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 27;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 16;
  c.n_shared_experts = 2;
  c.n_routed_experts = 64;
  c.num_experts_per_tok = 6;
  c.first_k_dense_replace = 1;
  c.q_lora_rank = 0;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGreedy;
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  c.max_position_embeddings = 163840;
  c.rope_scaling = {true, 40.0, 4096, 32.0, 1.0, 0.707, 0.707};
  return c;
}

ModelConfig v3_preset() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = 128;
  c.num_key_value_heads = 128;
  c.n_shared_experts = 1;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.first_k_dense_replace = 3;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.max_position_embeddings = 163840;
  c.rope_scaling = {true, 40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  return c;
}

// Shrinks the routed experts to n while keeping the routing rules satisfiable.
void shrink_experts(ModelConfig& c, int64_t n) {
  c.n_routed_experts = n;
  c.num_experts_per_tok = std::min(c.num_experts_per_tok, n);
  const int64_t min_group = c.topk_method == TopkMethod::kNoauxTc ? 2 : 1;
  int64_t g = std::min(c.n_group, n);
  while (g > 1 && (n % g != 0 || n / g < min_group)) --g;
  c.n_group = g;
  c.topk_group = std::min(c.topk_group, g);
  while (c.topk_group < g && c.topk_group * (n / g) < c.num_experts_per_tok) ++c.topk_group;
}

// ---- values --------------------------------------------------------------------------------

struct Stream {
  uint64_t id = 0;
  float offset = 0;
  float scale = 1;
};

Stream stream_for(const HfWeight& w) {
  std::string name = w.name;
  if (w.weight == LayerWeight::kMtpEmbed && w.layer >= 0) name = kHfEmbed;  // shared with the model
  if (w.weight == LayerWeight::kMtpHead && w.layer >= 0) name = kHfHead;
  Stream s;
  s.id = hash_name(name);
  switch (w.role) {
    case WeightRole::kNorm: s.offset = 1.0f; s.scale = 0.1f; break;
    case WeightRole::kBias: s.scale = 0.1f; break;
    case WeightRole::kEmbedding: s.scale = 1.0f; break;
    default: s.scale = static_cast<float>(std::sqrt(3.0 / static_cast<double>(w.shape.back())));
  }
  return s;
}

class Generator {
 public:
  Generator(uint64_t seed, bool fp8_twin, const SynthOptions& o)
      : seed_(seed), fp8_twin_(fp8_twin), source_(o.weight_rows ? &o.weight_rows : nullptr) {}

  // Values of rows [r0, r1) of HF weight w (row-major), as the checkpoint's underlying f32.
  void rows(const HfWeight& w, int64_t r0, int64_t r1, float* out) const {
    if (source_ != nullptr) {
      (*source_)(w, r0, r1, out);
      return;
    }
    const Stream s = stream_for(w);
    const int64_t cols = w.shape.size() > 1 ? w.shape[1] : w.shape[0];
    const int64_t rows_total = w.shape.size() > 1 ? w.shape[0] : 1;
    const bool twin = fp8_twin_ && w.role == WeightRole::kLinear;
    const int64_t b0 = twin ? r0 / kBand * kBand : r0;
    const int64_t b1 = twin ? std::min(rows_total, (r1 + kBand - 1) / kBand * kBand) : r1;
    std::vector<float> band;
    float* dst = out;
    if (twin && (b0 != r0 || b1 != r1)) {
      band.resize(static_cast<size_t>((b1 - b0) * cols));
      dst = band.data();
    }
    default_pool().parallel_for(b1 - b0, 8, [&](int64_t a, int64_t b, int) {
      for (int64_t r = a; r < b; ++r) {
        float* row = dst + r * cols;
        const uint64_t base = static_cast<uint64_t>((b0 + r) * cols);
        for (int64_t c = 0; c < cols; ++c) {
          row[c] = s.offset + s.scale * counter_uniform(seed_, s.id, base + static_cast<uint64_t>(c));
        }
      }
    });
    if (twin) {
      // Round trip through the FP8 checkpoint's quantisation, band by band.
      const int64_t n_rows = b1 - b0;
      std::vector<uint8_t> q(static_cast<size_t>(n_rows * cols));
      std::vector<float> sc(static_cast<size_t>(((n_rows + kBand - 1) / kBand) * ((cols + kBand - 1) / kBand)));
      quantize_fp8_blocks(dst, n_rows, cols, q.data(), sc.data());
      for (int64_t r = 0; r < n_rows; ++r) dequantize_fp8_block_row(q.data(), sc.data(), n_rows, cols, r, dst + r * cols);
      if (dst != out) std::copy(dst + (r0 - b0) * cols, dst + (r1 - b0) * cols, out);
    }
  }

 private:
  uint64_t seed_;
  bool fp8_twin_;
  const std::function<void(const HfWeight&, int64_t, int64_t, float*)>* source_;
};

// ---- dtypes per role -----------------------------------------------------------------------

DType hf_dtype(DType requested, WeightRole role) {
  if (requested == DType::kF32) return DType::kF32;
  if (role == WeightRole::kBias) return DType::kF32;
  if (requested == DType::kF8E4M3 && role == WeightRole::kLinear) return DType::kF8E4M3;
  return DType::kBF16;
}

DType gguf_dtype(DType requested, const GgufWeight& w) {
  if (requested == DType::kF32 || w.shape.size() == 1) return DType::kF32;
  if (w.weight == LayerWeight::kRouter && w.layer >= 0) return DType::kF32;  // llama.cpp keeps ffn_gate_inp f32
  if (requested == DType::kQ8_0 && w.shape.back() % kQ8_0Block != 0) return DType::kF16;
  return requested;
}

// ---- writers ---------------------------------------------------------------------------------

struct HfTensorPlan {
  HfWeight weight;
  DType dtype;
  uint64_t bytes;        // weight (+ scale tensor for fp8)
};

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape) {
  return {(shape[0] + kBand - 1) / kBand, (shape[1] + kBand - 1) / kBand};
}

Status write_hf_tensor(SafetensorsWriter& w, const Generator& gen, const HfTensorPlan& t, ProgressBar* bar) {
  const HfWeight& hw = t.weight;
  const int64_t rows = hw.shape.size() > 1 ? hw.shape[0] : 1;
  const int64_t cols = hw.shape.back();
  std::vector<float> vals(static_cast<size_t>(kBand * cols));
  std::vector<uint8_t> out(static_cast<size_t>(kBand * cols) * 4);
  std::vector<float> scales;
  for (int64_t r0 = 0; r0 < rows; r0 += kBand) {
    const int64_t r1 = std::min(rows, r0 + kBand);
    const int64_t n = (r1 - r0) * cols;
    gen.rows(hw, r0, r1, vals.data());
    if (t.dtype == DType::kF8E4M3) {
      const int64_t bc = (cols + kBand - 1) / kBand;
      const size_t at = scales.size();
      scales.resize(at + static_cast<size_t>(bc));
      quantize_fp8_blocks(vals.data(), r1 - r0, cols, out.data(), scales.data() + at);
    } else {
      TRY(from_f32(t.dtype, vals.data(), out.data(), n));
    }
    const uint64_t bytes = dtype_bytes(t.dtype, static_cast<uint64_t>(n));
    TRY(w.append(out.data(), bytes));
    if (bar) bar->add(bytes);
  }
  if (t.dtype == DType::kF8E4M3) {
    TRY(w.append(scales.data(), scales.size() * 4));
    if (bar) bar->add(scales.size() * 4);
  }
  return {};
}

Status write_hf(const SynthOptions& o, const ModelConfig& c, const std::string& tok_json, const std::string& tok_config,
                SynthResult& result) {
  namespace fs = std::filesystem;
  TRY(make_directories(o.out));
  const Generator gen(o.seed, o.fp8_dequantized, o);
  std::vector<HfTensorPlan> plan;
  uint64_t total = 0;
  for (const HfWeight& w : hf_weights(c, o.mtp)) {
    const DType dt = hf_dtype(o.dtype, w.role);
    uint64_t numel = 1;
    for (int64_t d : w.shape) numel *= static_cast<uint64_t>(d);
    uint64_t bytes = dtype_bytes(dt, numel);
    if (dt == DType::kF8E4M3) {
      const auto s = fp8_scale_shape(w.shape);
      bytes += static_cast<uint64_t>(s[0] * s[1]) * 4;
    }
    plan.push_back({w, dt, bytes});
    total += bytes;
  }
  const uint64_t free_bytes = TRY(free_disk_bytes(o.out));
  if (free_bytes < total + (uint64_t{64} << 20)) {
    return resource_exhausted("synth: {} needs {} but only {} are free", o.out, format_bytes(total), format_bytes(free_bytes));
  }
  // Assign tensors to shards of at most shard_bytes (a tensor larger than that gets its own).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (in_shard > 0 && in_shard + plan[i].bytes > o.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += plan[i].bytes;
  }
  std::unique_ptr<ProgressBar> bar;
  if (o.progress) bar = std::make_unique<ProgressBar>(ProgressOptions{"synth", total, ProgressUnit::kBytes});
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string fname = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s]) {
      const HfTensorPlan& t = plan[i];
      specs.push_back({t.weight.name, t.dtype, t.weight.shape});
      weight_map[t.weight.name] = fname;
      if (t.dtype == DType::kF8E4M3) {
        const std::string scale_name = t.weight.name + "_scale_inv";
        specs.push_back({scale_name, DType::kF32, fp8_scale_shape(t.weight.shape)});
        weight_map[scale_name] = fname;
      }
    }
    result.tensors += static_cast<int64_t>(specs.size());
    const std::string path = (fs::path(o.out) / fname).string();
    SafetensorsWriter w = TRY(SafetensorsWriter::create(path, specs, {{"format", "pt"}}));
    for (size_t i : shards[s]) TRY(write_hf_tensor(w, gen, plan[i], bar.get()));
    TRY(w.finish());
    result.files.push_back(path);
  }
  if (bar) bar->finish();
  TRY(write_safetensors_index(o.out, weight_map, total));
  TRY(write_file_atomic((fs::path(o.out) / "config.json").string(), hf_config_json(c).dump(2) + "\n"));
  TRY(write_file_atomic((fs::path(o.out) / "tokenizer.json").string(), tok_json));
  TRY(write_file_atomic((fs::path(o.out) / "tokenizer_config.json").string(), tok_config));
  result.bytes = total;
  return {};
}

// GGUF row r of tensor w as HF values: fills out[cols].
class GgufRows {
 public:
  GgufRows(const ModelConfig& c, const Generator& gen, const GgufWeight& w, bool with_mtp)
      : c_(c), gen_(gen), w_(w) {
    // The HF weight(s) this tensor is made of.
    for (const HfWeight& h : hf_weights(c, with_mtp)) {
      if (h.layer == w.layer && h.weight == w.weight && (w.layer >= 0 || h.name == hf_global_name())) {
        if (w.source == GgufSource::kExpertStack) {
          experts_.push_back(h);
        } else if (hf_.name.empty()) {
          hf_ = h;
        }
      }
    }
    if (w.source == GgufSource::kKvbK || w.source == GgufSource::kKvbV) {
      full_.resize(static_cast<size_t>(hf_.shape[0] * hf_.shape[1]));
      gen_.rows(hf_, 0, hf_.shape[0], full_.data());
    }
  }
  bool found() const { return !hf_.name.empty() || !experts_.empty(); }

  // Rows [r0, r1) of the tensor flattened to [rows, cols].
  void rows(int64_t r0, int64_t r1, float* out) const {
    const int64_t cols = w_.shape.back();
    switch (w_.source) {
      case GgufSource::kSame: gen_.rows(hf_, r0, r1, out); return;
      case GgufSource::kExpertStack: {
        const int64_t per = w_.shape[1];
        for (int64_t r = r0; r < r1;) {
          const int64_t e = r / per, er = r % per;
          const int64_t n = std::min(r1 - r, per - er);
          gen_.rows(experts_[static_cast<size_t>(e)], er, er + n, out + (r - r0) * cols);
          r += n;
        }
        return;
      }
      case GgufSource::kKvbK: {  // [heads, kv_lora, nope] <- kv_b[h*(nope+v) + n][ci]
        const int64_t nope = c_.qk_nope_head_dim, v = c_.v_head_dim, kvl = c_.kv_lora_rank;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t h = r / kvl, ci = r % kvl;
          for (int64_t n = 0; n < nope; ++n) out[(r - r0) * cols + n] = full_[static_cast<size_t>((h * (nope + v) + n) * kvl + ci)];
        }
        return;
      }
      case GgufSource::kKvbV: {  // [heads, v, kv_lora] <- kv_b[h*(nope+v) + nope + vi][:]
        const int64_t nope = c_.qk_nope_head_dim, v = c_.v_head_dim, kvl = c_.kv_lora_rank;
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t h = r / v, vi = r % v;
          const float* src = full_.data() + (h * (nope + v) + nope + vi) * kvl;
          std::copy(src, src + kvl, out + (r - r0) * cols);
        }
        return;
      }
    }
  }

 private:
  std::string hf_global_name() const {
    if (w_.role == WeightRole::kEmbedding) return kHfEmbed;
    if (w_.role == WeightRole::kHead) return kHfHead;
    return kHfNorm;
  }
  const ModelConfig& c_;
  const Generator& gen_;
  const GgufWeight& w_;
  HfWeight hf_;
  std::vector<HfWeight> experts_;
  std::vector<float> full_;
};

std::vector<std::pair<std::string, GgufValue>> gguf_tokenizer_metadata(const VocabData& v, int64_t vocab_size) {
  std::vector<std::string> tokens = v.tokens;
  std::vector<int32_t> types = v.token_types;
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < vocab_size; ++i) {
    tokens.push_back(fmt::format("[PAD{}]", i));
    types.push_back(static_cast<int32_t>(TokenType::kUnused));
  }
  std::vector<std::pair<std::string, GgufValue>> m;
  m.emplace_back("tokenizer.ggml.model", GgufValue::string(v.model));
  m.emplace_back("tokenizer.ggml.pre", GgufValue::string(v.pre));
  m.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  m.emplace_back("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  m.emplace_back("tokenizer.ggml.merges", GgufValue::string_array(v.merges));
  if (v.bos_id >= 0) m.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(v.bos_id)));
  if (v.eos_id >= 0) m.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos_id)));
  if (v.pad_id >= 0) m.emplace_back("tokenizer.ggml.padding_token_id", GgufValue::u32(static_cast<uint32_t>(v.pad_id)));
  m.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(v.add_bos));
  m.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::boolean(v.add_eos));
  if (!v.chat_template.empty()) m.emplace_back("tokenizer.chat_template", GgufValue::string(v.chat_template));
  return m;
}

uint32_t gguf_file_type(DType d) {
  switch (d) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ8_0: return 7;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

Status write_gguf(const SynthOptions& o, const ModelConfig& c, const Tokenizer& tok, SynthResult& result) {
  namespace fs = std::filesystem;
  const std::string parent = fs::path(o.out).parent_path().string();
  if (!parent.empty()) TRY(make_directories(parent));
  const Generator gen(o.seed, o.fp8_dequantized, o);
  const std::vector<GgufWeight> weights = gguf_weights(c, o.mtp, o.gguf_legacy_kvb);
  std::vector<TensorSpec> specs;
  std::vector<DType> dtypes;
  uint64_t total = 0;
  for (const GgufWeight& w : weights) {
    const DType dt = gguf_dtype(o.dtype, w);
    dtypes.push_back(dt);
    specs.push_back({w.name, dt, w.shape});
    uint64_t numel = 1;
    for (int64_t d : w.shape) numel *= static_cast<uint64_t>(d);
    total += dtype_bytes(dt, numel);
  }
  const uint64_t free_bytes = TRY(free_disk_bytes(parent.empty() ? "." : parent));
  if (free_bytes < total + (uint64_t{64} << 20)) {
    return resource_exhausted("synth: {} needs {} but only {} are free", o.out, format_bytes(total), format_bytes(free_bytes));
  }
  auto meta = gguf_model_metadata(c, fs::path(o.out).stem().string(), o.gguf_legacy_kvb);
  meta.emplace_back("general.file_type", GgufValue::u32(gguf_file_type(o.dtype)));
  const VocabData vocab = TRY(tok.vocab_data());
  if (!vocab.pre_llama_cpp) {
    log_warn(
        "{}: the tokenizer's pre-tokenizer '{}' is Fathom's own: Fathom reads this GGUF, but llama.cpp "
        "and other GGUF engines refuse it (llama.cpp: unknown pre-tokenizer type '{}'); use the Hugging "
        "Face export there",
        o.out, vocab.pre, vocab.pre);
  }
  for (auto& kv : gguf_tokenizer_metadata(vocab, c.vocab_size)) meta.push_back(std::move(kv));
  GgufWriter writer = TRY(GgufWriter::create(o.out, meta, specs));
  std::unique_ptr<ProgressBar> bar;
  if (o.progress) bar = std::make_unique<ProgressBar>(ProgressOptions{"synth", total, ProgressUnit::kBytes});
  for (size_t i = 0; i < weights.size(); ++i) {
    const GgufWeight& w = weights[i];
    GgufRows src(c, gen, w, o.mtp);
    if (!src.found()) return internal_error("synth: no Hugging Face weight behind GGUF tensor '{}'", w.name);
    const int64_t cols = w.shape.back();
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < w.shape.size(); ++d) rows *= w.shape[d];
    std::vector<float> vals(static_cast<size_t>(kBand * cols));
    std::vector<uint8_t> out(static_cast<size_t>(kBand * cols) * 4);
    for (int64_t r0 = 0; r0 < rows; r0 += kBand) {
      const int64_t r1 = std::min(rows, r0 + kBand);
      src.rows(r0, r1, vals.data());
      const int64_t n = (r1 - r0) * cols;
      TRY(from_f32(dtypes[i], vals.data(), out.data(), n));
      const uint64_t bytes = dtype_bytes(dtypes[i], static_cast<uint64_t>(n));
      TRY(writer.append(out.data(), bytes));
      if (bar) bar->add(bytes);
    }
  }
  TRY(writer.finish());
  if (bar) bar->finish();
  result.files.push_back(o.out);
  result.bytes = total;
  result.tensors = static_cast<int64_t>(weights.size());
  return {};
}

}  // namespace

Result<ModelConfig> preset_config(const std::string& preset) {
  if (preset == "tiny") return tiny_preset();
  if (preset == "v2-lite") return v2_lite_preset();
  if (preset == "v3") return v3_preset();
  return invalid_argument("unknown preset '{}' (tiny, v2-lite or v3)", preset);
}

Result<ModelConfig> synth_config(const SynthOptions& o, int64_t tokenizer_vocab_size) {
  ModelConfig c = o.config                ? *o.config
                  : o.config_path.empty() ? TRY(preset_config(o.preset))
                                          : TRY(load_hf_config(o.config_path));
  if (o.layers) {
    if (*o.layers < 1) return invalid_argument("--layers {} must be at least 1", *o.layers);
    c.num_hidden_layers = *o.layers;
    if (c.n_routed_experts > 0 && c.first_k_dense_replace >= c.num_hidden_layers && c.num_hidden_layers > 1) {
      c.first_k_dense_replace = c.num_hidden_layers - 1;  // keep at least one MoE layer
    }
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  }
  if (o.experts) {
    if (*o.experts < 1) return invalid_argument("--experts {} must be at least 1", *o.experts);
    if (c.n_routed_experts == 0) return invalid_argument("--experts: this model has no routed experts");
    shrink_experts(c, *o.experts);
  }
  if (o.vocab) {
    c.vocab_size = *o.vocab;
  } else if (c.vocab_size == 0) {
    c.vocab_size = (tokenizer_vocab_size + 63) / 64 * 64;
  }
  if (c.vocab_size < tokenizer_vocab_size) {
    return invalid_argument("vocabulary {} is smaller than the tokenizer's {} tokens", c.vocab_size, tokenizer_vocab_size);
  }
  c.num_nextn_predict_layers = o.mtp ? 1 : 0;
  c.fp8_weights = o.format == CheckpointFormat::kHf && o.dtype == DType::kF8E4M3;
  c.torch_dtype = o.dtype == DType::kF32 ? "float32" : "bfloat16";
  TRY(c.validate());
  return c;
}

Result<SynthResult> synthesize(const SynthOptions& o) {
  if (o.out.empty()) return invalid_argument("synth: --out is required");
  if (o.format == CheckpointFormat::kHf && o.dtype != DType::kF32 && o.dtype != DType::kBF16 &&
      o.dtype != DType::kF8E4M3) {
    return invalid_argument("synth: --dtype {} is not one of f32, bf16, fp8 for --format hf", dtype_name(o.dtype));
  }
  if (o.format == CheckpointFormat::kGguf && o.dtype != DType::kF32 && o.dtype != DType::kF16 &&
      o.dtype != DType::kBF16 && o.dtype != DType::kQ8_0) {
    return invalid_argument("synth: --dtype {} is not one of f32, f16, bf16, q8_0 for --format gguf", dtype_name(o.dtype));
  }
  if (o.fp8_dequantized && o.dtype == DType::kF8E4M3) {
    return invalid_argument("synth: --fp8-dequantized makes the twin of an fp8 checkpoint; choose bf16 or f32");
  }
  std::string tok_json, tok_config;
  if (o.tokenizer_path.empty()) {
    tok_json = builtin_tokenizer_json();
    tok_config = builtin_tokenizer_config_json();
  } else {
    namespace fs = std::filesystem;
    const fs::path p(o.tokenizer_path);
    const fs::path dir = is_directory(o.tokenizer_path) ? p : p.parent_path();
    tok_json = TRY(read_file(is_directory(o.tokenizer_path) ? (p / "tokenizer.json").string() : p.string()));
    const std::string cfg_path = (dir / "tokenizer_config.json").string();
    tok_config = path_exists(cfg_path) ? TRY(read_file(cfg_path)) : std::string("{}");
  }
  auto tok = TRY(Tokenizer::from_json(tok_json, tok_config));
  SynthResult result;
  result.config = TRY(synth_config(o, tok->vocab_size()));
  // The config's special ids follow the tokenizer.
  if (tok->bos_id() >= 0) result.config.bos_token_id = tok->bos_id();
  if (tok->eos_id() >= 0) result.config.eos_token_id = tok->eos_id();
  if (o.format == CheckpointFormat::kHf) {
    TRY(write_hf(o, result.config, tok_json, tok_config, result));
  } else {
    TRY(write_gguf(o, result.config, *tok, result));
  }
  return result;
}

}  // namespace fathom
