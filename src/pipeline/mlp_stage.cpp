// MlpStage: the first StageModule, a stack of pre-norm SwiGLU blocks with RMSNorm and hand-written
// forward / input-gradient / weight-gradient passes, plus the synthetic data source. Per block,
// for the n tokens of a micro-batch:
//   xhat = x / rms(x),  a = xhat * gamma,  g = a Wg,  u = a Wu,  h = silu(g) * u,  y = x + h Wd
// with Wg, Wu: [hidden, ffn] and Wd: [ffn, hidden]. The input-gradient pass keeps dy, dg, du and
// da in the slot so the weight-gradient pass needs no recomputation.
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/rng.h"
#include "pipeline/mlp_kernels.h"
#include "pipeline/trainer.h"

namespace fathom::pipeline {

Status check_mlp_config(const MlpConfig& c) {
  auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  if (!in(c.tokens, 1, 1 << 16))
    return invalid_argument("model: tokens per micro-batch must be in [1, 65536], got {}", c.tokens);
  if (!in(c.hidden, 1, 1 << 14))
    return invalid_argument("model: hidden size must be in [1, 16384], got {}", c.hidden);
  if (!in(c.ffn, 1, 1 << 16)) return invalid_argument("model: ffn size must be in [1, 65536], got {}", c.ffn);
  if (!in(c.blocks_per_stage, 1, 1024)) {
    return invalid_argument("model: blocks per stage must be in [1, 1024], got {}", c.blocks_per_stage);
  }
  if (c.tokens * (4 * c.hidden + 3 * c.ffn) > (int64_t(1) << 28)) {
    return invalid_argument(
        "model: a micro-batch's saved activations ({} tokens x (4 x {} + 3 x {})) exceed 2^28 "
        "values per block",
        c.tokens, c.hidden, c.ffn);
  }
  return {};
}

namespace {

constexpr double kRmsEps = 1e-6;

template <typename T>
T silu(T g) {
  return g / (T(1) + std::exp(-g));
}
// d silu / d g = s (1 + g (1 - s)), s = sigmoid(g)
template <typename T>
T silu_grad(T g) {
  const T s = T(1) / (T(1) + std::exp(-g));
  return s * (T(1) + g * (T(1) - s));
}

template <typename T>
class MlpStage final : public StageModule<T> {
 public:
  MlpStage(const MlpConfig& c, int stage) : c_(c), n_(c.tokens), h_(c.hidden), f_(c.ffn) {
    block_params_ = h_ + 2 * h_ * f_ + f_ * h_;
    params_.resize(size_t(block_params_ * c.blocks_per_stage));
    grads_.assign(params_.size(), T(0));
    init_weights(stage);
    work_.resize(size_t(n_ * h_));
    tmp_.resize(size_t(n_ * f_));
    da2_.resize(size_t(n_ * h_));
  }

  int64_t input_elems() const override { return n_ * h_; }
  int64_t output_elems() const override { return n_ * h_; }

  Status reserve(int n_slots) override {
    if (!slots_.empty()) return failed_precondition("MlpStage::reserve called twice");
    per_block_ = 4 * n_ * h_ + 3 * n_ * f_ + n_;
    slots_.resize(size_t(n_slots));
    for (auto& s : slots_) s.resize(size_t(per_block_ * c_.blocks_per_stage));
    return {};
  }

  void forward(int slot, const T* input, T* output) override;
  void backward_input(int slot, const T* output_grad, T* input_grad) override;
  void backward_weight(int slot) override;
  std::span<T> parameters() override { return params_; }
  std::span<T> gradients() override { return grads_; }

 private:
  // Views of one block's parameters (or gradients) and saved activations.
  struct Weights {
    T *gamma, *wg, *wu, *wd;
  };
  struct Saved {
    T *xhat, *rms, *a, *g, *u, *h, *dy, *da;  // g, u hold dg, du after the input-gradient pass
  };
  Weights weights(std::vector<T>& slab, int b) {
    T* p = slab.data() + b * block_params_;
    return {p, p + h_, p + h_ + h_ * f_, p + h_ + 2 * h_ * f_};
  }
  Saved saved(int slot, int b) {
    CHECK(slot >= 0 && size_t(slot) < slots_.size());
    T* p = slots_[size_t(slot)].data() + b * per_block_;
    const int64_t nh = n_ * h_, nf = n_ * f_;
    return {p,
            p + nh,
            p + nh + n_,
            p + 2 * nh + n_,
            p + 2 * nh + n_ + nf,
            p + 2 * nh + n_ + 2 * nf,
            p + 2 * nh + n_ + 3 * nf,
            p + 3 * nh + n_ + 3 * nf};
  }
  void init_weights(int stage);
  void block_forward(const Weights& w, const Saved& s, T* x);
  void block_backward_input(const Weights& w, const Saved& s, T* dy);

