// Internal: a loaded model's weights, in their stored precision (views into the mapped
// checkpoint) plus the few tensors repacked once at load for the two MLA forms. Only model/
// includes this; the public contract is model.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "tensor/tensor.h"

namespace fathom {

// A 1-D weight (RMSNorm scale, routing bias) as stored: f32, bf16 or f16.
struct VectorView {
  DType dtype = DType::kF32;
  int64_t n = 0;
  const void* data = nullptr;
};

struct LayerWeights {
  bool moe = false;
  VectorView attn_norm, q_a_norm, kv_a_norm, ffn_norm;
  WeightView q_a, q_b, q;  // q_a/q_b with q LoRA, q without (V2-Lite)
  WeightView kv_a;         // [kv_lora + rope, hidden]
  WeightView o;            // [hidden, heads * v]
  // MLA in the layouts the two forms read (repacked at load where the checkpoint differs):
  WeightView w_k;     // [heads * nope, kv_lora]   naive: K_nope = latent . w_k^T
  WeightView w_v;     // [heads * v, kv_lora]      naive V, and absorbed W_UV (rows of head h)
  WeightView w_uk_t;  // [heads * kv_lora, nope]   absorbed: q_lat[h] = w_uk_t[h] . q_nope[h]
  // Dense MLP.
  WeightView mlp_gate, mlp_up, mlp_down;
  // DeepSeekMoE.
  WeightView router;            // [n_routed, hidden]
  std::vector<float> router_bias;  // e_score_correction_bias (noaux_tc), else empty
  std::vector<ExpertWeights> experts;
  WeightView sh_gate, sh_up, sh_down;  // shared experts merged: [n_shared * inter, hidden]
  // MTP layers only.
  VectorView enorm, hnorm, head_norm;
  WeightView eh_proj;  // [hidden, 2 * hidden]
};

struct ModelWeights {
  ModelConfig config;
  std::string path;
  std::string format;  // "hf" or "gguf"
  WeightView embed;    // [vocab, hidden], rows looked up
  VectorView final_norm;
  WeightView head;     // [vocab, hidden]
  std::vector<LayerWeights> layers;  // num_hidden_layers, then the MTP layers
  int64_t n_mtp_layers = 0;
  std::string weights_digest;        // SHA-256 hex of names, dtypes, shapes and each tensor's first bytes
  uint64_t checkpoint_bytes = 0;
  uint64_t repacked_bytes = 0;

  // Owners of what the views point into.
  std::unique_ptr<SafetensorsCheckpoint> hf;
  std::unique_ptr<GgufFile> gguf;
  std::vector<Buffer> repacked;
};

struct LoadOptions {
  bool load_mtp = true;
  bool progress = true;
  // Expert parallelism: hold only routed experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size)
  // (contiguous, as ep::Placement); the others' views stay null. ep_size must divide E.
  int ep_rank = 0;
  int ep_size = 1;
};

// Opens an HF directory (config.json + safetensors) or a GGUF file and resolves every weight,
// checking names, shapes and dtypes; errors name the tensor and what was expected.
Result<std::unique_ptr<ModelWeights>> load_weights(const std::string& path, const LoadOptions& options);

}  // namespace fathom
