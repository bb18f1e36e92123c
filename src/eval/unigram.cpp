// The unigram baseline: how many nats per token a model that ignores context entirely pays on
// val.bin when it predicts train.bin's token frequencies. A trained model's validation loss must be
// well below it. Add-one (Laplace) smoothing over the whole vocabulary keeps ids unseen in train
// finite; with ~10M training tokens and a few thousand ids its effect is ~1e-4 nats.
#include <cmath>

#include "eval/eval.h"

namespace fathom::eval {

Result<UnigramResult> unigram_baseline(std::span<const int32_t> train, std::span<const int32_t> val,
                                       int64_t vocab_size, std::span<const uint8_t> train_mask,
                                       std::span<const uint8_t> val_mask) {
  if (vocab_size <= 0) return invalid_argument("vocab_size {} must be positive", vocab_size);
  if (!train_mask.empty() && train_mask.size() != train.size())
    return invalid_argument("train mask has {} bytes for {} ids", train_mask.size(), train.size());
  if (!val_mask.empty() && val_mask.size() != val.size())
    return invalid_argument("val mask has {} bytes for {} ids", val_mask.size(), val.size());
  std::vector<int64_t> train_counts(vocab_size, 0), val_counts(vocab_size, 0);
  int64_t n_train = 0, n_val_ids = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    const int32_t id = train[i];
    if (id < 0 || id >= vocab_size)
      return out_of_range("train id {} is outside the vocabulary of {}", id, vocab_size);
    if (!train_mask.empty() && train_mask[i] == 0) continue;
    ++train_counts[id];
    ++n_train;
  }
  for (size_t i = 0; i < val.size(); ++i) {
    const int32_t id = val[i];
    if (id < 0 || id >= vocab_size)
      return out_of_range("val id {} is outside the vocabulary of {}", id, vocab_size);
    if (!val_mask.empty() && val_mask[i] == 0) continue;
    ++val_counts[id];
    ++n_val_ids;
  }
  if (n_train == 0 || n_val_ids == 0)
    return invalid_argument("train ({} ids) and val ({} ids) must not be empty", n_train, n_val_ids);
  UnigramResult r;
  r.n_train = n_train;
  r.n_val = n_val_ids;
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
