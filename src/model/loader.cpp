// Loads DeepSeek-V3/V2 weights from a Hugging Face directory or a GGUF file into ModelWeights:
// views in stored precision, checked against the tensor-name table; MLA matrices repacked once.
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "base/check.h"
#include "base/fs.h"
#include "base/log.h"
#include "base/progress.h"
#include "model/names.h"
#include "model/weights.h"
#include "tensor/convert.h"

namespace fathom {
namespace {

// One way to look tensors up by name, whatever the file format.
struct TensorSource {
  const SafetensorsCheckpoint* hf = nullptr;
  const GgufFile* gguf = nullptr;

  bool has(const std::string& name) const {
    return hf ? hf->find(name) != nullptr : gguf->find(name) != nullptr;
  }
  Result<Tensor> get(const std::string& name) const {
    if (hf) {
      const auto* t = hf->find(name);
      if (t == nullptr) return not_found("checkpoint has no tensor '{}'", name);
      return hf->view(*t);
    }
    const auto* t = gguf->find(name);
    if (t == nullptr) return not_found("{}: no tensor '{}'", gguf->path(), name);
    return gguf->view(*t);
  }
};

std::string dtype_label(DType d) { return std::string(dtype_name(d)); }

Status check_shape(const std::string& name, const Tensor& t, const std::vector<int64_t>& want, const char* why) {
  if (t.shape_vector() != want) {
    return invalid_argument("tensor '{}' has shape {}, expected {} ({})", name, t.shape_string(), shape_string(want), why);
  }
  return {};
}

Result<VectorView> get_vector(const TensorSource& src, const std::string& name, int64_t n, const char* why) {
  Tensor t = TRY(src.get(name));
  TRY(check_shape(name, t, {n}, why));
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return unimplemented("tensor '{}' is {}; norms must be f32, bf16 or f16", name, dtype_label(t.dtype));
  }
  return VectorView{t.dtype, n, t.data};
}

class Loader {
 public:
  Loader(ModelWeights& m, const TensorSource& src) : m_(m), src_(src), c_(m.config) {}

  Result<WeightView> linear(const std::string& name, int64_t rows, int64_t cols, const char* why) {
    Tensor t = TRY(src_.get(name));
    TRY(check_shape(name, t, {rows, cols}, why));
    return as_weight(name, t, rows, cols);
  }

  // A 3-D stack [n, rows, cols] viewed as n matrices.
  Result<std::vector<WeightView>> stack(const std::string& name, int64_t n, int64_t rows, int64_t cols, const char* why) {
    Tensor t = TRY(src_.get(name));
    TRY(check_shape(name, t, {n, rows, cols}, why));
    std::vector<WeightView> out;
    for (int64_t e = 0; e < n; ++e) {
      Tensor s = t.slice0(e, e + 1).reshape({rows, cols});
      out.push_back(TRY(as_weight(name, s, rows, cols)));
    }
    return out;
  }

  Result<WeightView> as_weight(const std::string& name, const Tensor& t, int64_t rows, int64_t cols) {
    WeightView w{t.dtype, rows, cols, t.data, nullptr};
    if (t.dtype == DType::kF8E4M3) {
      const std::string sname = name + "_scale_inv";
      if (!src_.has(sname)) return not_found("FP8 tensor '{}' has no '{}'", name, sname);
      Tensor s = TRY(src_.get(sname));
      const std::vector<int64_t> want = {(rows + 127) / 128, (cols + 127) / 128};
      TRY(check_shape(sname, s, want, "one scale per 128x128 block"));
      if (s.dtype == DType::kF32) {
        w.scale_inv = s.ptr<float>();
      } else if (s.dtype == DType::kBF16 || s.dtype == DType::kF16) {
        Buffer b = Buffer::allocate(static_cast<size_t>(want[0] * want[1]) * 4);
        TRY(to_f32(s.dtype, s.data, b.as<float>(), want[0] * want[1]));
        w.scale_inv = b.as<float>();
        m_.repacked_bytes += b.size();
        m_.repacked.push_back(std::move(b));
      } else {
        return unimplemented("'{}' is {}; weight_scale_inv must be f32", sname, dtype_label(s.dtype));
      }
    }
    Status st = validate_weight(w, name);
    if (!st.ok()) return st;
    return w;
  }

