// Token data of `fathom train` (format fathom-tokens-v1, docs/train.md): loading with full
// validation, the seeded document-start sampler and the fixed validation set. Does not tokenize:
// the data component writes the directory.
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/fs.h"
#include "base/rng.h"
#include "train/trainer.h"

namespace fathom::train {
namespace {

Result<TokenMeta> read_meta(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "meta.json").string();
  if (!path_exists(path))
    return not_found("data: {} is missing (expected a fathom-tokens-v1 directory)", path);
  const std::string text = TRY(read_file(path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return invalid_argument("data: {} is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) return invalid_argument("data: {} must hold a JSON object", path);
  if (!j.contains("format") || j["format"] != "fathom-tokens-v1") {
    return invalid_argument("data: {}: \"format\" must be \"fathom-tokens-v1\"", path);
  }
  TokenMeta m;
  auto get = [&](const char* key, int64_t& out, int64_t min) -> Status {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return invalid_argument("data: {}: \"{}\" must be an integer", path, key);
    }
    out = j[key].get<int64_t>();
    if (out < min)
      return invalid_argument("data: {}: \"{}\" is {}, must be at least {}", path, key, out, min);
    return {};
  };
  TRY(get("vocab_size", m.vocab_size, 1));
  TRY(get("bos_id", m.bos_id, 0));
  TRY(get("eos_id", m.eos_id, 0));
  TRY(get("n_train_tokens", m.n_train_tokens, 1));
  TRY(get("n_val_tokens", m.n_val_tokens, 1));
  if (j.contains("loss_mask")) {
    if (j["loss_mask"] != "uint8")
      return invalid_argument("data: {}: \"loss_mask\" must be \"uint8\" (one byte per token)", path);
    m.loss_mask = true;
  }
  if (m.bos_id >= m.vocab_size || m.eos_id >= m.vocab_size) {
    return invalid_argument("data: {}: bos_id {} / eos_id {} must be below vocab_size {}", path, m.bos_id,
                            m.eos_id, m.vocab_size);
  }
  if (m.vocab_size > (int64_t{1} << 31) - 1) return invalid_argument("data: {}: vocab_size too large", path);
  return m;
}

Status read_split(const std::string& dir, const char* name, int64_t expected, const TokenMeta& m,
                  std::vector<int32_t>& out) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  if (!path_exists(path)) return not_found("data: {} is missing", path);
  const uint64_t size = TRY(file_size(path));
  if (size % 4 != 0)
    return invalid_argument("data: {} is {} bytes, not a whole number of uint32 token ids", path, size);
  if (static_cast<int64_t>(size / 4) != expected) {
    return invalid_argument("data: {} holds {} tokens but meta.json says {}", path, size / 4, expected);
  }
  const std::string bytes = TRY(read_file(path));
  out.resize(static_cast<size_t>(expected));
  for (int64_t i = 0; i < expected; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + i * 4;
    const uint32_t id = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    if (id >= static_cast<uint64_t>(m.vocab_size)) {
      return invalid_argument("data: {}: token {} at index {} is not below vocab_size {}", path, id, i,
                              m.vocab_size);
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(id);
  }
  if (out[0] != m.bos_id) {
    return invalid_argument("data: {} must start with bos_id {} (every document starts with it), found {}",
                            path, m.bos_id, out[0]);
  }
  return {};
}

Status read_mask(const std::string& dir, const char* name, int64_t expected, std::vector<uint8_t>& out) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  if (!path_exists(path)) return not_found("data: {} is missing (meta.json declares a loss mask)", path);
  const std::string bytes = TRY(read_file(path));
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return invalid_argument("data: {} has {} bytes but its tokens are {} (one byte per token)", path,
                            bytes.size(), expected);
  }
  out.assign(bytes.begin(), bytes.end());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] > 1) return invalid_argument("data: {}: byte {} is {}, mask bytes are 0 or 1", path, i, out[i]);
  }
  if (std::find(out.begin(), out.end(), uint8_t{1}) == out.end())
    return invalid_argument("data: {} marks no token as a target", path);
  return {};
}

std::vector<int64_t> doc_starts(const std::vector<int32_t>& t, int64_t bos, int64_t seq_len) {
  std::vector<int64_t> s;
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t i = 0; i + seq_len + 1 <= n; ++i) {
    if (t[static_cast<size_t>(i)] == bos) s.push_back(i);
  }
  return s;
}

// Tokens outside every window [start, start + seq_len] (the union over all starts), and the
// longest document (bos to bos).
void count_unreached(const std::vector<int32_t>& t, int64_t bos, const std::vector<int64_t>& starts,
                     int64_t seq_len, int64_t& unreached, int64_t& longest) {
  const int64_t n = static_cast<int64_t>(t.size());
  int64_t covered = 0, end = 0;  // end: one past the last covered position so far
  for (const int64_t s : starts) {
    const int64_t e = s + seq_len + 1;
    covered += e - std::max(s, end);
    end = std::max(end, e);
  }
  unreached = n - covered;
  longest = 0;
  int64_t prev = -1;
  for (int64_t i = 0; i <= n; ++i) {
    if (i == n || t[static_cast<size_t>(i)] == bos) {
      if (prev >= 0) longest = std::max(longest, i - prev);
      prev = i;
    }
  }
}

}  // namespace

