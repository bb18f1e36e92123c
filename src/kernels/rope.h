// Rotary position embedding with YaRN, as DeepSeek's inference/model.py (precompute_freqs_cis,
// apply_rotary_emb) defines it:
//  - pairs are interleaved: (x[2i], x[2i+1]) is rotated by angle pos * inv_freq[i];
//  - inv_freq[i] = theta^(-2i/dim); with YaRN (factor > 1) the frequencies are blended,
//    inv_freq = inv_freq / factor * (1 - smooth) + inv_freq * smooth, where smooth = 1 - ramp and
//    ramp rises linearly from 0 at `low` to 1 at `high` (clamped), over pair index i, with
//    low = max(floor(corr_dim(beta_fast)), 0), high = min(ceil(corr_dim(beta_slow)), dim - 1),
//    corr_dim(r) = dim * ln(original_max_positions / (r * 2 pi)) / (2 ln theta), and high bumped
//    by 0.001 when low == high;
//  - the attention softmax scale is multiplied by yarn_mscale(factor, mscale_all_dim)^2 (the
//    caller does that; RoPE itself is not scaled, as in model.py);
//  - HF's modeling also scales cos/sin by yarn_mscale(factor, mscale) / yarn_mscale(factor,
//    mscale_all_dim), which is 1 for every DeepSeek config (mscale == mscale_all_dim); it is applied
//    here too so any config follows HF.
// Deliberate difference: model.py applies YaRN only when its max_seq_len exceeds
// original_seq_len (true with its default 16384); we apply it whenever factor > 1, as HF does, so
// a short serving context does not change the model's frequencies.
// Angles are computed in float64 (model.py uses float32 angles; ours are more accurate at long
// positions) and the table stores float32 cos/sin.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace fathom {

struct RopeParams {
  int64_t dim = 64;        // rotary dims per head (qk_rope_head_dim), even
  double theta = 10000.0;  // rope_theta
  // YaRN (rope_scaling {"type": "yarn"}); factor <= 1 means plain RoPE.
  double factor = 1.0;
  int64_t original_max_positions = 4096;  // original_max_position_embeddings
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

// 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1 (model.py / HF yarn_get_mscale).
double yarn_mscale(double factor, double mscale);

// The (blended) inverse frequencies, dim/2 of them, in float64.
std::vector<double> rope_inv_freq(const RopeParams& p);
// HF's cos/sin factor yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim).
double rope_cos_sin_scale(const RopeParams& p);

// cos/sin for positions [0, max_positions): sized once (max_positions * dim * 4 bytes).
class RopeTable {
 public:
  // Errors name the bad field: odd or non-positive dim, theta <= 1, factor with beta_fast <=
  // beta_slow, non-positive original_max_positions, max_positions < 1.
  static Result<RopeTable> create(const RopeParams& p, int64_t max_positions);

  int64_t dim() const { return dim_; }
  int64_t max_positions() const { return max_positions_; }
  // [dim/2] cos and sin at `pos` (already multiplied by the HF cos/sin mscale, normally 1).
  const float* cos_at(int64_t pos) const { return cos_.data() + pos * (dim_ / 2); }
  const float* sin_at(int64_t pos) const { return sin_.data() + pos * (dim_ / 2); }

 private:
  int64_t dim_ = 0;
  int64_t max_positions_ = 0;
  std::vector<float> cos_, sin_;
};

struct RopeApplyParams {
  int64_t n_tokens = 1;
  int64_t n_heads = 1;
  int64_t token_stride = 0;  // elements between tokens
  int64_t head_stride = 0;   // elements between heads of one token
  bool inverse = false;      // rotate by -angle (the backward pass)
};

// Rotates, in place, the `dim` values at x + t * token_stride + h * head_stride for every token t
// and head h, by positions[t]. positions must lie in [0, table.max_positions()) (CHECKed; callers
// validate against their context limit first).
//   q:    [T, H, nope + rope] -> x = q + nope, head_stride = nope + rope, token_stride = H * (nope + rope)
//   k_pe: [T, kv_lora + rope] -> x = kv + kv_lora, n_heads = 1, token_stride = kv_lora + rope
void rope_apply(const RopeTable& table, const RopeApplyParams& p, const int64_t* positions, float* x);

// Float64 reference computed directly from the formula (no table). out: [n_tokens, n_heads, dim].
void rope_apply_ref(const RopeParams& rp, const RopeApplyParams& p, const int64_t* positions, const float* x,
                    double* out);

}  // namespace fathom
