// Randomised model-based test of KvCache: thousands of random operations (add, append + write,
// fork, truncate, free, prefix attach, page export/import into a second cache) checked after every
// one against a std::map of sequences holding the expected tokens and values, plus the page
// accounting invariants. Small pages and a small pool so sharing, copy-on-write and eviction
// happen constantly. Seeds are fresh each run and printed (FATHOM_TEST_SEED=N repeats one).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/rng.h"
#include "kvcache/kvcache.h"
#include "kvcache/page_index.h"

namespace fathom {
namespace {

struct RefSeq {
  std::vector<int32_t> tokens;
};

class Model {
 public:
  Model(MlaKvFormat f, uint64_t seed, int layers, int64_t pages) : f_(f), rng_(seed), layers_(layers) {
    KvCacheOptions o{.n_layers = layers,
                     .format = f,
                     .model_fingerprint = kv_model_fingerprint("model", "weights"),
                     .capacity_bytes = static_cast<uint64_t>(pages * f.page_bytes() * layers),
                     .max_sequences = 6,
                     .max_tokens_per_sequence = 96};
    cache_ = KvCache::create(o).value();
    mirror_ = KvCache::create(o).value();
    for (auto& doc : docs_) {
      doc.resize(60);
      for (auto& t : doc) t = static_cast<int32_t>(rng_.below(50));
    }
  }

  // The value a model would produce for `layer` at position `pos` given the prefix tokens[0..pos]:
  // a function of the whole prefix, so equal prefixes give equal pages.
  std::vector<float> expected_token(const std::vector<int32_t>& tokens, size_t pos, int layer) const {
    uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(layer + 1);
    for (size_t i = 0; i <= pos; ++i) h = splitmix64(h ^ static_cast<uint64_t>(tokens[i]));
    std::vector<float> v(static_cast<size_t>(f_.d_qk()));
    for (size_t d = 0; d < v.size(); ++d)
      v[d] = static_cast<float>(static_cast<int>(splitmix64(h + d) % 2001) - 1000) / 64;
    std::vector<uint8_t> enc(static_cast<size_t>(f_.token_bytes()));
    mla_kv_encode_token(f_, v.data(), enc.data());
    mla_kv_decode_token(f_, enc.data(), v.data());  // what the cache can hold
    return v;
  }