Result<TokenData> load_token_data(const std::string& dir, int64_t seq_len) {
  if (seq_len < 1) return invalid_argument("--seq-len {} must be at least 1", seq_len);
  TokenData d;
  d.dir = dir;
  d.meta = TRY(read_meta(dir));
  TRY(read_split(dir, "train.bin", d.meta.n_train_tokens, d.meta, d.train));
  TRY(read_split(dir, "val.bin", d.meta.n_val_tokens, d.meta, d.val));
  if (d.meta.loss_mask) {
    TRY(read_mask(dir, "train.mask", d.meta.n_train_tokens, d.train_mask));
    TRY(read_mask(dir, "val.mask", d.meta.n_val_tokens, d.val_mask));
  }
  d.train_starts = doc_starts(d.train, d.meta.bos_id, seq_len);
  d.val_starts = doc_starts(d.val, d.meta.bos_id, seq_len);
  if (d.train_starts.empty()) {
    return invalid_argument(
        "data: {}/train.bin has no document start with {} tokens after it (--seq-len {} + 1)", dir,
        seq_len + 1, seq_len);
  }
  if (d.val_starts.empty()) {
    return invalid_argument(
        "data: {}/val.bin has no document start with {} tokens after it (--seq-len {} + 1)", dir, seq_len + 1,
        seq_len);
  }
  count_unreached(d.train, d.meta.bos_id, d.train_starts, seq_len, d.train_unreached, d.longest_train_doc);
  d.hash = XXH3_64bits_withSeed(d.train.data(), d.train.size() * 4, 0) ^
           XXH3_64bits_withSeed(d.val.data(), d.val.size() * 4, 1);
  if (d.meta.loss_mask) {
    d.hash ^= XXH3_64bits_withSeed(d.train_mask.data(), d.train_mask.size(), 2) ^
              XXH3_64bits_withSeed(d.val_mask.data(), d.val_mask.size(), 3);
  }
  return d;
}

void fill_sequence(std::span<const int32_t> tokens, int64_t start, int64_t seq_len, int64_t i, Batch& b,
                   std::span<const uint8_t> mask) {
  CHECK(start >= 0 && start + seq_len + 1 <= static_cast<int64_t>(tokens.size()));
  CHECK(mask.empty() || mask.size() == tokens.size());
  for (int64_t t = 0; t < seq_len; ++t) {
    const auto next = static_cast<size_t>(start + t + 1);
    b.tokens[static_cast<size_t>(i * seq_len + t)] = tokens[static_cast<size_t>(start + t)];
    b.targets[static_cast<size_t>(i * seq_len + t)] = mask.empty() || mask[next] ? tokens[next] : -1;
  }
}

Sampler::Sampler(const TokenData& data, int64_t seq_len, uint64_t seed)
    : data_(data), seq_len_(seq_len), seed_(seed) {
  shuffle();
}

void Sampler::shuffle() {
  order_ = data_.train_starts;
  Rng rng(splitmix64(seed_ ^ 0x5eed5a3b1e7ull) + static_cast<uint64_t>(epoch_));
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
}

void Sampler::seek(int64_t epoch, int64_t cursor) {
  CHECK(cursor >= 0 && cursor < static_cast<int64_t>(order_.size()));
  if (epoch != epoch_) {
    epoch_ = epoch;
    shuffle();
  }
  cursor_ = cursor;
}

void Sampler::next(int64_t n_seq, Batch& b) {
  b.shape = {n_seq, seq_len_};
  b.tokens.resize(static_cast<size_t>(n_seq * seq_len_));
  b.targets.resize(b.tokens.size());
  for (int64_t i = 0; i < n_seq; ++i) {
    fill_sequence(data_.train, order_[static_cast<size_t>(cursor_)], seq_len_, i, b, data_.train_mask);
    if (++cursor_ == static_cast<int64_t>(order_.size())) {
      cursor_ = 0;
      ++epoch_;
      shuffle();
    }
  }
}

std::vector<Batch> validation_batches(const TokenData& data, int64_t seq_len, int64_t n_seq,
                                      int64_t n_batches) {
  std::vector<Batch> out(static_cast<size_t>(n_batches));
  const int64_t n_starts = static_cast<int64_t>(data.val_starts.size());
  const int64_t want = n_seq * n_batches;
  for (int64_t b = 0; b < n_batches; ++b) {
    Batch& batch = out[static_cast<size_t>(b)];
    batch.shape = {n_seq, seq_len};
    batch.tokens.resize(static_cast<size_t>(n_seq * seq_len));
    batch.targets.resize(batch.tokens.size());
    for (int64_t i = 0; i < n_seq; ++i) {
      const int64_t k = b * n_seq + i;
      // Evenly spaced over the starts when there are enough, else every start in turn.
      const int64_t idx = want <= n_starts ? k * n_starts / want : k % n_starts;
      fill_sequence(data.val, data.val_starts[static_cast<size_t>(idx)], seq_len, i, batch, data.val_mask);
    }
  }
  return out;
}

}  // namespace fathom::train