  const MlpConfig c_;
  const int64_t n_, h_, f_;
  int64_t block_params_ = 0, per_block_ = 0;
  std::vector<T> params_, grads_;
  std::vector<std::vector<T>> slots_;
  std::vector<T> work_, tmp_, da2_;  // scratch: [n, h], [n, f], [n, h]
};

template <typename T>
void MlpStage<T>::init_weights(int stage) {
  for (int b = 0; b < c_.blocks_per_stage; ++b) {
    const Weights w = weights(params_, b);
    const uint64_t stream = hash_name("mlp") ^ (uint64_t(stage) << 32) ^ (uint64_t(b) << 8);
    auto fill = [&](T* p, int64_t count, double scale, double offset, uint64_t tensor) {
      for (int64_t i = 0; i < count; ++i) {
        p[i] = static_cast<T>(offset + scale * counter_uniform(c_.seed, stream + tensor, uint64_t(i)));
      }
    };
    fill(w.gamma, h_, 0.1, 1.0, 0);
    fill(w.wg, h_ * f_, 1.0 / std::sqrt(double(h_)), 0, 1);
    fill(w.wu, h_ * f_, 1.0 / std::sqrt(double(h_)), 0, 2);
    fill(w.wd, f_ * h_, 1.0 / std::sqrt(double(f_)), 0, 3);
  }
}

// x: [n, h] in place: the block input becomes its output.
template <typename T>
void MlpStage<T>::block_forward(const Weights& w, const Saved& s, T* x) {
  for (int64_t t = 0; t < n_; ++t) {
    const T* xt = x + t * h_;
    double ss = 0;
    for (int64_t j = 0; j < h_; ++j) ss += double(xt[j]) * double(xt[j]);
    const T rms = static_cast<T>(std::sqrt(ss / double(h_) + kRmsEps));
    s.rms[t] = rms;
    for (int64_t j = 0; j < h_; ++j) {
      s.xhat[t * h_ + j] = xt[j] / rms;
      s.a[t * h_ + j] = s.xhat[t * h_ + j] * w.gamma[j];
    }
  }
  gemm_nn(n_, h_, f_, s.a, w.wg, s.g, false);  // g: [n, f]
  gemm_nn(n_, h_, f_, s.a, w.wu, s.u, false);  // u: [n, f]
  for (int64_t i = 0; i < n_ * f_; ++i) s.h[i] = silu(s.g[i]) * s.u[i];
  gemm_nn(n_, f_, h_, s.h, w.wd, x, true);  // x += h Wd
}

// dy: [n, h] in place: the block's output gradient becomes its input gradient.
template <typename T>
void MlpStage<T>::block_backward_input(const Weights& w, const Saved& s, T* dy) {
  std::memcpy(s.dy, dy, sizeof(T) * size_t(n_ * h_));
  T* dh = tmp_.data();
  gemm_nt(n_, h_, f_, dy, w.wd, dh, false);  // dh = dy Wd^T: [n, f]
  for (int64_t i = 0; i < n_ * f_; ++i) {
    const T g = s.g[i], u = s.u[i];
    s.u[i] = dh[i] * silu(g);           // du
    s.g[i] = dh[i] * u * silu_grad(g);  // dg
  }
  gemm_nt(n_, f_, h_, s.g, w.wg, s.da, false);  // da = dg Wg^T + du Wu^T: [n, h]
  gemm_nt(n_, f_, h_, s.u, w.wu, da2_.data(), false);
  for (int64_t i = 0; i < n_ * h_; ++i) s.da[i] += da2_[size_t(i)];
  for (int64_t t = 0; t < n_; ++t) {  // through the RMSNorm; the residual adds dy itself
    const T* xh = s.xhat + t * h_;
    const T* da = s.da + t * h_;
    T dot = 0;
    for (int64_t j = 0; j < h_; ++j) dot += da[j] * w.gamma[j] * xh[j];
    const T mean = dot / static_cast<T>(h_);
    for (int64_t j = 0; j < h_; ++j) dy[t * h_ + j] += (da[j] * w.gamma[j] - xh[j] * mean) / s.rms[t];
  }
}

template <typename T>
void MlpStage<T>::forward(int slot, const T* input, T* output) {
  if (output != input) std::memcpy(output, input, sizeof(T) * size_t(n_ * h_));
  for (int b = 0; b < c_.blocks_per_stage; ++b) block_forward(weights(params_, b), saved(slot, b), output);
}

template <typename T>
void MlpStage<T>::backward_input(int slot, const T* output_grad, T* input_grad) {
  T* dy = work_.data();
  std::memcpy(dy, output_grad, sizeof(T) * size_t(n_ * h_));
  for (int b = c_.blocks_per_stage - 1; b >= 0; --b)
    block_backward_input(weights(params_, b), saved(slot, b), dy);
  if (input_grad != nullptr) std::memcpy(input_grad, dy, sizeof(T) * size_t(n_ * h_));
}

template <typename T>
void MlpStage<T>::backward_weight(int slot) {
  for (int b = 0; b < c_.blocks_per_stage; ++b) {
    const Weights dw = weights(grads_, b);
    const Saved s = saved(slot, b);
    gemm_tn_acc(n_, f_, h_, s.h, s.dy, dw.wd);  // dWd += h^T dy
    gemm_tn_acc(n_, h_, f_, s.a, s.g, dw.wg);   // dWg += a^T dg
    gemm_tn_acc(n_, h_, f_, s.a, s.u, dw.wu);   // dWu += a^T du
    for (int64_t t = 0; t < n_; ++t) {
      for (int64_t j = 0; j < h_; ++j) dw.gamma[j] += s.da[t * h_ + j] * s.xhat[t * h_ + j];
    }
  }
}

template <typename T>
class SyntheticData final : public DataSource<T> {
 public:
  explicit SyntheticData(const MlpConfig& c) : c_(c), n_(c.tokens * c.hidden) {}

