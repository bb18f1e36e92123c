// KvTier and KvTierLink against a real storage server (storage::StorageServer in process, on a
// temporary target directory): write-through and prefix reads, a restart of the "engine" (a new
// KvCache) warming up from the store with identical page contents, bad blobs rejected at import,
// a store that is down at start, stopped mid-run or comes back, and option errors.
#include "engine/kv_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "base/check.h"
#include "engine/kv_tier_link.h"
#include "storage/faults.h"  // tests only: fault injection under the store
#include "storage/storage.h"

namespace fathom {
namespace {

constexpr MlaKvFormat kFormat{.d_latent = 32, .d_rope = 16, .dtype = MlaKvDType::kBF16, .page_tokens = 8};
constexpr int kLayers = 3;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("fathom-kvtier-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

uint64_t test_seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

std::unique_ptr<storage::StorageServer> start_store(const std::string& dir,
                                                    const std::string& listen = "127.0.0.1:0") {
  storage::ServerParams p;
  p.targets = {storage::TargetParams{dir, 64u << 20}};
  p.listen = listen;
  p.direct_io = false;
  p.group_bytes = 1u << 20;
  auto s = storage::StorageServer::start(p);
  CHECK_OK(s);
  return std::move(s).value();
}

std::unique_ptr<KvCache> make_cache(int64_t pages, std::string_view weights = "w") {
  KvCacheOptions o{.n_layers = kLayers,
                   .format = kFormat,
                   .model_fingerprint = kv_model_fingerprint("cfg", weights),
                   .capacity_bytes = static_cast<uint64_t>(pages * kFormat.page_bytes() * kLayers),
                   .max_sequences = 8,
                   .max_tokens_per_sequence = 1024};
  auto c = KvCache::create(o);
  CHECK_OK(c);
  return std::move(c).value();
}

KvTierOptions tier_options(const std::string& server) {
  KvTierOptions o;
  o.server = server;
  o.write_queue_bytes = 1u << 20;
  o.write_batch_pages = 4;
  o.connect_timeout_ms = 1000;
  o.io_timeout_ms = 3000;
  o.retry_after_ms = 100;
  return o;
}

// Random values for every layer of `tokens`, appended to a new sequence of `c`.
std::vector<std::vector<float>> fill_sequence(KvCache& c, const std::vector<int32_t>& tokens, uint64_t seed,
                                              SeqId* seq_out) {
  const SeqId seq = c.add_sequence().value();
  CHECK_OK(c.append(seq, tokens));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<std::vector<float>> values(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    values[static_cast<size_t>(l)].resize(tokens.size() * static_cast<size_t>(kFormat.d_qk()));
    for (float& v : values[static_cast<size_t>(l)]) v = dist(rng);
    CHECK_OK(c.write(seq, l, 0, values[static_cast<size_t>(l)]));
  }
  *seq_out = seq;
  return values;
}

std::vector<int32_t> random_tokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 50000);
  return t;
}

// Polls ready() the way the engine does each step; false if it never completes.
bool wait_ready(KvTierLink& link, KvTierSeq& s, std::span<const int32_t> prefix) {
  for (int i = 0; i < 5000; ++i) {
    if (link.ready(s, prefix)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

void write_through(KvTier& tier, KvCache& cache, const std::vector<int32_t>& tokens, SeqId seq) {
  KvTierLink link(tier, cache);
  KvTierSeq s;
  link.collect(s, tokens, static_cast<int64_t>(tokens.size()));
  (void)seq;
  for (int i = 0; i < 1000 && link.has_pending(); ++i) {
    link.drain();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_FALSE(link.has_pending());
  ASSERT_TRUE(tier.flush(10000));
}

TEST(KvTier, RestartedCacheIsWarmedFromTheStoreWithIdenticalPages) {
  const uint64_t seed = test_seed();
  TempDir dir;
  auto store = start_store(dir.path());
  const std::vector<int32_t> tokens = random_tokens(5 * 8 + 3, seed);  // 5 full pages and a partial one
  std::vector<std::vector<float>> values;
  {
    auto cache = make_cache(16);
    auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
    ASSERT_TRUE(tier.ok()) << tier.status().to_string();
    SeqId seq = -1;
    values = fill_sequence(*cache, tokens, seed + 1, &seq);
    write_through(**tier, *cache, tokens, seq);
    const KvTierStats st = (*tier)->stats();
    EXPECT_EQ(st.pages_written, 5);
    EXPECT_EQ(st.bytes_written, 5 * cache->export_blob_bytes());
    EXPECT_EQ(st.errors, 0);
  }
  // A new process: empty memory cache, same model.
  auto cache = make_cache(16);
  auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
  ASSERT_TRUE(tier.ok());
  KvTierLink link(**tier, *cache);
  KvTierSeq s;
  // A prompt sharing 4 pages, then diverging.
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 4 * 8);
  for (int i = 0; i < 20; ++i) prompt.push_back(7);
  const std::span<const int32_t> prefix(prompt.data(), prompt.size() - 1);
  ASSERT_TRUE(wait_ready(link, s, prefix));
  const KvTierStats st = (*tier)->stats();
  EXPECT_EQ(st.lookups, 1);
  EXPECT_EQ(st.hit_pages, 4);
  EXPECT_EQ(st.miss_pages, 2);  // prompt has 6 full pages (51 tokens in the prefix)
  EXPECT_EQ(st.pages_imported, 4);
  EXPECT_EQ(st.import_errors, 0);
  const SeqId seq = cache->add_sequence().value();
  EXPECT_EQ(cache->attach_prefix(seq, prefix).value(), 32);
  std::vector<float> out(32 * static_cast<size_t>(kFormat.d_qk()));
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(cache->read(seq, l, 0, 32, out).ok());
    const std::vector<float> ref = [&] {
      // bf16 round trip of what was written: read the original cache's rounding from a fresh one.
      auto c2 = make_cache(8);
      SeqId q = -1;
      std::vector<int32_t> t(tokens.begin(), tokens.begin() + 32);
      const SeqId s2 = c2->add_sequence().value();
      CHECK_OK(c2->append(s2, t));
      std::vector<float> v(values[static_cast<size_t>(l)].begin(),
                           values[static_cast<size_t>(l)].begin() + 32 * kFormat.d_qk());
      CHECK_OK(c2->write(s2, 0, 0, v));
      std::vector<float> r(v.size());
      CHECK_OK(c2->read(s2, 0, 0, 32, r));
      (void)q;
      return r;
    }();
    EXPECT_EQ(out, ref) << "layer " << l;
  }
}

TEST(KvTier, PrefixInMemoryNeedsNoStoreRead) {
  TempDir dir;
  auto store = start_store(dir.path());
  auto cache = make_cache(16);
  auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
  ASSERT_TRUE(tier.ok());
  const std::vector<int32_t> tokens = random_tokens(3 * 8 + 1, 5);
  SeqId seq = -1;
  fill_sequence(*cache, tokens, 6, &seq);
  KvTierLink link(**tier, *cache);
  KvTierSeq s;
  EXPECT_TRUE(link.ready(s, std::span<const int32_t>(tokens.data(), tokens.size() - 1)));
  EXPECT_EQ((*tier)->stats().lookups, 0);
}

TEST(KvTier, BadBlobIsRejectedAtImportAndTheRestIsRecomputed) {
  const uint64_t seed = test_seed();
  TempDir dir;
  auto store = start_store(dir.path());
  const std::vector<int32_t> tokens = random_tokens(4 * 8 + 1, seed);
  {
    auto cache = make_cache(16);
    auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
    SeqId seq = -1;
    fill_sequence(*cache, tokens, seed + 1, &seq);
    write_through(**tier, *cache, tokens, seq);
  }
  // Flip a payload byte of page 2 in the store (same size, so the store itself returns it).
  auto client = storage::StorageClient::connect(storage::ClientParams{.servers = {store->address()}});
  ASSERT_TRUE(client.ok());
  storage::KvCache kv(**client);
  std::vector<PageHash> chain;
  auto probe = make_cache(4);
  kv_hash_chain(probe->hash_seed(), tokens, 8, &chain);
  auto blob = kv.get(chain[2]).value().value();
  blob[blob.size() - 5] ^= 0x40;
  ASSERT_EQ(kv.remove(std::span(&chain[2], 1)).value(), 1u);
  ASSERT_TRUE(kv.put(chain[2], blob).ok());

  auto cache = make_cache(16);
  auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
  KvTierLink link(**tier, *cache);
  KvTierSeq s;
  const std::span<const int32_t> prefix(tokens.data(), tokens.size() - 1);
  ASSERT_TRUE(wait_ready(link, s, prefix));
  const KvTierStats st = (*tier)->stats();
  EXPECT_EQ(st.hit_pages, 4);
  EXPECT_EQ(st.pages_imported, 2);
  EXPECT_EQ(st.import_errors, 1);
  const SeqId seq = cache->add_sequence().value();
  EXPECT_EQ(cache->attach_prefix(seq, prefix).value(), 16);
}

TEST(KvTier, ModelWithOtherWeightsNeverMatchesStoredPages) {
  TempDir dir;
  auto store = start_store(dir.path());
  const std::vector<int32_t> tokens = random_tokens(3 * 8 + 1, 9);
  {
    auto cache = make_cache(16, "weights-a");
    auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
    SeqId seq = -1;
    fill_sequence(*cache, tokens, 10, &seq);
    write_through(**tier, *cache, tokens, seq);
  }
  auto cache = make_cache(16, "weights-b");
  auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
  KvTierLink link(**tier, *cache);
  KvTierSeq s;
  ASSERT_TRUE(wait_ready(link, s, std::span<const int32_t>(tokens.data(), tokens.size() - 1)));
  EXPECT_EQ((*tier)->stats().hit_pages, 0);
  EXPECT_EQ((*tier)->stats().miss_pages, 3);
}

TEST(KvTier, StoreDownAtStartIsAMissThenReconnectsWhenItComesUp) {
  TempDir dir;
  // Find a free port, then leave it closed.
  std::string addr;
  {
    auto probe = start_store(dir.path());
    addr = probe->address();
    probe->stop();
  }
  auto cache = make_cache(16);
  auto tier = KvTier::create(tier_options(addr), cache->export_blob_bytes());
  ASSERT_TRUE(tier.ok());
  const std::vector<int32_t> tokens = random_tokens(2 * 8 + 1, 11);
  KvTierLink link(**tier, *cache);
  KvTierSeq s;
  const std::span<const int32_t> prefix(tokens.data(), tokens.size() - 1);
  ASSERT_TRUE(wait_ready(link, s, prefix));  // answered, as a miss
  KvTierStats st = (*tier)->stats();
  EXPECT_GE(st.errors, 1);
  EXPECT_EQ(st.hit_pages, 0);
  EXPECT_FALSE(st.connected);
  // Pages published while down are dropped, not queued forever.
  SeqId seq = -1;
  fill_sequence(*cache, tokens, 12, &seq);
  KvTierSeq w;
  link.collect(w, tokens, static_cast<int64_t>(tokens.size()));
  link.drain();
  EXPECT_FALSE(link.has_pending());
  // The store comes up on that address: after retry_after_ms the tier reconnects.
  auto store = start_store(dir.path(), addr);
  bool written = false;
  for (int i = 0; i < 200 && !written; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    KvTierSeq again;
    link.collect(again, tokens, static_cast<int64_t>(tokens.size()));
    link.drain();
    (void)(*tier)->flush(5000);
    written = (*tier)->stats().pages_written >= 2;
  }
  EXPECT_TRUE(written);
  EXPECT_TRUE((*tier)->stats().connected);
}

TEST(KvTier, StoreStoppedMidRunTurnsReadsIntoMissesWithoutHanging) {
  TempDir dir;
  auto store = start_store(dir.path());
  auto cache = make_cache(16);
  auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes());
  const std::vector<int32_t> tokens = random_tokens(3 * 8 + 1, 13);
  SeqId seq = -1;
  fill_sequence(*cache, tokens, 14, &seq);
  write_through(**tier, *cache, tokens, seq);
  store->stop();
  auto fresh = make_cache(16);
  auto tier2 = KvTier::create(tier_options(store->address()), fresh->export_blob_bytes());
  KvTierLink link(**tier2, *fresh);
  KvTierSeq s;
  ASSERT_TRUE(wait_ready(link, s, std::span<const int32_t>(tokens.data(), tokens.size() - 1)));
  EXPECT_EQ((*tier2)->stats().pages_imported, 0);
  EXPECT_GE((*tier2)->stats().errors, 1);
  // The first tier, connected before, also fails over on its next read.
  KvTierLink link1(**tier, *fresh);
  KvTierSeq s1;
  ASSERT_TRUE(wait_ready(link1, s1, std::span<const int32_t>(tokens.data(), tokens.size() - 1)));
  EXPECT_GE((*tier)->stats().errors, 1);
}

TEST(KvTier, CancelledFetchIsDiscardedAndUnknownTicketsDoNotHang) {
  TempDir dir;
  auto store = start_store(dir.path());
  auto tier = KvTier::create(tier_options(store->address()), 4096);
  ASSERT_TRUE(tier.ok());
  std::vector<PageHash> chain(3);
  for (size_t i = 0; i < chain.size(); ++i) chain[i].fill(static_cast<uint8_t>(i + 1));
  const uint64_t t = (*tier)->fetch(chain);
  (*tier)->cancel(t);
  auto r = (*tier)->take(t);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->status.ok());
  auto r2 = (*tier)->take(987654);
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->pages, 0);
}