  void write_values(SeqId id, const std::vector<int32_t>& tokens, size_t from) {
    const size_t n = tokens.size() - from;
    for (int l = 0; l < layers_; ++l) {
      // One or two chunks per layer.
      size_t split = n > 1 && rng_.below(2) ? 1 + rng_.below(n - 1) : n;
      for (size_t begin = 0; begin < n; begin = split, split = n) {
        std::vector<float> vals;
        for (size_t p = from + begin; p < from + split; ++p) {
          const auto v = expected_token(tokens, p, l);
          vals.insert(vals.end(), v.begin(), v.end());
        }
        const Status st = cache_->write(id, l, static_cast<int64_t>(from + begin), vals);
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
    }
  }

  void op_append(SeqId id, RefSeq& s) {
    const size_t n = 1 + rng_.below(9);
    std::vector<int32_t> add(n);
    for (auto& t : add) t = static_cast<int32_t>(rng_.below(50));
    const int64_t need = cache_->pages_needed(id, static_cast<int64_t>(n)).value();
    const int64_t available = cache_->available_pages();
    const Status st = cache_->append(id, add);
    if (s.tokens.size() + n > 96) {
      ASSERT_EQ(st.code(), StatusCode::kOutOfRange);
      return;
    }
    if (need > available) {
      ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
      return;
    }
    ASSERT_TRUE(st.ok()) << st.to_string();
    const size_t from = s.tokens.size();
    s.tokens.insert(s.tokens.end(), add.begin(), add.end());
    write_values(id, s.tokens, from);
  }

  void op_new_with_prefix() {
    auto id = cache_->add_sequence();
    if (!id.ok()) {
      ASSERT_EQ(id.status().code(), StatusCode::kResourceExhausted);
      ASSERT_EQ(seqs_.size(), 6u);
      return;
    }
    const auto& doc = docs_[rng_.below(docs_.size())];
    std::vector<int32_t> prompt(doc.begin(), doc.begin() + static_cast<int64_t>(1 + rng_.below(doc.size())));
    const int64_t got =
        cache_->attach_prefix(*id, std::span<const int32_t>(prompt).first(prompt.size() - 1)).value();
    ASSERT_EQ(got % f_.page_tokens, 0);
    RefSeq s{std::vector<int32_t>(prompt.begin(), prompt.begin() + got)};
    const std::vector<int32_t> rest(prompt.begin() + got, prompt.end());
    const int64_t need = cache_->pages_needed(*id, static_cast<int64_t>(rest.size())).value();
    const int64_t available = cache_->available_pages();
    const Status st = cache_->append(*id, rest);
    if (need > available) {
      ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
    } else {
      ASSERT_TRUE(st.ok()) << st.to_string();
      const size_t from = s.tokens.size();
      s.tokens.insert(s.tokens.end(), rest.begin(), rest.end());
      write_values(*id, s.tokens, from);
    }
    seqs_[*id] = s;
  }

  // Moves a random published page of the main cache into the mirror (in chain order) and checks
  // that the mirror then serves the same prefix.
  void op_mirror(const RefSeq& s) {
    std::vector<PageHash> chain;
    kv_hash_chain(cache_->hash_seed(), s.tokens, f_.page_tokens, &chain);
    std::vector<uint8_t> blob(static_cast<size_t>(cache_->export_blob_bytes()));
    PageHash parent = mirror_->hash_seed();
    for (const PageHash& h : chain) {
      const Status st = cache_->export_page(h, blob);
      if (!st.ok()) {  // a duplicate computed privately, or not yet written in every layer
        ASSERT_EQ(st.code(), StatusCode::kNotFound);
        return;
      }
      auto r = mirror_->import_page(parent, blob);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      parent = h;
    }
    // Imports (and re-imports) refresh LRU order, so a chain that fits is all there.
    if (static_cast<int64_t>(chain.size()) <= mirror_->n_pages()) {
      ASSERT_EQ(mirror_->lookup(chain), static_cast<int64_t>(chain.size()));
    }
  }

  void step() {
    const uint64_t op = rng_.below(100);
    if (seqs_.empty() || op < 12) return op_new_with_prefix();
    auto it = seqs_.begin();
    std::advance(it, static_cast<int64_t>(rng_.below(seqs_.size())));
    const SeqId id = it->first;
    RefSeq& s = it->second;
    if (op < 60) return op_append(id, s);
    if (op < 70) {
      auto child = cache_->fork(id);
      if (child.ok()) {
        seqs_[*child] = s;
      } else {
        ASSERT_EQ(child.status().code(), StatusCode::kResourceExhausted);
      }
      return;
    }
    if (op < 80) {
      const size_t keep = rng_.below(s.tokens.size() + 1);
      ASSERT_TRUE(cache_->truncate(id, static_cast<int64_t>(keep)).ok());
      s.tokens.resize(keep);
      return;
    }
    if (op < 92) {
      ASSERT_TRUE(cache_->free_sequence(id).ok());
      seqs_.erase(it);
      return;
    }
    op_mirror(s);
  }

  void check() const {
    std::set<int32_t> used;
    std::vector<float> out;
    for (const auto& [id, s] : seqs_) {
      ASSERT_EQ(cache_->seq_len(id).value(), static_cast<int64_t>(s.tokens.size()));
      const auto table = cache_->block_table(id).value();
      ASSERT_EQ(static_cast<int64_t>(table.size()),
                (static_cast<int64_t>(s.tokens.size()) + f_.page_tokens - 1) / f_.page_tokens);
      used.insert(table.begin(), table.end());
      out.resize(s.tokens.size() * static_cast<size_t>(f_.d_qk()));
      for (int l = 0; l < layers_; ++l) {
        ASSERT_TRUE(cache_->read(id, l, 0, static_cast<int64_t>(s.tokens.size()), out).ok());
        for (size_t p = 0; p < s.tokens.size(); ++p) {
          const auto want = expected_token(s.tokens, p, l);
          ASSERT_TRUE(
              std::equal(want.begin(), want.end(), out.begin() + static_cast<int64_t>(p * want.size())))
              << "sequence " << id << " layer " << l << " position " << p;
        }
      }
    }
    const KvCacheStats st = cache_->stats();
    ASSERT_EQ(st.pages_used, static_cast<int64_t>(used.size()));
    ASSERT_EQ(st.pages_used + st.pages_free + st.pages_cached, st.pages_total);
    ASSERT_EQ(st.sequences, static_cast<int>(seqs_.size()));
    ASSERT_LE(st.pages_cached, st.pages_published);
    ASSERT_EQ(cache_->available_pages(), st.pages_free + st.pages_cached);
  }

  const KvCacheStats stats() const { return cache_->stats(); }

 private:
  MlaKvFormat f_;
  Rng rng_;
  int layers_;
  std::unique_ptr<KvCache> cache_, mirror_;
  std::map<SeqId, RefSeq> seqs_;
  std::array<std::vector<int32_t>, 4> docs_;
};

uint64_t test_seed() {
  if (const char* env = std::getenv("FATHOM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

void run_model(MlaKvFormat f, int ops) {
  const uint64_t seed = test_seed();
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FATHOM_TEST_SEED to repeat)");
  Model m(f, seed, 3, 20);
  for (int i = 0; i < ops; ++i) {
    SCOPED_TRACE("operation " + std::to_string(i));
    m.step();
    if (::testing::Test::HasFatalFailure()) return;
    m.check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  const KvCacheStats s = m.stats();
  std::printf("[ stats    ] prefix hit pages %lld, evictions %lld, copy-on-write %lld\n",
              static_cast<long long>(s.prefix_hit_pages), static_cast<long long>(s.evictions),
              static_cast<long long>(s.cow_copies));
  EXPECT_GT(s.prefix_hit_pages, 0);
  EXPECT_GT(s.evictions, 0);
  EXPECT_GT(s.cow_copies, 0);
}

TEST(KvCacheModel, RandomOperationsMatchAMapOfSequencesBf16) {
  run_model({.d_latent = 16, .d_rope = 2, .dtype = MlaKvDType::kBF16, .page_tokens = 4}, 3000);
}

TEST(KvCacheModel, RandomOperationsMatchAMapOfSequencesFp8) {
  run_model({.d_latent = 32, .d_rope = 4, .dtype = MlaKvDType::kFP8, .page_tokens = 6}, 3000);
}

// The open-addressing index against a std::map, with hashes whose first bytes collide often so
// long probe runs, wrap-around and backward-shift deletion are all exercised.
TEST(PageIndex, RandomInsertEraseMatchesAMap) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  constexpr int64_t kPages = 40;
  std::vector<PageHash> hashes(kPages);
  internal::PageIndex index(kPages, &hashes);
  std::map<PageHash, int32_t> ref;
  for (int op = 0; op < 20000; ++op) {
    const auto id = static_cast<int32_t>(rng.below(kPages));
    auto it = std::find_if(ref.begin(), ref.end(), [&](const auto& kv) { return kv.second == id; });
    if (it != ref.end()) {
      index.erase(id);
      ref.erase(it);
    } else {
      PageHash h{};
      h[0] = static_cast<uint8_t>(rng.below(8));  // few home slots: heavy clustering
      h[31] = static_cast<uint8_t>(rng.below(256));
      h[30] = static_cast<uint8_t>(rng.below(256));
      if (ref.count(h)) continue;
      hashes[static_cast<size_t>(id)] = h;
      index.insert(id);
      ref[h] = id;
    }
    ASSERT_EQ(index.size(), static_cast<int64_t>(ref.size()));
    for (const auto& [h, i] : ref) ASSERT_EQ(index.find(h), i);
    PageHash absent{};
    absent[0] = static_cast<uint8_t>(rng.below(8));
    absent[29] = 1;  // never set by inserts
    ASSERT_EQ(index.find(absent), -1);
  }
}

}  // namespace
}  // namespace fathom
