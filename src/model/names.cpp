// DeepSeek-V3 tensor names and shapes, Hugging Face and GGUF (llama.cpp deepseek2).
#include "model/names.h"

#include <fmt/format.h>

#include "base/check.h"

namespace fathom {
namespace {

const char* hf_suffix(LayerWeight w) {
  switch (w) {
    case LayerWeight::kAttnNorm: return "input_layernorm.weight";
    case LayerWeight::kQA: return "self_attn.q_a_proj.weight";
    case LayerWeight::kQANorm: return "self_attn.q_a_layernorm.weight";
    case LayerWeight::kQB: return "self_attn.q_b_proj.weight";
    case LayerWeight::kQ: return "self_attn.q_proj.weight";
    case LayerWeight::kKvA: return "self_attn.kv_a_proj_with_mqa.weight";
    case LayerWeight::kKvANorm: return "self_attn.kv_a_layernorm.weight";
    case LayerWeight::kKvB: return "self_attn.kv_b_proj.weight";
    case LayerWeight::kO: return "self_attn.o_proj.weight";
    case LayerWeight::kFfnNorm: return "post_attention_layernorm.weight";
    case LayerWeight::kMlpGate: return "mlp.gate_proj.weight";
    case LayerWeight::kMlpUp: return "mlp.up_proj.weight";
    case LayerWeight::kMlpDown: return "mlp.down_proj.weight";
    case LayerWeight::kRouter: return "mlp.gate.weight";
    case LayerWeight::kRouterBias: return "mlp.gate.e_score_correction_bias";
    case LayerWeight::kShGate: return "mlp.shared_experts.gate_proj.weight";
    case LayerWeight::kShUp: return "mlp.shared_experts.up_proj.weight";
    case LayerWeight::kShDown: return "mlp.shared_experts.down_proj.weight";
    case LayerWeight::kExpGate: return "gate_proj.weight";
    case LayerWeight::kExpUp: return "up_proj.weight";
    case LayerWeight::kExpDown: return "down_proj.weight";
    case LayerWeight::kEnorm: return "enorm.weight";
    case LayerWeight::kHnorm: return "hnorm.weight";
    case LayerWeight::kEhProj: return "eh_proj.weight";
    case LayerWeight::kMtpEmbed: return "embed_tokens.weight";
    case LayerWeight::kMtpHeadNorm: return "shared_head.norm.weight";
    case LayerWeight::kMtpHead: return "shared_head.head.weight";
  }
  return "?";
}

const char* gguf_suffix(LayerWeight w) {
  switch (w) {
    case LayerWeight::kAttnNorm: return "attn_norm.weight";
    case LayerWeight::kQA: return "attn_q_a.weight";
    case LayerWeight::kQANorm: return "attn_q_a_norm.weight";
    case LayerWeight::kQB: return "attn_q_b.weight";
    case LayerWeight::kQ: return "attn_q.weight";
    case LayerWeight::kKvA: return "attn_kv_a_mqa.weight";
    case LayerWeight::kKvANorm: return "attn_kv_a_norm.weight";
    case LayerWeight::kKvB: return "attn_kv_b.weight";
    case LayerWeight::kO: return "attn_output.weight";
    case LayerWeight::kFfnNorm: return "ffn_norm.weight";
    case LayerWeight::kMlpGate: return "ffn_gate.weight";
    case LayerWeight::kMlpUp: return "ffn_up.weight";
    case LayerWeight::kMlpDown: return "ffn_down.weight";
    case LayerWeight::kRouter: return "ffn_gate_inp.weight";
    case LayerWeight::kRouterBias: return "exp_probs_b.bias";
    case LayerWeight::kShGate: return "ffn_gate_shexp.weight";
    case LayerWeight::kShUp: return "ffn_up_shexp.weight";
    case LayerWeight::kShDown: return "ffn_down_shexp.weight";
    case LayerWeight::kExpGate: return "ffn_gate_exps.weight";
    case LayerWeight::kExpUp: return "ffn_up_exps.weight";
    case LayerWeight::kExpDown: return "ffn_down_exps.weight";
    case LayerWeight::kEnorm: return "nextn.enorm.weight";
    case LayerWeight::kHnorm: return "nextn.hnorm.weight";
    case LayerWeight::kEhProj: return "nextn.eh_proj.weight";
    case LayerWeight::kMtpEmbed: return "nextn.embed_tokens.weight";
    case LayerWeight::kMtpHeadNorm: return "nextn.shared_head_norm.weight";
    case LayerWeight::kMtpHead: return "nextn.shared_head_head.weight";
  }
  return "?";
}

WeightRole role_of(LayerWeight w) {
  switch (w) {
    case LayerWeight::kAttnNorm: case LayerWeight::kQANorm: case LayerWeight::kKvANorm: case LayerWeight::kFfnNorm:
    case LayerWeight::kEnorm: case LayerWeight::kHnorm: case LayerWeight::kMtpHeadNorm:
      return WeightRole::kNorm;
    case LayerWeight::kRouterBias: return WeightRole::kBias;
    case LayerWeight::kRouter: case LayerWeight::kEhProj: return WeightRole::kLinearBf16;
    case LayerWeight::kMtpEmbed: return WeightRole::kEmbedding;
    case LayerWeight::kMtpHead: return WeightRole::kHead;
    default: return WeightRole::kLinear;
  }
}

constexpr LayerWeight kLayerOrder[] = {
    LayerWeight::kEnorm,   LayerWeight::kHnorm,    LayerWeight::kEhProj,   LayerWeight::kMtpEmbed,
    LayerWeight::kAttnNorm, LayerWeight::kQA,      LayerWeight::kQANorm,   LayerWeight::kQB,
    LayerWeight::kQ,       LayerWeight::kKvA,      LayerWeight::kKvANorm,  LayerWeight::kKvB,
    LayerWeight::kO,       LayerWeight::kFfnNorm,  LayerWeight::kMlpGate,  LayerWeight::kMlpUp,
    LayerWeight::kMlpDown, LayerWeight::kRouter,   LayerWeight::kRouterBias, LayerWeight::kShGate,
    LayerWeight::kShUp,    LayerWeight::kShDown,   LayerWeight::kExpGate,  LayerWeight::kExpUp,
    LayerWeight::kExpDown, LayerWeight::kMtpHeadNorm, LayerWeight::kMtpHead,
};

bool is_expert(LayerWeight w) {
  return w == LayerWeight::kExpGate || w == LayerWeight::kExpUp || w == LayerWeight::kExpDown;
}

}  // namespace

std::string hf_name(int64_t layer, LayerWeight w, int64_t expert) {
  if (is_expert(w)) {
    CHECK(expert >= 0);
    return fmt::format("model.layers.{}.mlp.experts.{}.{}", layer, expert, hf_suffix(w));
  }
  return fmt::format("model.layers.{}.{}", layer, hf_suffix(w));
}

std::string gguf_name(int64_t layer, LayerWeight w) { return fmt::format("blk.{}.{}", layer, gguf_suffix(w)); }

std::vector<int64_t> weight_shape(const ModelConfig& c, LayerWeight w) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  const int64_t shared = c.n_shared_experts * c.moe_intermediate_size;
  switch (w) {
    case LayerWeight::kAttnNorm: case LayerWeight::kFfnNorm: case LayerWeight::kEnorm: case LayerWeight::kHnorm:
    case LayerWeight::kMtpHeadNorm:
      return {h};
    case LayerWeight::kQA: return {c.q_lora_rank, h};
    case LayerWeight::kQANorm: return {c.q_lora_rank};
    case LayerWeight::kQB: return {heads * c.qk_head_dim(), c.q_lora_rank};
    case LayerWeight::kQ: return {heads * c.qk_head_dim(), h};
    case LayerWeight::kKvA: return {c.kv_lora_rank + c.qk_rope_head_dim, h};
    case LayerWeight::kKvANorm: return {c.kv_lora_rank};
    case LayerWeight::kKvB: return {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank};
    case LayerWeight::kO: return {h, heads * c.v_head_dim};
    case LayerWeight::kMlpGate: case LayerWeight::kMlpUp: return {c.intermediate_size, h};
    case LayerWeight::kMlpDown: return {h, c.intermediate_size};
    case LayerWeight::kRouter: return {c.n_routed_experts, h};
    case LayerWeight::kRouterBias: return {c.n_routed_experts};
    case LayerWeight::kShGate: case LayerWeight::kShUp: return {shared, h};
    case LayerWeight::kShDown: return {h, shared};
    case LayerWeight::kExpGate: case LayerWeight::kExpUp: return {c.moe_intermediate_size, h};
    case LayerWeight::kExpDown: return {h, c.moe_intermediate_size};
    case LayerWeight::kEhProj: return {h, 2 * h};
    case LayerWeight::kMtpEmbed: case LayerWeight::kMtpHead: return {c.vocab_size, h};
  }
  return {};
}

