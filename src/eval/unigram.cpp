// The unigram baseline: how many nats per token a model that ignores context entirely pays on
// val.bin when it predicts train.bin's token frequencies. A trained model's validation loss must be
// well below it. Add-one (Laplace) smoothing over the whole vocabulary keeps ids unseen in train
// finite; with ~10M training tokens and a few thousand ids its effect is ~1e-4 nats.
#include <cmath>

#include "eval/eval.h"

namespace fathom::eval {

Result<UnigramResult> unigram_baseline(std::span<const uint32_t> train, std::span<const uint32_t> val,
                                       int64_t vocab_size) {
  if (vocab_size <= 0) return invalid_argument("vocab_size {} must be positive", vocab_size);
  if (train.empty() || val.empty())
    return invalid_argument("train ({} ids) and val ({} ids) must not be empty", train.size(), val.size());
  std::vector<int64_t> train_counts(vocab_size, 0), val_counts(vocab_size, 0);
  for (uint32_t id : train) {
    if (id >= vocab_size) return out_of_range("train id {} is outside the vocabulary of {}", id, vocab_size);
    ++train_counts[id];
  }
  for (uint32_t id : val) {
    if (id >= vocab_size) return out_of_range("val id {} is outside the vocabulary of {}", id, vocab_size);
    ++val_counts[id];
  }
  UnigramResult r;
  r.n_train = static_cast<int64_t>(train.size());
  r.n_val = static_cast<int64_t>(val.size());
  const double denom = static_cast<double>(r.n_train + vocab_size);
  const double n_val = static_cast<double>(r.n_val);
  double ce = 0, h = 0;
  for (int64_t id = 0; id < vocab_size; ++id) {
    const int64_t c = val_counts[id];
    if (c == 0) continue;
    if (train_counts[id] == 0) r.n_val_unseen += c;
    const double p_train = static_cast<double>(train_counts[id] + 1) / denom;
    const double p_val = static_cast<double>(c) / n_val;
    ce -= p_val * std::log(p_train);
    h -= p_val * std::log(p_val);
  }
  r.cross_entropy_nats = ce;
  r.val_entropy_nats = h;
  return r;
}

}  // namespace fathom::eval
