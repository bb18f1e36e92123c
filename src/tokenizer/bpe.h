// Internal: the BPE model of a tokenizer.json — vocabulary, merge ranks, the merge loop (the same
// priority order and stale-entry rule as the Rust `tokenizers` crate's Word::merge_all) and a
// bounded, sharded cache of word -> ids. Built by the loader; immutable afterwards apart from the
// cache, which is safe to use from many threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace fathom::tok {

using Id = int32_t;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const;
};
using StringIdMap = std::unordered_map<std::string, Id, StringHash, std::equal_to<>>;

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void reserve(size_t n);
  // false when the pair is already present (the first rank wins, as in Hugging Face).
  bool insert(Id left, Id right, int32_t rank, Id merged);
  // rank < 0 when absent.
  struct Entry {
    int32_t rank;
    Id merged;
  };
  Entry find(Id left, Id right) const {
    if (keys_.empty()) return {-1, -1};
    const uint64_t key = make_key(left, right);
    size_t i = hash(key) & mask_;
    while (true) {
      const uint64_t k = keys_[i];
      if (k == key) return values_[i];
      if (k == kEmpty) return {-1, -1};
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t make_key(Id a, Id b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<Entry> values_;
  size_t mask_ = 0, size_ = 0;
};

// A word -> ids cache owned by one thread for one model: open addressing on a 64-bit hash, keys
// and ids in flat arenas, no locks. When half full it starts over (results never depend on it).
class FlatWordCache {
 public:
  FlatWordCache();
  void reset();
  bool lookup(std::string_view word, uint64_t hash, std::vector<Id>* out) const;  // appends on a hit
  void insert(std::string_view word, uint64_t hash, const Id* ids, size_t n);

 private:
  static constexpr size_t kSlots = size_t{1} << 15;
  struct Slot {
    uint64_t hash = 0;  // 0: empty (stored hashes have the low bit set)
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, n_ids = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<Id> ids_;
  size_t used_ = 0;
};

// One symbol of a word being merged: a doubly linked list over an array; len 0 marks a symbol
// merged into its left neighbour.
struct BpeSymbol {
  Id id;
  int32_t prev, next;
  uint32_t len;
};
// Words with at least this many symbols use the bucket queue (merge_all_long).
inline constexpr size_t kLongWordSymbols = 2048;

struct BpeOptions {
  std::string unk_token;  // "" = none
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;
};

class BpeModel {
 public:
  // vocab: token -> id; merges as (left, right) token strings by rank. Every merge must name
  // tokens of the vocabulary and produce one. byte_level: pieces are raw bytes mapped through the
  // GPT-2 alphabet. Errors name the offending merge.
  static Result<std::unique_ptr<BpeModel>> create(
      StringIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      const BpeOptions& options, bool byte_level);

  // Encoding state for one call on one thread: this thread's word cache for the model.
  class Session {
   public:
    explicit Session(const BpeModel& model);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    // Appends the ids of one pre-tokenized piece (raw bytes when byte_level, else UTF-8 text).
    void encode_piece(std::string_view piece, std::vector<Id>* out);

   private:
    const BpeModel& model_;
    FlatWordCache* cache_;
    int64_t hits_ = 0, misses_ = 0;
  };

  // The merge loop without the cache; `long_path` forces the long-word bucket queue (tests compare
  // both paths).
  void encode_uncached_for_test(std::string_view piece, bool long_path, std::vector<Id>* out) const;

  const StringIdMap& vocab() const { return vocab_; }
  // Token string of a model id ("" and false when the id has none).
  bool id_to_token(Id id, std::string_view* token) const;
  Id max_id() const { return static_cast<Id>(id_to_token_.size()) - 1; }
  const std::vector<std::pair<Id, Id>>& merges() const { return merge_list_; }
  const BpeOptions& options() const { return options_; }
  bool byte_level() const { return byte_level_; }
  int64_t cache_hits() const { return hits_.load(std::memory_order_relaxed); }
  int64_t cache_misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  BpeModel() = default;
  using Symbol = BpeSymbol;
  void initial_symbols(std::string_view piece, std::vector<Symbol>* syms) const;
  void merge_all(std::vector<Symbol>* syms) const;
  void merge_all_long(std::vector<Symbol>* syms) const;
  void encode_uncached(std::string_view piece, std::vector<Id>* out) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_token_;
  MergeTable merge_table_;
  std::vector<std::pair<Id, Id>> merge_list_;
  std::array<Id, 256> byte_ids_{};      // byte-level alphabet
  std::array<Id, 256> fallback_ids_{};  // <0xNN> tokens (byte_fallback)
  StringIdMap raw_vocab_;               // raw bytes -> id, for ignore_merges on byte-level
  Id unk_id_ = -1;
  BpeOptions options_;
  bool byte_level_ = false;
  uint64_t uid_ = 0;  // identifies this model in the per-thread cache registry
  mutable std::atomic<int64_t> hits_{0}, misses_{0};
};

}  // namespace fathom::tok
