// KvCache unit tests: capacity, allocation and LRU eviction, copy-on-write, fork, truncate,
// publishing and prefix attach, page blobs (round trip and every corruption), the kernel view, and
// the decode kernel reading this cache against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "base/check.h"
#include "base/rng.h"
#include "kernels/mla_decode.h"
#include "kvcache/kvcache.h"

namespace fathom {
namespace {

constexpr MlaKvFormat kTiny{.d_latent = 32, .d_rope = 16, .dtype = MlaKvDType::kBF16, .page_tokens = 4};

std::unique_ptr<KvCache> make_cache(int64_t pages, MlaKvFormat f = kTiny, int layers = 2, int max_seqs = 8) {
  KvCacheOptions o{.n_layers = layers,
                   .format = f,
                   .model_fingerprint = kv_model_fingerprint("cfg", "w"),
                   .capacity_bytes = static_cast<uint64_t>(pages * f.page_bytes() * layers),
                   .max_sequences = max_seqs,
                   .max_tokens_per_sequence = 1024};
  auto c = KvCache::create(o);
  CHECK_OK(c);
  return std::move(c).value();
}

// Values of token `tok` at layer `layer`: deterministic, exact in bf16.
std::vector<float> token_values(const MlaKvFormat& f, int layer, int32_t tok) {
  std::vector<float> v(static_cast<size_t>(f.d_qk()));
  for (int d = 0; d < f.d_qk(); ++d)
    v[static_cast<size_t>(d)] = static_cast<float>((tok * 7 + layer * 3 + d) % 61 - 30) / 8;
  return v;
}

// Appends tokens and writes their values in every layer.
// Appends tokens and writes each layer's token_values; `layer1_value`, when given, replaces layer
// 1's values (the same tokens with other KV bytes).
void feed(KvCache& c, SeqId seq, const std::vector<int32_t>& tokens,
          std::optional<float> layer1_value = std::nullopt) {
  const int64_t pos = c.seq_len(seq).value();
  ASSERT_TRUE(c.append(seq, tokens).ok());
  for (int l = 0; l < c.n_layers(); ++l) {
    std::vector<float> vals;
    for (int32_t t : tokens) {
      auto v = token_values(c.format(), l, t);
      vals.insert(vals.end(), v.begin(), v.end());
    }
    if (l == 1 && layer1_value) std::fill(vals.begin(), vals.end(), *layer1_value);
    ASSERT_TRUE(c.write(seq, l, pos, vals).ok());
  }
}

void expect_contents(const KvCache& c, SeqId seq, const std::vector<int32_t>& tokens) {
  ASSERT_EQ(c.seq_len(seq).value(), static_cast<int64_t>(tokens.size()));
  std::vector<float> out(tokens.size() * static_cast<size_t>(c.format().d_qk()));
  for (int l = 0; l < c.n_layers(); ++l) {
    ASSERT_TRUE(c.read(seq, l, 0, static_cast<int64_t>(tokens.size()), out).ok());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto want = token_values(c.format(), l, tokens[i]);
      for (size_t d = 0; d < want.size(); ++d) ASSERT_EQ(out[i * want.size() + d], want[d]) << "token " << i;
    }
  }
}

std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(KvCache, CapacityIsSetOnceInBytes) {
  auto c = make_cache(10);
  EXPECT_EQ(c->n_pages(), 10);
  EXPECT_EQ(c->available_pages(), 10);
  EXPECT_EQ(c->page_bytes_all_layers(), 2 * kTiny.page_bytes());
  KvCacheOptions o{.n_layers = 61, .format = MlaKvFormat{}, .capacity_bytes = 1000};
  auto bad = KvCache::create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("holds no page"), std::string::npos) << bad.status().message();
  o.capacity_bytes = 1 << 30;
  o.format.d_latent = 500;
  EXPECT_NE(KvCache::create(o).status().message().find("d_latent"), std::string::npos);
}

TEST(KvCache, FormatSizesMatchFlashMla) {
  MlaKvFormat f;
  EXPECT_EQ(f.token_bytes(), 1152);
  f.dtype = MlaKvDType::kFP8;
  EXPECT_EQ(f.token_bytes(), 656);
  EXPECT_EQ(f.scales_offset(), 512);
  EXPECT_EQ(f.rope_offset(), 528);
  const MlaKvFormat tiny{.d_latent = 64, .d_rope = 32, .dtype = MlaKvDType::kFP8};
  EXPECT_EQ(tiny.token_bytes(), 64 + 4 + 64);
}