  // A fresh owned matrix [rows, cols] of dtype `dt`, returned as a view.
  WeightView own(DType dt, int64_t rows, int64_t cols, Buffer** out) {
    Buffer b = Buffer::allocate(dtype_bytes(dt, static_cast<uint64_t>(rows * cols)));
    m_.repacked_bytes += b.size();
    m_.repacked.push_back(std::move(b));
    *out = &m_.repacked.back();
    return WeightView{dt, rows, cols, (*out)->data(), nullptr};
  }

  // Repack dtype for MLA matrices built from `src`: keep bf16/f32, widen f16/q8_0 to f32
  // exactly, fp8 to bf16 (bf16(e4m3 * scale), the values of the dequantised BF16 twin).
  static DType repack_dtype(DType src) {
    return (src == DType::kBF16 || src == DType::kF8E4M3) ? DType::kBF16 : DType::kF32;
  }

  // Writes one f32 row into an owned matrix of dtype dt.
  static void store_row(const WeightView& dst, int64_t r, const float* row) {
    const uint64_t rb = dtype_bytes(dst.dtype, static_cast<uint64_t>(dst.cols));
    uint8_t* p = static_cast<uint8_t*>(const_cast<void*>(dst.data)) + static_cast<uint64_t>(r) * rb;
    CHECK_OK(from_f32(dst.dtype, row, p, dst.cols));
  }

  // From kv_b [heads * (nope + v), kv_lora] (HF, GGUF legacy): w_k, w_v, w_uk_t.
  Status repack_kv_b(LayerWeights& L, const WeightView& kv_b) {
    const int64_t H = c_.num_attention_heads, nope = c_.qk_nope_head_dim, v = c_.v_head_dim, kvl = c_.kv_lora_rank;
    const DType dt = repack_dtype(kv_b.dtype);
    Buffer* b = nullptr;
    L.w_k = own(dt, H * nope, kvl, &b);
    L.w_v = own(dt, H * v, kvl, &b);
    L.w_uk_t = own(dt, H * kvl, nope, &b);
    std::vector<float> row(static_cast<size_t>(kvl));
    std::vector<float> kt(static_cast<size_t>(kvl * nope));  // one head's W_UK, transposed
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t n = 0; n < nope; ++n) {
        dequantize_weight_row(kv_b, h * (nope + v) + n, row.data());
        store_row(L.w_k, h * nope + n, row.data());
        for (int64_t c = 0; c < kvl; ++c) kt[static_cast<size_t>(c * nope + n)] = row[static_cast<size_t>(c)];
      }
      for (int64_t c = 0; c < kvl; ++c) store_row(L.w_uk_t, h * kvl + c, kt.data() + c * nope);
      for (int64_t i = 0; i < v; ++i) {
        dequantize_weight_row(kv_b, h * (nope + v) + nope + i, row.data());
        store_row(L.w_v, h * v + i, row.data());
      }
    }
    return {};
  }

  // From GGUF attn_k_b [heads, kv_lora, nope] and attn_v_b [heads, v, kv_lora].
  Status from_kb_vb(LayerWeights& L, const WeightView& kb, const WeightView& vb) {
    const int64_t H = c_.num_attention_heads, nope = c_.qk_nope_head_dim, kvl = c_.kv_lora_rank;
    L.w_uk_t = kb;
    L.w_v = vb;
    Buffer* b = nullptr;
    L.w_k = own(repack_dtype(kb.dtype), H * nope, kvl, &b);
    std::vector<float> rows(static_cast<size_t>(kvl * nope)), out(static_cast<size_t>(kvl));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < kvl; ++c) dequantize_weight_row(kb, h * kvl + c, rows.data() + c * nope);
      for (int64_t n = 0; n < nope; ++n) {
        for (int64_t c = 0; c < kvl; ++c) out[static_cast<size_t>(c)] = rows[static_cast<size_t>(c * nope + n)];
        store_row(L.w_k, h * nope + n, out.data());
      }
    }
    return {};
  }

 private:
  ModelWeights& m_;
  const TensorSource& src_;
  const ModelConfig& c_;
};

