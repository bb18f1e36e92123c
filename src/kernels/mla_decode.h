// MLA decode attention over a paged latent cache: Fathom's CPU counterpart of FlashMLA's
// flash_mla_with_kvcache. The query is already absorbed (W_UK folded in), so every head attends
// to the same cached latent: K = the whole token [d_latent | d_rope], V = its first d_latent values.
//
//   q             [batch, s_q, heads, d_latent + d_rope]  f32 (rounded to bf16 on the BF16 path)
//   cache         one layer: pages of page_tokens tokens (mla_kv_format.h), bf16 or fp8
//   block_table   [batch, max_pages] int32: page ids of each sequence, in order
//   cache_seqlens [batch] int32: tokens of each sequence in the cache (the new ones included)
//   out           [batch, s_q, heads, d_latent] f32
//   lse           [batch, heads, s_q] f32: natural-log sum of exp(softmax_scale * q.k)
//
// causal (s_q > 1, speculative verification): query i sees keys [0, seqlen - s_q + i], aligned
// to the end as in FlashMLA. A row that sees no key (seqlen 0) gets out 0 and lse +inf.
//
// How it runs: all s_q*heads rows of a sequence are one matrix, so each cache page is read once
// per call; QK^T and PV are register-tiled GEMMs (vdpbf16ps on AVX-512 BF16, f32 FMAs on AVX-512F
// and AVX2, a scalar reference), softmax is online in f32. Work is split across the pool by
// (sequence, page range) so threads get equal page counts whatever the lengths; partial results
// of a split sequence are merged by log-sum-exp. The path follows simd_level() at each call.
//
// Thread safety: one MlaDecoder runs one call at a time (it owns the scratch); create one per
// thread that decodes. The cache must not change during a call.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/mla_kv_format.h"

namespace fathom {

// One layer's pool of pages: page id p starts at data + p * page_stride_bytes.
struct MlaCacheView {
  const uint8_t* data = nullptr;
  int64_t n_pages = 0;
  int64_t page_stride_bytes = 0;  // >= format.page_bytes()
  MlaKvFormat format;
};

struct MlaDecodeParams {
  const float* q = nullptr;  // [batch, s_q, heads, d_qk]
  int64_t batch = 0;
  int s_q = 1;
  int heads = 0;
  int d_qk = 0;  // must equal cache.format.d_qk()
  MlaCacheView cache;
  const int32_t* block_table = nullptr;    // [batch, max_pages]
  int64_t max_pages = 0;                   // row stride of block_table
  const int32_t* cache_seqlens = nullptr;  // [batch]
  float softmax_scale = 0;  // 1/sqrt(qk_nope + qk_rope) * mscale^2 for DeepSeek (not 1/sqrt(576))
  bool causal = false;
  float* out = nullptr;  // [batch, s_q, heads, d_latent]
  float* lse = nullptr;  // [batch, heads, s_q]
};

// Checks shapes, pointers and every block-table entry a sequence uses against the pool; the
// error names the sequence, page and bound. Run once per call by MlaDecoder::decode.
Status validate_mla_decode(const MlaDecodeParams& params);

struct MlaDecoderOptions {
  MlaKvFormat format;          // of the caches this decoder reads
  int64_t max_batch = 256;     // sequences per call
  int max_rows = 128;          // s_q * heads per sequence
  ThreadPool* pool = nullptr;  // default_pool() when null
  int parts_per_thread = 2;    // work parts per pool thread (finer parts absorb a slow thread)
};

class MlaDecoder {
 public:
  // Sizes every scratch buffer once from the options.
  static Result<std::unique_ptr<MlaDecoder>> create(const MlaDecoderOptions& options);
  ~MlaDecoder();
  MlaDecoder(const MlaDecoder&) = delete;
  MlaDecoder& operator=(const MlaDecoder&) = delete;

  // Validates, schedules and runs one call; writes out and lse for every sequence.
  Status decode(const MlaDecodeParams& params);

  const MlaDecoderOptions& options() const { return options_; }

 private:
  struct State;
  explicit MlaDecoder(const MlaDecoderOptions& options, std::unique_ptr<State> state);
  MlaDecoderOptions options_;
  std::unique_ptr<State> state_;
};

// Whether MlaDecoder runs both GEMMs on AMX tiles for caches of `format` in this process now
// (AVX-512 BF16 level, amx_bf16_usable(), d_qk and d_latent multiples of 32, pages of a multiple
// of 32 tokens); otherwise on the vector unit. Benchmarks pick the matching peak with it.
bool mla_decode_uses_amx(const MlaKvFormat& format);

// The scalar reference: the same algorithm (paged online softmax in f32), one thread, no SIMD.
// For tests; MlaDecoder uses it too when simd_level() is scalar.
Status mla_decode_reference(const MlaDecodeParams& params);

}  // namespace fathom
