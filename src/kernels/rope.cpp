// RoPE with YaRN: frequencies as DeepSeek's precompute_freqs_cis, a float32 cos/sin table built
// once, and the interleaved-pair rotation. The float64 reference is in rope_ref.cpp. See rope.h.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/check.h"

namespace fathom {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

namespace {

// model.py find_correction_dim: the pair index whose wavelength fits `rotations` times into the
// original context.
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

Status validate(const RopeParams& p) {
  if (p.dim <= 0 || p.dim % 2 != 0)
    return invalid_argument("rope: dim (qk_rope_head_dim) {} must be positive and even", p.dim);
  if (!(p.theta > 1.0) || !std::isfinite(p.theta))
    return invalid_argument("rope: rope_theta {} must be > 1", p.theta);
  if (!std::isfinite(p.factor))
    return invalid_argument("rope: rope_scaling.factor {} is not finite", p.factor);
  if (p.factor > 1.0) {
    if (p.original_max_positions <= 0) {
      return invalid_argument("rope: rope_scaling.original_max_position_embeddings {} must be positive",
                              p.original_max_positions);
    }
    if (!(p.beta_fast > p.beta_slow) || !(p.beta_slow > 0.0)) {
      return invalid_argument(
          "rope: rope_scaling needs beta_fast > beta_slow > 0 (got beta_fast {}, beta_slow {})", p.beta_fast,
          p.beta_slow);
    }
    if (!std::isfinite(p.mscale) || !std::isfinite(p.mscale_all_dim)) {
      return invalid_argument("rope: rope_scaling mscale {} / mscale_all_dim {} must be finite", p.mscale,
                              p.mscale_all_dim);
    }
  }
  return {};
}

}  // namespace

// HF's cos/sin attention factor (1 whenever mscale == mscale_all_dim, as in every DeepSeek config).
double rope_cos_sin_scale(const RopeParams& p) {
  return yarn_mscale(p.factor, p.mscale) / yarn_mscale(p.factor, p.mscale_all_dim);
}

std::vector<double> rope_inv_freq(const RopeParams& p) {
  const int64_t half = p.dim / 2;
  const double dim = static_cast<double>(p.dim);
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / dim);
  if (p.factor <= 1.0) return f;
  const double orig = static_cast<double>(p.original_max_positions);
  double low = std::max(std::floor(correction_dim(p.beta_fast, dim, p.theta, orig)), 0.0);
  double high = std::min(std::ceil(correction_dim(p.beta_slow, dim, p.theta, orig)), dim - 1.0);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double smooth = 1.0 - ramp;
    const double fi = f[static_cast<size_t>(i)];
    f[static_cast<size_t>(i)] = fi / p.factor * (1.0 - smooth) + fi * smooth;
  }
  return f;
}

Result<RopeTable> RopeTable::create(const RopeParams& p, int64_t max_positions) {
  TRY(validate(p));
  if (max_positions < 1) return invalid_argument("rope: max_positions {} must be at least 1", max_positions);
  const int64_t half = p.dim / 2;
  if (max_positions > (int64_t{1} << 34) / std::max<int64_t>(half, 1)) {
    return out_of_range("rope: a table for {} positions x {} dims is too large", max_positions, p.dim);
  }
  RopeTable t;
  t.dim_ = p.dim;
  t.max_positions_ = max_positions;
  t.cos_.resize(static_cast<size_t>(max_positions * half));
  t.sin_.resize(static_cast<size_t>(max_positions * half));
  const std::vector<double> f = rope_inv_freq(p);
  const double scale = rope_cos_sin_scale(p);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * f[static_cast<size_t>(i)];
      t.cos_[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::cos(a) * scale);
      t.sin_[static_cast<size_t>(pos * half + i)] = static_cast<float>(std::sin(a) * scale);
    }
  }
  return t;
}

namespace {

// (x[2i], x[2i+1]) <- (x[2i] c - x[2i+1] s, x[2i] s + x[2i+1] c) for i < half.
void rotate_pairs(float* x, const float* c, const float* s, int64_t half, float sign) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    const float si = sign * s[i];
    x[2 * i] = a * c[i] - b * si;
    x[2 * i + 1] = a * si + b * c[i];
  }
}

}  // namespace

void rope_apply(const RopeTable& table, const RopeApplyParams& p, const int64_t* positions, float* x) {
  const int64_t half = table.dim() / 2;
  const float sign = p.inverse ? -1.0f : 1.0f;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t pos = positions[t];
    CHECK_MSG(pos >= 0 && pos < table.max_positions(), "rope: position {} outside the table's [0, {})", pos,
              table.max_positions());
    const float* c = table.cos_at(pos);
    const float* s = table.sin_at(pos);
    for (int64_t h = 0; h < p.n_heads; ++h)
      rotate_pairs(x + t * p.token_stride + h * p.head_stride, c, s, half, sign);
  }
}

}  // namespace fathom