std::string layer_name(bool gguf, int64_t layer, LayerWeight w, int64_t expert = -1) {
  return gguf ? gguf_name(layer, w) : hf_name(layer, w, expert);
}

// Expert parallelism places experts contiguously, as DeepEP and ep::Placement do: rank r holds
// experts [r * E / ep_size, (r + 1) * E / ep_size).
bool holds_expert(const LoadOptions& o, int64_t n_experts, int64_t e) {
  return e / (n_experts / o.ep_size) == o.ep_rank;
}

Status load_layer(Loader& ld, const TensorSource& src, const ModelWeights& m, int64_t l, const LoadOptions& o,
                  LayerWeights& L) {
  const ModelConfig& c = m.config;
  const bool gguf = m.format == "gguf";
  const int64_t h = c.hidden_size, H = c.num_attention_heads;
  auto name = [&](LayerWeight w) { return layer_name(gguf, l, w); };
  auto lin = [&](LayerWeight w, const char* why) -> Result<WeightView> {
    const auto shape = weight_shape(c, w);
    return ld.linear(name(w), shape[0], shape[1], why);
  };
  const bool mtp = l >= c.num_hidden_layers;
  L.moe = mtp ? c.n_routed_experts > 0 : c.is_moe_layer(l);
  L.attn_norm = TRY(get_vector(src, name(LayerWeight::kAttnNorm), h, "hidden_size"));
  L.ffn_norm = TRY(get_vector(src, name(LayerWeight::kFfnNorm), h, "hidden_size"));
  if (c.q_lora_rank > 0) {
    L.q_a = TRY(lin(LayerWeight::kQA, "q_lora_rank x hidden_size"));
    L.q_a_norm = TRY(get_vector(src, name(LayerWeight::kQANorm), c.q_lora_rank, "q_lora_rank"));
    L.q_b = TRY(lin(LayerWeight::kQB, "heads * (qk_nope + qk_rope) x q_lora_rank"));
  } else {
    L.q = TRY(lin(LayerWeight::kQ, "heads * (qk_nope + qk_rope) x hidden_size"));
  }
  L.kv_a = TRY(lin(LayerWeight::kKvA, "kv_lora_rank + qk_rope_head_dim x hidden_size"));
  L.kv_a_norm = TRY(get_vector(src, name(LayerWeight::kKvANorm), c.kv_lora_rank, "kv_lora_rank"));
  L.o = TRY(lin(LayerWeight::kO, "hidden_size x heads * v_head_dim"));
  const std::string kb_name = fmt::format("blk.{}.attn_k_b.weight", l);
  if (gguf && src.has(kb_name)) {
    auto kb = TRY(ld.stack(kb_name, H, c.kv_lora_rank, c.qk_nope_head_dim, "heads x kv_lora_rank x qk_nope_head_dim"));
    auto vb = TRY(ld.stack(fmt::format("blk.{}.attn_v_b.weight", l), H, c.v_head_dim, c.kv_lora_rank,
                           "heads x v_head_dim x kv_lora_rank"));
    WeightView kbw = kb[0], vbw = vb[0];
    kbw.rows = H * c.kv_lora_rank;
    vbw.rows = H * c.v_head_dim;
    TRY(ld.from_kb_vb(L, kbw, vbw));
  } else {
    const WeightView kv_b = TRY(lin(LayerWeight::kKvB, "heads * (qk_nope + v_head_dim) x kv_lora_rank"));
    TRY(ld.repack_kv_b(L, kv_b));
  }
  if (!L.moe) {
    L.mlp_gate = TRY(lin(LayerWeight::kMlpGate, "intermediate_size x hidden_size"));
    L.mlp_up = TRY(lin(LayerWeight::kMlpUp, "intermediate_size x hidden_size"));
    L.mlp_down = TRY(lin(LayerWeight::kMlpDown, "hidden_size x intermediate_size"));
  } else {
    L.router = TRY(lin(LayerWeight::kRouter, "n_routed_experts x hidden_size"));
    if (c.topk_method == TopkMethod::kNoauxTc) {
      const VectorView b = TRY(get_vector(src, name(LayerWeight::kRouterBias), c.n_routed_experts, "n_routed_experts"));
      L.router_bias.resize(static_cast<size_t>(b.n));
      TRY(to_f32(b.dtype, b.data, L.router_bias.data(), b.n));
    }
    if (c.n_shared_experts > 0) {
      L.sh_gate = TRY(lin(LayerWeight::kShGate, "n_shared_experts * moe_intermediate_size x hidden_size"));
      L.sh_up = TRY(lin(LayerWeight::kShUp, "n_shared_experts * moe_intermediate_size x hidden_size"));
      L.sh_down = TRY(lin(LayerWeight::kShDown, "hidden_size x n_shared_experts * moe_intermediate_size"));
    }
    const int64_t E = c.n_routed_experts, inter = c.moe_intermediate_size;
    L.experts.resize(static_cast<size_t>(E));
    if (gguf) {
      auto g = TRY(ld.stack(name(LayerWeight::kExpGate), E, inter, h, "experts x moe_intermediate_size x hidden_size"));
      auto u = TRY(ld.stack(name(LayerWeight::kExpUp), E, inter, h, "experts x moe_intermediate_size x hidden_size"));
      auto d = TRY(ld.stack(name(LayerWeight::kExpDown), E, h, inter, "experts x hidden_size x moe_intermediate_size"));
      for (int64_t e = 0; e < E; ++e) {
        if (!holds_expert(o, E, e)) continue;
        L.experts[static_cast<size_t>(e)] = {g[static_cast<size_t>(e)], u[static_cast<size_t>(e)], d[static_cast<size_t>(e)]};
      }
    } else {
      for (int64_t e = 0; e < E; ++e) {
        if (!holds_expert(o, E, e)) continue;
        auto& ex = L.experts[static_cast<size_t>(e)];
        ex.gate = TRY(ld.linear(hf_name(l, LayerWeight::kExpGate, e), inter, h, "moe_intermediate_size x hidden_size"));
        ex.up = TRY(ld.linear(hf_name(l, LayerWeight::kExpUp, e), inter, h, "moe_intermediate_size x hidden_size"));
        ex.down = TRY(ld.linear(hf_name(l, LayerWeight::kExpDown, e), h, inter, "hidden_size x moe_intermediate_size"));
      }
    }
  }
  if (mtp) {
    L.enorm = TRY(get_vector(src, name(LayerWeight::kEnorm), h, "hidden_size"));
    L.hnorm = TRY(get_vector(src, name(LayerWeight::kHnorm), h, "hidden_size"));
    L.eh_proj = TRY(lin(LayerWeight::kEhProj, "hidden_size x 2 * hidden_size"));
    L.head_norm = TRY(get_vector(src, name(LayerWeight::kMtpHeadNorm), h, "hidden_size"));
  }
  return {};
}