// ---- randomised model-based test ----
// Rounds are process lifetimes (a new KvCache and KvTier each, on one store). Prompts share
// prefixes of a few documents; a small memory cache forces evictions. The model is a std::map of
// the pages the store must hold. Clean rounds must hit exactly the model's longest stored prefix;
// rounds with injected data-read/write faults in the store may hit less, never more, and every
// imported page must hold exactly the values computed for it.
float page_value(const PageHash& parent, int32_t token, int offset, int layer, int d) {
  const uint32_t h =
      (parent[0] | parent[1] << 8) ^ static_cast<uint32_t>(token * 31 + offset * 7 + layer * 13 + d);
  return static_cast<float>(static_cast<int>(h % 61) - 30) / 8;  // exact in bf16
}

// Computes (appends and writes) tokens [from, size) of `seq`; chain: parent hashes per page.
void compute_rest(KvCache& c, SeqId seq, const std::vector<int32_t>& tokens, int64_t from) {
  const int P = kFormat.page_tokens;
  std::vector<PageHash> chain;
  kv_hash_chain(c.hash_seed(), tokens, P, &chain);
  std::vector<int32_t> rest(tokens.begin() + from, tokens.end());
  CHECK_OK(c.append(seq, rest));
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> v;
    for (int64_t pos = from; pos < static_cast<int64_t>(tokens.size()); ++pos) {
      const int64_t page = pos / P;
      const PageHash& parent = page == 0 ? c.hash_seed() : chain[static_cast<size_t>(page - 1)];
      for (int d = 0; d < kFormat.d_qk(); ++d)
        v.push_back(page_value(parent, tokens[static_cast<size_t>(pos)], static_cast<int>(pos % P), l, d));
    }
    CHECK_OK(c.write(seq, l, from, v));
  }
}

