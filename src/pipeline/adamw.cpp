// AdamW (decoupled weight decay, as torch.optim.AdamW) over one parameter slab. Elementwise and in
// a fixed order, so two copies given the same parameters and gradients stay bit-identical.
#include <cmath>

#include "base/check.h"
#include "pipeline/executor_impl.h"

namespace fathom::pipeline {

template <typename T>
void AdamW<T>::step(const AdamWParams& a, std::span<T> params, std::span<const T> grads) {
  CHECK(params.size() == m_.size() && grads.size() == m_.size());
  ++t_;
  const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
  const T c1 = static_cast<T>(1.0 / (1.0 - std::pow(a.beta1, static_cast<double>(t_))));
  const T c2 = static_cast<T>(1.0 / (1.0 - std::pow(a.beta2, static_cast<double>(t_))));
  const T lr = static_cast<T>(a.lr), eps = static_cast<T>(a.eps);
  const T decay = static_cast<T>(1.0 - a.lr * a.weight_decay);
  T* p = params.data();
  const T* g = grads.data();
  T* m = m_.data();
  T* v = v_.data();
  for (size_t i = 0; i < m_.size(); ++i) {
    m[i] = b1 * m[i] + (T(1) - b1) * g[i];
    v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
    p[i] = p[i] * decay - lr * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
  }
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace fathom::pipeline