// SHA-256 over every tensor's name, dtype, shape and first 256 bytes: identifies the weights
// (different seeds, fine-tunes, quantisations differ there) without reading the whole file.
std::string digest_weights(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (const auto& [name, t] : tensors) {
    const std::string head = fmt::format("{}|{}|{}|", name, dtype_name(t.dtype), t.shape_string());
    EVP_DigestUpdate(ctx, head.data(), head.size());
    EVP_DigestUpdate(ctx, t.data, std::min<uint64_t>(256, t.nbytes()));
  }
  unsigned char md[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

Status load_all(ModelWeights& m, const TensorSource& src, const LoadOptions& o) {
  const ModelConfig& c = m.config;
  const bool gguf = m.format == "gguf";
  Loader ld(m, src);
  const std::string embed = gguf ? kGgufEmbed : kHfEmbed;
  m.embed = TRY(ld.linear(embed, c.vocab_size, c.hidden_size, "vocab_size x hidden_size"));
  m.final_norm = TRY(get_vector(src, gguf ? kGgufNorm : kHfNorm, c.hidden_size, "hidden_size"));
  const std::string head = gguf ? kGgufHead : kHfHead;
  if (c.tie_word_embeddings || (gguf && !src.has(head))) {
    m.head = m.embed;
  } else {
    m.head = TRY(ld.linear(head, c.vocab_size, c.hidden_size, "vocab_size x hidden_size"));
  }
  int64_t n_layers = c.num_hidden_layers;
  if (o.load_mtp && c.num_nextn_predict_layers > 0) {
    if (src.has(layer_name(gguf, c.num_hidden_layers, LayerWeight::kEhProj))) {
      m.n_mtp_layers = c.num_nextn_predict_layers;
      n_layers += m.n_mtp_layers;
    } else {
      log_info("config has {} MTP layer(s) but the checkpoint carries none: speculative decoding off",
               c.num_nextn_predict_layers);
    }
  }
  m.layers.resize(static_cast<size_t>(n_layers));
  std::unique_ptr<ProgressBar> bar;
  if (o.progress) bar = std::make_unique<ProgressBar>(ProgressOptions{"load", static_cast<uint64_t>(n_layers)});
  for (int64_t l = 0; l < n_layers; ++l) {
    Status st = load_layer(ld, src, m, l, o, m.layers[static_cast<size_t>(l)]);
    if (!st.ok()) return st.with_context(fmt::format("{}: layer {}", m.path, l));
    if (bar) bar->add(1);
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> load_weights(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  if (!path_exists(path)) return not_found("model '{}' does not exist", path);
  if (options.ep_size < 1 || options.ep_rank < 0 || options.ep_rank >= options.ep_size) {
    return invalid_argument("expert-parallel rank {} of {} is invalid", options.ep_rank, options.ep_size);
  }
  auto m = std::make_unique<ModelWeights>();
  m->path = path;
  TensorSource src;
  std::vector<std::pair<std::string, Tensor>> all;
  if (is_directory(path)) {
    m->format = "hf";
    const std::string cfg = (fs::path(path) / "config.json").string();
    if (!path_exists(cfg)) return not_found("'{}' has no config.json: not a Hugging Face model directory", path);
    m->config = TRY(load_hf_config(cfg));
    m->hf = TRY(SafetensorsCheckpoint::open(path));
    src.hf = m->hf.get();
    for (const auto& t : m->hf->tensors()) all.emplace_back(t.entry->name, m->hf->view(t));
    m->checkpoint_bytes = m->hf->total_bytes();
  } else {
    const std::string head = TRY(read_file_prefix(path, 4));
    if (head != "GGUF") {
      return invalid_argument("'{}' is neither a Hugging Face model directory nor a GGUF file", path);
    }
    m->format = "gguf";
    m->gguf = TRY(GgufFile::open(path));
    m->config = TRY(model_config_from_gguf(*m->gguf));
    src.gguf = m->gguf.get();
    for (const auto& t : m->gguf->tensors()) {
      all.emplace_back(t.name, m->gguf->view(t));
      m->checkpoint_bytes += t.size;
    }
  }
  if (options.ep_size > 1) {
    const ModelConfig& c = m->config;
    if (c.n_routed_experts < 1) {
      return invalid_argument("{}: expert parallelism (--ep {}) needs a MoE model; this one has no routed experts",
                              path, options.ep_size);
    }
    if (c.n_routed_experts % options.ep_size != 0) {
      return invalid_argument("{}: --ep {} does not divide n_routed_experts {} (each rank must hold as many experts)",
                              path, options.ep_size, c.n_routed_experts);
    }
  }
  TRY(load_all(*m, src, options));
  m->weights_digest = digest_weights(all);
  return m;
}

}  // namespace fathom