TEST(KvCache, AppendWriteReadRoundTripAcrossPages) {
  auto c = make_cache(10);
  const SeqId s = c->add_sequence().value();
  const auto toks = iota_tokens(10, 100);
  feed(*c, s, toks);
  expect_contents(*c, s, toks);
  EXPECT_EQ(c->block_table(s).value().size(), 3u);
  EXPECT_EQ(c->stats().pages_used, 3);
  EXPECT_EQ(c->stats().pages_published, 2);  // the two full pages
}

TEST(KvCache, WritesMustFollowAppendInOrder) {
  auto c = make_cache(10);
  const SeqId s = c->add_sequence().value();
  ASSERT_TRUE(c->append(s, iota_tokens(3, 0)).ok());
  const auto v = token_values(kTiny, 0, 0);
  EXPECT_EQ(c->write(s, 0, 1, v).code(), StatusCode::kOutOfRange);  // hole at position 0
  EXPECT_TRUE(c->write(s, 0, 0, v).ok());
  EXPECT_EQ(c->write(s, 0, 3, v).code(), StatusCode::kOutOfRange);  // not appended
  EXPECT_EQ(c->write(s, 2, 1, v).code(), StatusCode::kOutOfRange);  // no layer 2
  EXPECT_EQ(c->write(s, 0, 1, std::span<const float>(v.data(), 5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->write(99, 0, 0, v).code(), StatusCode::kNotFound);
}

TEST(KvCache, AppendFailsWholeWhenPagesRunOut) {
  auto c = make_cache(3);
  const SeqId s = c->add_sequence().value();
  feed(*c, s, iota_tokens(10, 0));  // 3 pages
  const Status st = c->append(s, iota_tokens(3, 50));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("needs 1 more pages"), std::string::npos) << st.message();
  EXPECT_EQ(c->seq_len(s).value(), 10);                // nothing happened
  EXPECT_TRUE(c->append(s, iota_tokens(2, 50)).ok());  // fits in the partial page
}

TEST(KvCache, ForkSharesPagesAndCopiesThePartialPageOnWrite) {
  auto c = make_cache(10);
  const SeqId a = c->add_sequence().value();
  auto ta = iota_tokens(6, 0);
  feed(*c, a, ta);
  const SeqId b = c->fork(a).value();
  EXPECT_EQ(c->stats().pages_used, 2);          // shared
  EXPECT_EQ(c->pages_needed(b, 1).value(), 1);  // the shared partial page must be copied
  auto tb = ta;
  feed(*c, b, {77});
  tb.push_back(77);
  feed(*c, a, {88, 89});
  ta.push_back(88);
  ta.push_back(89);
  expect_contents(*c, a, ta);
  expect_contents(*c, b, tb);
  EXPECT_EQ(c->stats().cow_copies, 1);  // b copied; a then owned its page alone
  EXPECT_EQ(c->block_table(a).value()[0], c->block_table(b).value()[0]);  // full page still shared
  EXPECT_NE(c->block_table(a).value()[1], c->block_table(b).value()[1]);
}

TEST(KvCache, FreedFullPagesStayCachedAndAreReusedByPrefix) {
  auto c = make_cache(10);
  const SeqId a = c->add_sequence().value();
  const auto toks = iota_tokens(9, 500);
  feed(*c, a, toks);
  ASSERT_TRUE(c->free_sequence(a).ok());
  EXPECT_EQ(c->stats().pages_cached, 2);
  EXPECT_EQ(c->stats().pages_free, 8);
  const SeqId b = c->add_sequence().value();
  // Ask with all tokens but the last: two full pages match.
  EXPECT_EQ(c->attach_prefix(b, std::span<const int32_t>(toks).first(8)).value(), 8);
  EXPECT_EQ(c->stats().prefix_hit_pages, 2);
  feed(*c, b, {toks[8]});
  expect_contents(*c, b, toks);
  // A different first token shares nothing.
  const SeqId d = c->add_sequence().value();
  auto other = toks;
  other[0] = 1;
  EXPECT_EQ(c->attach_prefix(d, other).value(), 0);
  std::vector<PageHash> chain;
  kv_hash_chain(c->hash_seed(), toks, kTiny.page_tokens, &chain);
  EXPECT_EQ(c->lookup(chain), 2);
  kv_hash_chain(c->hash_seed(), other, kTiny.page_tokens, &chain);
  EXPECT_EQ(c->lookup(chain), 0);
}

TEST(KvCache, EvictsLeastRecentlyReleasedCachedPageWhenFull) {
  auto c = make_cache(4);
  const std::vector<int32_t> first = iota_tokens(4, 0), second = iota_tokens(4, 100);
  for (const auto* toks : {&first, &second}) {
    const SeqId s = c->add_sequence().value();
    feed(*c, s, *toks);
    ASSERT_TRUE(c->free_sequence(s).ok());
  }
  EXPECT_EQ(c->stats().pages_cached, 2);
  // Three pages needed with two free: the oldest cached page (first) is evicted.
  const SeqId s = c->add_sequence().value();
  feed(*c, s, iota_tokens(12, 1000));
  EXPECT_EQ(c->stats().evictions, 1);
  std::vector<PageHash> chain;
  kv_hash_chain(c->hash_seed(), first, 4, &chain);
  EXPECT_EQ(c->lookup(chain), 0);
  kv_hash_chain(c->hash_seed(), second, 4, &chain);
  EXPECT_EQ(c->lookup(chain), 1);
}

TEST(KvCache, TruncateRewindsAndCopiesAPublishedPageBeforeRewriting) {
  auto c = make_cache(10);
  const SeqId s = c->add_sequence().value();
  auto toks = iota_tokens(8, 0);
  feed(*c, s, toks);  // two full published pages
  ASSERT_TRUE(c->truncate(s, 6).ok());
  EXPECT_EQ(c->block_table(s).value().size(), 2u);
  EXPECT_EQ(c->pages_needed(s, 1).value(), 1);  // page 1 is published: copy-on-write
  toks.resize(6);
  feed(*c, s, {42, 43});
  toks.push_back(42);
  toks.push_back(43);
  expect_contents(*c, s, toks);
  // The original second page is still published under its hash.
  std::vector<PageHash> chain;
  kv_hash_chain(c->hash_seed(), iota_tokens(8, 0), 4, &chain);
  EXPECT_EQ(c->lookup(chain), 2);
  EXPECT_EQ(c->truncate(s, 9).code(), StatusCode::kOutOfRange);
}

TEST(KvCache, IdenticalPrefixesComputedTwicePublishOnce) {
  auto c = make_cache(10);
  const SeqId a = c->add_sequence().value(), b = c->add_sequence().value();
  feed(*c, a, iota_tokens(4, 0));
  feed(*c, b, iota_tokens(4, 0));
  EXPECT_EQ(c->stats().pages_published, 1);
  ASSERT_TRUE(c->free_sequence(b).ok());  // b's duplicate goes back to the free list
  EXPECT_EQ(c->stats().pages_free, 9);
}

TEST(KvCache, PageBlobsRoundTripBetweenCaches) {
  const MlaKvFormat f{.d_latent = 64, .d_rope = 32, .dtype = MlaKvDType::kFP8, .page_tokens = 8};
  auto src = make_cache(6, f, 3), dst = make_cache(6, f, 3);
  const SeqId s = src->add_sequence().value();
  const auto toks = iota_tokens(17, 9);
  feed(*src, s, toks);
  std::vector<PageHash> chain;
  kv_hash_chain(src->hash_seed(), toks, f.page_tokens, &chain);
  ASSERT_EQ(chain.size(), 2u);
  std::vector<uint8_t> blob(static_cast<size_t>(src->export_blob_bytes()));
  PageHash parent = dst->hash_seed();
  for (const PageHash& h : chain) {
    ASSERT_TRUE(src->export_page(h, blob).ok());
    auto imported = dst->import_page(parent, blob);
    ASSERT_TRUE(imported.ok()) << imported.status().to_string();
    EXPECT_EQ(*imported, h);
    parent = h;
  }
  EXPECT_EQ(dst->lookup(chain), 2);
  EXPECT_EQ(dst->stats().pages_cached, 2);
  const SeqId d = dst->add_sequence().value();
  EXPECT_EQ(dst->attach_prefix(d, toks).value(), 16);
  feed(*dst, d, {toks[16]});
  // The same bytes on both sides.
  std::vector<float> a(17 * 96), b(17 * 96);
  for (int l = 0; l < 3; ++l) {
    ASSERT_TRUE(src->read(s, l, 0, 17, a).ok());
    ASSERT_TRUE(dst->read(d, l, 0, 17, b).ok());
    EXPECT_EQ(a, b);
  }
}

// A 4-page cache holding one full page (tokens 3..6) and that page exported; `layer1_value` as in
// feed (same page hash, other bytes).
struct ExportedPage {
  std::unique_ptr<KvCache> src;
  PageHash hash{};
  std::vector<uint8_t> blob;
};
ExportedPage export_first_page(std::optional<float> layer1_value = std::nullopt) {
  ExportedPage e;
  e.src = make_cache(4);
  const SeqId s = e.src->add_sequence().value();
  feed(*e.src, s, iota_tokens(4, 3), layer1_value);
  std::vector<PageHash> chain;
  kv_hash_chain(e.src->hash_seed(), iota_tokens(4, 3), 4, &chain);
  e.hash = chain[0];
  e.blob.resize(static_cast<size_t>(e.src->export_blob_bytes()));
  EXPECT_TRUE(e.src->export_page(e.hash, e.blob).ok());
  return e;
}

TEST(KvCache, ImportRejectsCorruptOrForeignBlobs) {
  auto [src, hash, blob] = export_first_page();
  auto dst = make_cache(4);
  auto expect_error = [&](std::vector<uint8_t> b, StatusCode code, const char* text, const PageHash& parent) {
    auto r = dst->import_page(parent, b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code);
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
  };
  const PageHash seed = dst->hash_seed();
  auto b = blob;
  b[200] ^= 1;  // a payload byte
  expect_error(b, StatusCode::kCorrupt, "checksum", seed);
  b = blob;
  b[0] = 'X';
  expect_error(b, StatusCode::kCorrupt, "FKVP", seed);
  b = blob;
  b[28] = 3;  // n_layers
  expect_error(b, StatusCode::kInvalidArgument, "n_layers 3", seed);
  b = blob;
  b[100] = 1;  // reserved
  expect_error(b, StatusCode::kCorrupt, "reserved header byte 100", seed);
  b = blob;
  b.pop_back();
  expect_error(b, StatusCode::kInvalidArgument, "blob is", seed);
  expect_error(blob, StatusCode::kCorrupt, "hash to", hash);  // wrong parent
  // Another model's cache has another seed: the same blob does not chain there.
  KvCacheOptions o = src->options();
  o.model_fingerprint = kv_model_fingerprint("cfg", "other weights");
  auto foreign = KvCache::create(o).value();
  EXPECT_EQ(foreign->import_page(foreign->hash_seed(), blob).status().code(), StatusCode::kCorrupt);
  EXPECT_TRUE(dst->import_page(seed, blob).ok());
  EXPECT_EQ(src->export_page(PageHash{}, blob).code(), StatusCode::kNotFound);
}

// A page is named by its parent and tokens: importing a blob whose page is already cached keeps
// the cached bytes (it only marks the page used), even if the blob's KV bytes differ (found by
// fuzz.kv_blob, whose harness had assumed the blob's bytes would come back).
TEST(KvCache, ImportingAPageAlreadyCachedKeepsTheCachedBytes) {
  const ExportedPage first = export_first_page();
  const ExportedPage other = export_first_page(0.25f);  // a valid blob of the same page, other KV
  ASSERT_EQ(other.hash, first.hash);
  ASSERT_NE(other.blob, first.blob);
  auto dst = make_cache(4);
  ASSERT_EQ(dst->import_page(dst->hash_seed(), first.blob).value(), first.hash);
  ASSERT_EQ(dst->import_page(dst->hash_seed(), other.blob).value(), first.hash);
  std::vector<uint8_t> back(first.blob.size());
  ASSERT_TRUE(dst->export_page(first.hash, back).ok());
  EXPECT_EQ(back, first.blob);
  EXPECT_EQ(dst->stats().pages_cached, 1);
}

TEST(KvCache, FillBatchPadsBlockTablesAndRejectsNarrowTables) {
  auto c = make_cache(10);
  const SeqId a = c->add_sequence().value(), b = c->add_sequence().value();
  feed(*c, a, iota_tokens(9, 0));
  feed(*c, b, iota_tokens(1, 0));
  std::vector<int32_t> table(2 * 4), lens(2);
  const SeqId seqs[] = {a, b};
  ASSERT_TRUE(c->fill_batch(seqs, 4, table.data(), lens.data()).ok());
  EXPECT_EQ(lens[0], 9);
  EXPECT_EQ(lens[1], 1);
  EXPECT_EQ(table[3], -1);
  EXPECT_EQ(table[5], -1);
  EXPECT_EQ(c->fill_batch(seqs, 2, table.data(), lens.data()).code(), StatusCode::kOutOfRange);
}

// The decode kernel over this cache (shared prefix pages, a forked sequence) against float64.
TEST(KvCache, DecodeKernelReadsTheCacheLikeTheReference) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (MlaKvDType dtype : {MlaKvDType::kBF16, MlaKvDType::kFP8}) {
    const MlaKvFormat f{.d_latent = 64, .d_rope = 32, .dtype = dtype, .page_tokens = 16};
    auto c = make_cache(40, f, 2);
    Rng rng(seed);
    const int heads = 4, D = f.d_qk();
    std::vector<SeqId> seqs = {c->add_sequence().value()};
    auto append_random = [&](SeqId s, int n) {
      const int64_t pos = c->seq_len(s).value();
      std::vector<int32_t> toks(static_cast<size_t>(n));
      for (auto& t : toks) t = static_cast<int32_t>(rng.below(1000));
      ASSERT_TRUE(c->append(s, toks).ok());
      std::vector<float> v(static_cast<size_t>(n * D));
      for (int l = 0; l < 2; ++l) {
        for (auto& x : v) x = static_cast<float>(rng.normal());
        ASSERT_TRUE(c->write(s, l, pos, v).ok());
      }
    };
    append_random(seqs[0], 70);
    seqs.push_back(c->fork(seqs[0]).value());
    append_random(seqs[0], 5);
    append_random(seqs[1], 40);
    seqs.push_back(c->add_sequence().value());  // empty
    const int64_t max_pages = c->max_pages_per_sequence();
    std::vector<int32_t> table(seqs.size() * static_cast<size_t>(max_pages)), lens(seqs.size());
    ASSERT_TRUE(c->fill_batch(seqs, max_pages, table.data(), lens.data()).ok());
    std::vector<float> q(seqs.size() * heads * D), out(seqs.size() * heads * 64), lse(seqs.size() * heads);
    for (auto& x : q) x = static_cast<float>(rng.normal());
    auto dec = MlaDecoder::create({.format = f, .max_batch = 8, .max_rows = heads}).value();
    for (int l = 0; l < 2; ++l) {
      MlaDecodeParams p{.q = q.data(),
                        .batch = static_cast<int64_t>(seqs.size()),
                        .s_q = 1,
                        .heads = heads,
                        .d_qk = D,
                        .cache = c->layer_view(l),
                        .block_table = table.data(),
                        .max_pages = max_pages,
                        .cache_seqlens = lens.data(),
                        .softmax_scale = 0.125f,
                        .out = out.data(),
                        .lse = lse.data()};
      ASSERT_TRUE(dec->decode(p).ok());
      for (size_t b = 0; b < seqs.size(); ++b) {
        const int64_t L = lens[b];
        std::vector<float> keys(static_cast<size_t>(L * D));
        ASSERT_TRUE(c->read(seqs[b], l, 0, L, keys).ok());
        for (int h = 0; h < heads; ++h) {
          const float* qr = q.data() + (b * heads + static_cast<size_t>(h)) * D;
          std::vector<double> sc(static_cast<size_t>(L));
          double mx = -INFINITY, z = 0;
          for (int64_t t = 0; t < L; ++t) {
            double dot = 0;
            for (int d = 0; d < D; ++d) dot += double{qr[d]} * keys[static_cast<size_t>(t * D + d)];
            sc[static_cast<size_t>(t)] = dot * 0.125;
            mx = std::max(mx, sc[static_cast<size_t>(t)]);
          }
          for (double s2 : sc) z += std::exp(s2 - mx);
          const float got_lse = lse[b * heads + static_cast<size_t>(h)];
          if (L == 0) {
            EXPECT_EQ(got_lse, INFINITY);
            continue;
          }
          EXPECT_NEAR(got_lse, mx + std::log(z), 3e-2);  // q is rounded to bf16 on the BF16 path
          for (int cc = 0; cc < 64; ++cc) {
            double o = 0;
            for (int64_t t = 0; t < L; ++t)
              o += std::exp(sc[static_cast<size_t>(t)] - mx) * keys[static_cast<size_t>(t * D + cc)];
            EXPECT_NEAR(out[(b * heads + static_cast<size_t>(h)) * 64 + static_cast<size_t>(cc)], o / z,
                        3e-2);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace fathom