void expect_values(const KvCache& c, SeqId seq, const std::vector<int32_t>& tokens, int64_t n) {
  const int P = kFormat.page_tokens;
  std::vector<PageHash> chain;
  kv_hash_chain(c.hash_seed(), tokens, P, &chain);
  std::vector<float> out(static_cast<size_t>(n * kFormat.d_qk()));
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(c.read(seq, l, 0, n, out).ok());
    for (int64_t pos = 0; pos < n; ++pos) {
      const PageHash& parent = pos / P == 0 ? c.hash_seed() : chain[static_cast<size_t>(pos / P - 1)];
      for (int d = 0; d < kFormat.d_qk(); ++d) {
        ASSERT_EQ(out[static_cast<size_t>(pos * kFormat.d_qk() + d)],
                  page_value(parent, tokens[static_cast<size_t>(pos)], static_cast<int>(pos % P), l, d))
            << "layer " << l << " pos " << pos;
      }
    }
  }
}

TEST(KvTier, RandomisedRestartsMatchAModelOfTheStore) {
  const uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  TempDir dir;
  storage::FaultInjector faults;
  storage::ServerParams sp;
  sp.targets = {storage::TargetParams{dir.path(), 64u << 20}};
  sp.listen = "127.0.0.1:0";
  sp.direct_io = false;
  sp.group_bytes = 1u << 20;
  sp.faults = &faults;
  auto store = storage::StorageServer::start(sp).value();
  auto client = storage::StorageClient::connect(storage::ClientParams{.servers = {store->address()}}).value();
  storage::KvCache kv(*client);
  const int P = kFormat.page_tokens;
  std::vector<std::vector<int32_t>> docs(4);
  for (auto& d : docs) d = random_tokens(6 * P, rng());
  std::map<PageHash, bool> model;  // pages the store must hold (after clean rounds)
  for (int round = 0; round < 8; ++round) {
    const bool faulty = round % 3 == 2;
    if (faulty) {
      faults.add_rule({.op = storage::FaultOp::kDataRead, .skip = static_cast<int>(rng() % 4), .count = 2});
      faults.add_rule({.op = storage::FaultOp::kDataWrite, .skip = static_cast<int>(rng() % 4), .count = 2});
    }
    auto cache = make_cache(12);  // 2 prompts' worth: evictions within a round
    auto tier = KvTier::create(tier_options(store->address()), cache->export_blob_bytes()).value();
    KvTierLink link(*tier, *cache);
    std::vector<PageHash> written;
    std::map<PageHash, bool> maybe;  // written in a faulty round: perhaps stored
    for (int q = 0; q < 6; ++q) {
      const auto& doc = docs[rng() % docs.size()];
      std::vector<int32_t> prompt(doc.begin(), doc.begin() + static_cast<ptrdiff_t>(1 + rng() % doc.size()));
      for (int k = 0, extra = static_cast<int>(rng() % 12); k < extra; ++k)
        prompt.push_back(static_cast<int32_t>(rng() % 50000));
      if (prompt.size() < 2) prompt.push_back(1);
      const std::span<const int32_t> prefix(prompt.data(), prompt.size() - 1);
      std::vector<PageHash> chain;
      kv_hash_chain(cache->hash_seed(), prefix, P, &chain);
      const int64_t in_memory = cache->lookup(chain);
      int64_t in_model = in_memory;
      while (in_model < static_cast<int64_t>(chain.size()) &&
             (model.contains(chain[static_cast<size_t>(in_model)]) ||
              (faulty && maybe.contains(chain[static_cast<size_t>(in_model)]))))
        ++in_model;
      KvTierSeq s;
      ASSERT_TRUE(wait_ready(link, s, prefix));
      const SeqId seq = cache->add_sequence().value();
      const int64_t attached = cache->attach_prefix(seq, prefix).value() / P;
      if (faulty) {
        EXPECT_LE(attached, std::max(in_memory, in_model)) << "round " << round << " prompt " << q;
      } else {
        EXPECT_EQ(attached, std::max(in_memory, in_model)) << "round " << round << " prompt " << q;
      }
      expect_values(*cache, seq, prompt, attached * P);
      compute_rest(*cache, seq, prompt, attached * P);
      link.attached(s, attached * P);
      link.collect(s, prompt, static_cast<int64_t>(prompt.size()));
      for (int64_t k = attached; k < static_cast<int64_t>(prompt.size()) / P; ++k)
        written.push_back(s.hashes[static_cast<size_t>(k)]);
      for (int i = 0; i < 2000 && link.has_pending(); ++i) {
        link.drain();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(tier->flush(10000));
      CHECK_OK(cache->free_sequence(seq));
      // Flushed: a clean round's pages are in the store now; a faulty round's may be.
      for (const PageHash& h : written) (faulty ? maybe : model)[h] = true;
    }
    const KvTierStats st = tier->stats();
    EXPECT_EQ(st.import_errors, 0);
    faults.clear_rules();
    if (!faulty) {
      EXPECT_EQ(st.errors, 0);
      EXPECT_EQ(st.writes_dropped, 0);
      for (const PageHash& h : written) model[h] = true;
    } else if (!written.empty()) {  // some writes failed: learn which pages did land
      const std::vector<storage::KvKey> keys(written.begin(), written.end());
      const std::vector<bool> there = kv.exists(keys).value();
      for (size_t i = 0; i < written.size(); ++i) {
        if (there[i]) model[written[i]] = true;
      }
    }
    std::printf("round %d%s: %lld written, %lld hit, %lld imported, %lld errors\n", round,
                faulty ? " (faults)" : "", static_cast<long long>(st.pages_written),
                static_cast<long long>(st.hit_pages), static_cast<long long>(st.pages_imported),
                static_cast<long long>(st.errors));
  }
}

TEST(KvTier, OptionErrorsNameTheProblem) {
  KvTierOptions o;
  for (const char* bad : {"", "localhost", "localhost:", ":9400", "host:port", "host:70000"}) {
    o.server = bad;
    auto t = KvTier::create(o, 4096);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().to_string().find("--kv-store"), std::string::npos) << t.status().to_string();
  }
  o.server = "127.0.0.1:9";
  EXPECT_FALSE(KvTier::create(o, int64_t{65} << 20).ok());
  EXPECT_TRUE(KvTier::create(o, 4096).ok());  // does not contact the store
}

}  // namespace
}  // namespace fathom
