// Prefill attention for MLA's naive form: per-head K/V decompressed from the latent cache, one
// block of keys at a time, accumulated with an online softmax (FlashAttention-style tiling) so
// memory stays bounded by the key block whatever the context length. Causal: a query at absolute
// position p sees keys at positions <= p.
//
// Shapes (f32):
//   q      [n_q, heads, d_nope + d_rope]   RoPE applied; query i is at position q_pos0 + i
//   k_nope [n_k, heads * d_nope]           keys k0 .. k0 + n_k - 1 of this block
//   k_pe   [n_k] rows of d_rope (stride k_pe_stride), shared by all heads (MLA's single rope key)
//   v      [n_k, heads * d_v]
//   state  m, l [n_q, heads]; acc [n_q, heads, d_v] (init with attention_state_init)
// AVX-512 path (register-blocked QK and PV over 32 rows x 64 keys, attention_avx512.cpp) and a
// scalar path, chosen by simd_level(); both f32 with the exp of kernels/ops.h. Where the caller
// allows bf16 operands (bf16_operands: its weights are BF16 or FP8, so its activations
// are rounded at least that much already) and the CPU has AMX, both products run on the tiles
// (attention_amx_avx512bf16.cpp) with Q, K, V and P rounded to bf16 and fp32 accumulation.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace fathom {

struct PrefillAttentionParams {
  int64_t n_q = 0;
  int64_t q_pos0 = 0;
  int heads = 0, d_nope = 0, d_rope = 0, d_v = 0;
  const float* q = nullptr;
  int64_t k0 = 0, n_k = 0;
  const float* k_nope = nullptr;
  const float* k_pe = nullptr;
  int64_t k_pe_stride = 0;
  const float* v = nullptr;
  float scale = 1.0f;
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
  bool bf16_operands = false;  // Q, K, V and P may be rounded to bf16 (AMX tiles where available)
};

void attention_state_init(int64_t n_q, int heads, int d_v, float* m, float* l, float* acc);
// Folds one key block into the running state.
void prefill_attention_block(const PrefillAttentionParams& p, ThreadPool& pool);
// out[i, h * d_v + d] = acc / l (0 for a row that saw no key).
void attention_state_finish(int64_t n_q, int heads, int d_v, const float* l, const float* acc, float* out);

namespace internal {
// Rows [q_begin, q_end) of head h: the per-ISA inner loops.
void prefill_attention_rows_scalar(const PrefillAttentionParams& p, int h, int64_t q_begin, int64_t q_end);
void prefill_attention_rows_avx512(const PrefillAttentionParams& p, int h, int64_t q_begin, int64_t q_end);
// The AMX path over all heads and rows of a key block (needs amx_bf16_usable()).
bool prefill_attention_amx_ok(const PrefillAttentionParams& p);
void prefill_attention_amx(const PrefillAttentionParams& p, ThreadPool& pool);
}  // namespace internal

}  // namespace fathom