bool layer_has_weight(const ModelConfig& c, int64_t layer, LayerWeight w) {
  const bool mtp = layer >= c.num_hidden_layers;
  const bool moe = mtp ? c.n_routed_experts > 0 : c.is_moe_layer(layer);
  switch (w) {
    case LayerWeight::kQA: case LayerWeight::kQANorm: case LayerWeight::kQB: return c.q_lora_rank > 0;
    case LayerWeight::kQ: return c.q_lora_rank == 0;
    case LayerWeight::kMlpGate: case LayerWeight::kMlpUp: case LayerWeight::kMlpDown: return !moe;
    case LayerWeight::kRouter: case LayerWeight::kExpGate: case LayerWeight::kExpUp: case LayerWeight::kExpDown:
      return moe;
    case LayerWeight::kRouterBias: return moe && c.topk_method == TopkMethod::kNoauxTc;
    case LayerWeight::kShGate: case LayerWeight::kShUp: case LayerWeight::kShDown: return moe && c.n_shared_experts > 0;
    case LayerWeight::kEnorm: case LayerWeight::kHnorm: case LayerWeight::kEhProj: case LayerWeight::kMtpEmbed:
    case LayerWeight::kMtpHeadNorm: case LayerWeight::kMtpHead:
      return mtp;
    default: return true;
  }
}