  void input(int64_t step, int mb, T* out) override {
    const uint64_t stream = splitmix64(hash_name("input") ^ (uint64_t(step) << 24) ^ uint64_t(mb));
    for (int64_t i = 0; i < n_; ++i) out[i] = static_cast<T>(counter_uniform(c_.seed, stream, uint64_t(i)));
  }

  double loss(int64_t step, int mb, const T* y, T* dy) override {
    const uint64_t stream = splitmix64(hash_name("target") ^ (uint64_t(step) << 24) ^ uint64_t(mb));
    double sum = 0;
    const T scale = T(1) / static_cast<T>(n_);
    for (int64_t i = 0; i < n_; ++i) {
      const T d = y[i] - static_cast<T>(0.5 * counter_uniform(c_.seed, stream, uint64_t(i)));
      sum += double(d) * double(d);
      dy[i] = d * scale;
    }
    return static_cast<double>(static_cast<T>(0.5 * sum / double(n_)));
  }

 private:
  const MlpConfig c_;
  const int64_t n_;
};

}  // namespace

template <typename T>
std::unique_ptr<StageModule<T>> make_mlp_stage(const MlpConfig& config, int stage) {
  return std::make_unique<MlpStage<T>>(config, stage);
}

template <typename T>
std::unique_ptr<DataSource<T>> make_synthetic_data(const MlpConfig& config) {
  return std::make_unique<SyntheticData<T>>(config);
}

template std::unique_ptr<StageModule<float>> make_mlp_stage<float>(const MlpConfig&, int);
template std::unique_ptr<StageModule<double>> make_mlp_stage<double>(const MlpConfig&, int);
template std::unique_ptr<DataSource<float>> make_synthetic_data<float>(const MlpConfig&);
template std::unique_ptr<DataSource<double>> make_synthetic_data<double>(const MlpConfig&);

}  // namespace fathom::pipeline