std::vector<HfWeight> hf_weights(const ModelConfig& c, bool with_mtp) {
  std::vector<HfWeight> out;
  out.push_back({kHfEmbed, {c.vocab_size, c.hidden_size}, WeightRole::kEmbedding});
  const int64_t n_layers = c.num_hidden_layers + (with_mtp ? c.num_nextn_predict_layers : 0);
  for (int64_t l = 0; l < n_layers; ++l) {
    for (LayerWeight w : kLayerOrder) {
      if (!layer_has_weight(c, l, w)) continue;
      if (is_expert(w)) continue;  // experts follow, expert by expert, as DeepSeek orders them
      out.push_back({hf_name(l, w), weight_shape(c, w), role_of(w), l, w});
      if (w == LayerWeight::kShDown && layer_has_weight(c, l, LayerWeight::kExpGate)) {
        for (int64_t e = 0; e < c.n_routed_experts; ++e) {
          for (LayerWeight ew : {LayerWeight::kExpGate, LayerWeight::kExpUp, LayerWeight::kExpDown}) {
            out.push_back({hf_name(l, ew, e), weight_shape(c, ew), WeightRole::kLinear, l, ew, e});
          }
        }
      }
    }
    // Without shared experts the routed ones come after the router.
    if (layer_has_weight(c, l, LayerWeight::kExpGate) && !layer_has_weight(c, l, LayerWeight::kShDown)) {
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        for (LayerWeight ew : {LayerWeight::kExpGate, LayerWeight::kExpUp, LayerWeight::kExpDown}) {
          out.push_back({hf_name(l, ew, e), weight_shape(c, ew), WeightRole::kLinear, l, ew, e});
        }
      }
    }
  }
  out.push_back({kHfNorm, {c.hidden_size}, WeightRole::kNorm});
  if (!c.tie_word_embeddings) out.push_back({kHfHead, {c.vocab_size, c.hidden_size}, WeightRole::kHead});
  return out;
}

std::vector<GgufWeight> gguf_weights(const ModelConfig& c, bool with_mtp, bool legacy_kvb) {
  std::vector<GgufWeight> out;
  out.push_back({kGgufEmbed, {c.vocab_size, c.hidden_size}, WeightRole::kEmbedding});
  out.push_back({kGgufNorm, {c.hidden_size}, WeightRole::kNorm});
  if (!c.tie_word_embeddings) out.push_back({kGgufHead, {c.vocab_size, c.hidden_size}, WeightRole::kHead});
  const int64_t n_layers = c.num_hidden_layers + (with_mtp ? c.num_nextn_predict_layers : 0);
  const int64_t heads = c.num_attention_heads;
  for (int64_t l = 0; l < n_layers; ++l) {
    for (LayerWeight w : kLayerOrder) {
      if (!layer_has_weight(c, l, w)) continue;
      if (w == LayerWeight::kKvB && !legacy_kvb) {
        out.push_back({fmt::format("blk.{}.attn_k_b.weight", l), {heads, c.kv_lora_rank, c.qk_nope_head_dim},
                       WeightRole::kLinear, GgufSource::kKvbK, l, w});
        out.push_back({fmt::format("blk.{}.attn_v_b.weight", l), {heads, c.v_head_dim, c.kv_lora_rank},
                       WeightRole::kLinear, GgufSource::kKvbV, l, w});
        continue;
      }
      std::vector<int64_t> shape = weight_shape(c, w);
      GgufSource src = GgufSource::kSame;
      if (is_expert(w)) {
        shape.insert(shape.begin(), c.n_routed_experts);
        src = GgufSource::kExpertStack;
      }
      out.push_back({gguf_name(l, w), shape, role_of(w), src, l, w});
    }
  }
  return out;
}

}  // namespace fathom
