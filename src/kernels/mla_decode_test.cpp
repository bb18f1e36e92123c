// MLA decode kernel tests in the style of FlashMLA's: random batches with variable lengths
// (0 and 1 included), shuffled block tables, every unused cache byte poisoned with NaN, causal
// s_q > 1, heads 16 and 128, out and lse compared with a float64 reference on every SIMD path this
// CPU has; the FP8 cache against BF16; odd widths; validation errors at the boundary.
// Seeds are fresh each run and printed; FATHOM_TEST_SEED=N reproduces a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/rng.h"
#include "base/thread_pool.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_decode_impl.h"
#include "tensor/convert.h"

namespace fathom {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint64_t test_seed() {
  if (const char* env = std::getenv("FATHOM_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

struct CaseSpec {
  MlaKvFormat format;
  int s_q = 1;
  int heads = 16;
  bool causal = false;
  std::vector<int32_t> seqlens;
  float softmax_scale = 0;   // 0: 1/sqrt(192), DeepSeek-V3's (qk_nope 128 + qk_rope 64)
  bool q_bf16_exact = true;  // q values representable in bf16 (as FlashMLA's inputs are)
  int extra_pages = 5;       // unused pool pages (poisoned)
};

// A random decode problem: a poisoned pool with the sequences' tokens at shuffled pages, the
// block table (unused entries hold out-of-pool garbage) and the exact token values.
struct Problem {
  CaseSpec spec;
  std::vector<uint8_t> pool;
  int64_t n_pages = 0, max_pages = 0;
  std::vector<int32_t> block_table;
  std::vector<float> q;
  std::vector<std::vector<float>> keys;  // [batch][L * D], decoded from the cache (what the kernel sees)
  std::vector<float> out, lse;

  MlaDecodeParams params() {
    MlaDecodeParams p;
    p.q = q.data();
    p.batch = static_cast<int64_t>(spec.seqlens.size());
    p.s_q = spec.s_q;
    p.heads = spec.heads;
    p.d_qk = spec.format.d_qk();
    p.cache = {pool.data(), n_pages, spec.format.page_bytes(), spec.format};
    p.block_table = block_table.data();
    p.max_pages = max_pages;
    p.cache_seqlens = spec.seqlens.data();
    p.softmax_scale = spec.softmax_scale;
    p.causal = spec.causal;
    p.out = out.data();
    p.lse = lse.data();
    return p;
  }
};

Problem make_problem(const CaseSpec& spec, uint64_t seed) {
  Problem pr;
  pr.spec = spec;
  if (pr.spec.softmax_scale == 0) pr.spec.softmax_scale = 1.0f / std::sqrt(192.0f);
  const MlaKvFormat& f = spec.format;
  const int T = f.page_tokens, D = f.d_qk();
  const int64_t batch = static_cast<int64_t>(spec.seqlens.size());
  Rng rng(seed);
  int64_t used = 0;
  for (int32_t L : spec.seqlens) {
    pr.max_pages = std::max<int64_t>(pr.max_pages, (L + T - 1) / T);
    used += (L + T - 1) / T;
  }
  pr.max_pages += 2;
  pr.n_pages = used + spec.extra_pages;
  pr.pool.assign(static_cast<size_t>(pr.n_pages * f.page_bytes()), 0xff);  // NaN in bf16, e4m3 and f32
  std::vector<int32_t> ids(static_cast<size_t>(pr.n_pages));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
  pr.block_table.assign(static_cast<size_t>(batch * pr.max_pages), std::numeric_limits<int32_t>::max());
  size_t next_id = 0;
  std::vector<float> token(static_cast<size_t>(D));
  pr.keys.resize(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t L = spec.seqlens[static_cast<size_t>(b)];
    for (int64_t j = 0; j < (L + T - 1) / T; ++j)
      pr.block_table[static_cast<size_t>(b * pr.max_pages + j)] = ids[next_id++];
    auto& keys = pr.keys[static_cast<size_t>(b)];
    keys.resize(static_cast<size_t>(L) * D);
    for (int32_t t = 0; t < L; ++t) {
      for (int d = 0; d < D; ++d) token[static_cast<size_t>(d)] = static_cast<float>(rng.normal());
      const int64_t page = pr.block_table[static_cast<size_t>(b * pr.max_pages + t / T)];
      uint8_t* slot = pr.pool.data() + page * f.page_bytes() + (t % T) * f.token_bytes();
      mla_kv_encode_token(f, token.data(), slot);
      mla_kv_decode_token(f, slot, keys.data() + static_cast<size_t>(t) * D);
    }
  }
  const int64_t rows = int64_t{spec.s_q} * spec.heads;
  pr.q.resize(static_cast<size_t>(batch * rows * D));
  for (float& x : pr.q) {
    x = static_cast<float>(rng.normal());
    if (spec.q_bf16_exact) x = bf16_to_f32(f32_to_bf16(x));
  }
  pr.out.assign(static_cast<size_t>(batch * rows * f.d_latent), std::numeric_limits<float>::quiet_NaN());
  pr.lse.assign(static_cast<size_t>(batch * rows), std::numeric_limits<float>::quiet_NaN());
  return pr;
}

// float64 attention over the exact token values: out [batch, s_q, heads, dl], lse [batch, heads, s_q].
void reference_f64(const Problem& pr, std::vector<double>* out, std::vector<double>* lse) {
  const CaseSpec& s = pr.spec;
  const int D = s.format.d_qk(), dl = s.format.d_latent;
  const int64_t batch = static_cast<int64_t>(s.seqlens.size()), rows = int64_t{s.s_q} * s.heads;
  out->assign(static_cast<size_t>(batch * rows * dl), 0.0);
  lse->assign(static_cast<size_t>(batch * rows), 0.0);
  std::vector<double> sc;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t L = s.seqlens[static_cast<size_t>(b)];
    const auto& keys = pr.keys[static_cast<size_t>(b)];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r / s.heads, h = r % s.heads;
      const int64_t visible = s.causal ? std::max<int64_t>(0, L - s.s_q + i + 1) : L;
      double& lse_out = (*lse)[static_cast<size_t>((b * s.heads + h) * s.s_q + i)];
      if (visible == 0) {
        lse_out = INFINITY;
        continue;
      }
      const float* q = pr.q.data() + (b * rows + r) * D;
      sc.assign(static_cast<size_t>(visible), 0.0);
      double mx = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * keys[static_cast<size_t>(t * D + d)];
        sc[static_cast<size_t>(t)] = dot * s.softmax_scale;
        mx = std::max(mx, sc[static_cast<size_t>(t)]);
      }
      double z = 0;
      double* o = out->data() + (b * rows + r) * dl;
      for (int64_t t = 0; t < visible; ++t) {
        const double w = std::exp(sc[static_cast<size_t>(t)] - mx);
        z += w;
        for (int c = 0; c < dl; ++c) o[c] += w * keys[static_cast<size_t>(t * D + c)];
      }
      for (int c = 0; c < dl; ++c) o[c] /= z;
      lse_out = mx + std::log(z);
    }
  }
}

struct Tolerance {
  double out_atol, out_rtol, lse_atol;
};

// Checks out and lse against the reference; returns the number of mismatches (first few printed).
int compare(const Problem& pr, const std::vector<double>& ref_out, const std::vector<double>& ref_lse,
            Tolerance tol, double* max_out_err = nullptr) {
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref_out.size(); ++i) {
    const double err = std::fabs(pr.out[i] - ref_out[i]);
    worst = std::max(worst, std::isnan(pr.out[i]) ? INFINITY : err);
    if (!(err <= tol.out_atol + tol.out_rtol * std::fabs(ref_out[i])) && bad++ < 5) {
      ADD_FAILURE() << "out[" << i << "] = " << pr.out[i] << ", reference " << ref_out[i];
    }
  }
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    const bool ok =
        std::isinf(ref_lse[i]) ? (pr.lse[i] == kInf) : std::fabs(pr.lse[i] - ref_lse[i]) <= tol.lse_atol;
    if (!ok && bad++ < 10)
      ADD_FAILURE() << "lse[" << i << "] = " << pr.lse[i] << ", reference " << ref_lse[i];
  }
  if (max_out_err) *max_out_err = worst;
  return bad;
}

// A kernel path: a SIMD level, and for AVX-512 BF16 whether the AMX tiles run (where the CPU has
// them, both: the vdpbf16ps segment and the tile segment).
struct Path {
  SimdLevel level;
  bool amx = false;
  std::string name() const { return std::string(simd_level_name(level)) + (amx ? "+amx" : ""); }
};

std::vector<Path> available_paths() {
  std::vector<Path> paths;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Bf16}) {
    if (static_cast<int>(l) <= static_cast<int>(simd_level_supported())) paths.push_back({l});
  }
  if (paths.back().level == SimdLevel::kAvx512Bf16 && amx_bf16_available()) paths.push_back({SimdLevel::kAvx512Bf16, true});
  return paths;
}

// Tolerances per path against float64 (q exact in bf16). The bf16 path rounds P to bf16
// (relative error <= 2^-9 per weight), which moves lse by at most ln(1 + 2^-9) ~ 2e-3 and an output
// by at most 2^-9 * max|v - out| (~4e-3 here); the f32 paths differ only by f32 rounding.
Tolerance tolerance_for(SimdLevel level) {
  if (level == SimdLevel::kAvx512Bf16) return {8e-3, 1e-2, 2.5e-3};
  return {2e-5, 1e-4, 2e-5};
}

struct SimdCap {
  explicit SimdCap(const Path& p) {
    set_simd_level_cap(p.level);
    set_amx_enabled(p.amx);
  }
  ~SimdCap() {
    set_simd_level_cap(SimdLevel::kAvx512Bf16);
    set_amx_enabled(true);
  }
};

// Runs the decoder on every available path (3 threads, so sequences split across parts).
void run_all_paths(const CaseSpec& spec, const char* what) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(std::string(what) + " seed " + std::to_string(seed) + " (FATHOM_TEST_SEED to repeat)");
  std::printf("[ seed     ] %s: %llu\n", what, static_cast<unsigned long long>(seed));
  Problem pr = make_problem(spec, seed);
  std::vector<double> ref_out, ref_lse;
  reference_f64(pr, &ref_out, &ref_lse);
  auto pool = ThreadPool::create(3);
  auto dec = MlaDecoder::create({.format = spec.format,
                                 .max_batch = 64,
                                 .max_rows = spec.s_q * spec.heads,
                                 .pool = pool.get(),
                                 .parts_per_thread = 2});
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  for (const Path& path : available_paths()) {
    const SimdLevel level = path.level;
    SCOPED_TRACE(std::string("path ") + path.name());
    SimdCap cap(path);
    std::fill(pr.out.begin(), pr.out.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(pr.lse.begin(), pr.lse.end(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE((*dec)->decode(pr.params()).ok());
    double worst = 0;
    EXPECT_EQ(compare(pr, ref_out, ref_lse, tolerance_for(level), &worst), 0);
    std::printf("[ max err  ] %s %s: out %.3g\n", what, path.name().c_str(), worst);
  }
  // The single-threaded reference entry point agrees too.
  std::fill(pr.out.begin(), pr.out.end(), std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(mla_decode_reference(pr.params()).ok());
  EXPECT_EQ(compare(pr, ref_out, ref_lse, tolerance_for(SimdLevel::kScalar)), 0);
}

std::vector<int32_t> random_lengths(uint64_t seed, int n, int max_len) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(max_len) + 1));
  v[0] = 0;  // an empty sequence
  if (n > 1) v[1] = 1;
  if (n > 2) v[2] = 64;  // exactly one full page
  if (n > 3) v[3] = 65;
  return v;
}

MlaKvFormat v3_format(MlaKvDType dtype) {
  return {.d_latent = 512, .d_rope = 64, .dtype = dtype, .page_tokens = 64};
}

TEST(MlaDecode, MatchesFloat64ReferenceWith16HeadsBf16Cache) {
  run_all_paths(
      {.format = v3_format(MlaKvDType::kBF16), .heads = 16, .seqlens = random_lengths(test_seed(), 8, 400)},
      "h16 bf16");
}

TEST(MlaDecode, MatchesFloat64ReferenceWith16HeadsFp8Cache) {
  run_all_paths(
      {.format = v3_format(MlaKvDType::kFP8), .heads = 16, .seqlens = random_lengths(test_seed(), 8, 400)},
      "h16 fp8");
}

TEST(MlaDecode, MatchesFloat64ReferenceWith128HeadsBf16Cache) {
  run_all_paths(
      {.format = v3_format(MlaKvDType::kBF16), .heads = 128, .seqlens = random_lengths(test_seed(), 5, 200)},
      "h128 bf16");
}

TEST(MlaDecode, MatchesFloat64ReferenceWith128HeadsFp8Cache) {
  run_all_paths(
      {.format = v3_format(MlaKvDType::kFP8), .heads = 128, .seqlens = random_lengths(test_seed(), 5, 200)},
      "h128 fp8");
}

TEST(MlaDecode, CausalMultiTokenQueriesAlignToTheEnd) {
  // Lengths below s_q leave early query rows with no visible key: out 0, lse +inf.
  for (int s_q : {2, 3, 4}) {
    run_all_paths({.format = v3_format(MlaKvDType::kBF16),
                   .s_q = s_q,
                   .heads = 16,
                   .causal = true,
                   .seqlens = {1, 2, 0, 63, 64, 65, 130, 200}},
                  ("causal s_q=" + std::to_string(s_q)).c_str());
  }
  run_all_paths({.format = v3_format(MlaKvDType::kFP8),
                 .s_q = 2,
                 .heads = 128,
                 .causal = true,
                 .seqlens = {1, 129, 64}},
                "causal fp8 h128");
}

TEST(MlaDecode, NonCausalMultiTokenQueriesSeeTheWholeSequence) {
  run_all_paths(
      {.format = v3_format(MlaKvDType::kBF16), .s_q = 2, .heads = 16, .causal = false, .seqlens = {1, 70, 0}},
      "non-causal s_q=2");
}

TEST(MlaDecode, OddWidthsOfTheTinyPresetAndSmallPages) {
  run_all_paths({.format = {.d_latent = 64, .d_rope = 32, .dtype = MlaKvDType::kBF16, .page_tokens = 64},
                 .heads = 4,
                 .seqlens = random_lengths(test_seed(), 6, 300)},
                "tiny 64+32 bf16");
  run_all_paths({.format = {.d_latent = 64, .d_rope = 32, .dtype = MlaKvDType::kFP8, .page_tokens = 64},
                 .heads = 4,
                 .seqlens = random_lengths(test_seed(), 6, 300)},
                "tiny 64+32 fp8");
  // 48 columns (an odd number of 16-wide vectors), rope 6, 16-token pages, 5 heads (row padding).
  run_all_paths({.format = {.d_latent = 48, .d_rope = 6, .dtype = MlaKvDType::kBF16, .page_tokens = 16},
                 .s_q = 3,
                 .heads = 5,
                 .causal = true,
                 .seqlens = random_lengths(test_seed(), 7, 90)},
                "48+6 page 16 causal");
  run_all_paths({.format = {.d_latent = 144, .d_rope = 2, .dtype = MlaKvDType::kFP8, .page_tokens = 2},
                 .heads = 3,
                 .seqlens = random_lengths(test_seed(), 5, 40)},
                "144+2 fp8 page 2");
}

// The AMX path runs QK page by page but softmax and PV once per group of consecutive pages up to
// 128 tokens: four 32-token pages, two 64-token pages (the tests above), or one page of 96, 128
// or 256 tokens. Lengths end mid-group, on a group boundary and mid-page, with causal rows whose
// last visible key is before the sequence's end. 32 rows are two row blocks; 48 rows (three) and
// lengths of 33 or 129 tokens leave QK's 2 x 2 tile blocks without their second row or token block.
TEST(MlaDecode, PageGroupsCoverEveryPageSizeTheTilesTake) {
  for (int page_tokens : {32, 96, 128, 256}) {
    for (MlaKvDType dtype : {MlaKvDType::kBF16, MlaKvDType::kFP8}) {
      for (int heads : {16, 24}) {
        const std::string what = "page " + std::to_string(page_tokens) + " " +
                                 std::string(mla_kv_dtype_name(dtype)) + " rows " + std::to_string(2 * heads);
        run_all_paths({.format = {.d_latent = 512, .d_rope = 64, .dtype = dtype, .page_tokens = page_tokens},
                       .s_q = 2,
                       .heads = heads,
                       .causal = true,
                       .seqlens = {0, 1, 31, 32, 33, 127, 128, 129, 300, 513}},
                      what.c_str());
      }
    }
  }
}

TEST(MlaDecode, FullPrecisionQueryStaysWithinBf16Tolerance) {
  // q not representable in bf16: the BF16 path rounds it, so scores move by ~|q||k| 2^-9.
  CaseSpec spec{
      .format = v3_format(MlaKvDType::kBF16), .heads = 16, .seqlens = {300, 5}, .q_bf16_exact = false};
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Problem pr = make_problem(spec, seed);
  std::vector<double> ref_out, ref_lse;
  reference_f64(pr, &ref_out, &ref_lse);
  auto dec = MlaDecoder::create({.format = spec.format, .max_batch = 4, .max_rows = 16});
  ASSERT_TRUE(dec.ok());
  for (const Path& path : available_paths()) {
    const SimdLevel level = path.level;
    SimdCap cap(path);
    ASSERT_TRUE((*dec)->decode(pr.params()).ok());
    const Tolerance tol =
        level == SimdLevel::kAvx512Bf16 ? Tolerance{2e-2, 2e-2, 2e-2} : tolerance_for(level);
    EXPECT_EQ(compare(pr, ref_out, ref_lse, tol), 0) << path.name();
  }
}

TEST(MlaDecode, EmptySequencesGiveZeroOutputAndInfiniteLse) {
  CaseSpec spec{
      .format = v3_format(MlaKvDType::kFP8), .s_q = 2, .heads = 16, .causal = true, .seqlens = {0, 0, 0}};
  Problem pr = make_problem(spec, test_seed());
  auto dec = MlaDecoder::create({.format = spec.format, .max_batch = 4, .max_rows = 32});
  ASSERT_TRUE(dec.ok());
  for (const Path& path : available_paths()) {
    SimdCap cap(path);
    std::fill(pr.out.begin(), pr.out.end(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE((*dec)->decode(pr.params()).ok());
    for (float x : pr.out) ASSERT_EQ(x, 0.0f);
    for (float x : pr.lse) ASSERT_EQ(x, kInf);
  }
}

// With one cached token the softmax weight is exactly 1, so out must equal the stored latent
// bit for bit: every e4m3 code (but NaN) under power-of-two scales from tiny to large is decoded
// exactly by every path. A scale that is not a power of two (not written by the cache, but a page
// could be imported) is exact on the f32 paths and rounded to bf16 on the BF16 path.
TEST(MlaDecode, SingleTokenOutputIsTheStoredLatentExactly) {
  const MlaKvFormat f = v3_format(MlaKvDType::kFP8);
  const float scales[][4] = {{1.0f, 0x1p-20f, 0x1p40f, 0x1p-90f}, {0.37f, 1.0f, 3.0e5f, 0x1p-3f}};
  for (const auto& sc : scales) {
    std::vector<uint8_t> pool(static_cast<size_t>(f.page_bytes()), 0xff);
    for (int i = 0; i < f.d_latent; ++i) {
      uint8_t code = static_cast<uint8_t>(i % 256);
      if ((code & 0x7f) == 0x7f) code ^= 1;  // no NaN codes
      pool[static_cast<size_t>(i)] = code;
    }
    std::memcpy(pool.data() + f.scales_offset(), sc, sizeof(sc));
    for (int i = 0; i < f.d_rope; ++i) {
      const uint16_t h = f32_to_bf16(static_cast<float>(i) - 20.5f);
      std::memcpy(pool.data() + f.rope_offset() + 2 * i, &h, 2);
    }
    std::vector<float> want(static_cast<size_t>(f.d_qk()));
    mla_kv_decode_token(f, pool.data(), want.data());
    std::vector<float> q(static_cast<size_t>(2 * f.d_qk()), 0.01f), out(static_cast<size_t>(2 * f.d_latent)), lse(2);
    const int32_t table[] = {0}, lens[] = {1};
    MlaDecodeParams p{.q = q.data(), .batch = 1, .s_q = 1, .heads = 2, .d_qk = f.d_qk(),
                      .cache = {pool.data(), 1, f.page_bytes(), f}, .block_table = table, .max_pages = 1,
                      .cache_seqlens = lens, .softmax_scale = 0.1f, .out = out.data(), .lse = lse.data()};
    auto dec = MlaDecoder::create({.format = f, .max_batch = 1, .max_rows = 2});
    ASSERT_TRUE(dec.ok());
    const bool pow2 = sc[0] == 1.0f;
    for (const Path& path : available_paths()) {
      const SimdLevel level = path.level;
      SimdCap cap(path);
      ASSERT_TRUE((*dec)->decode(p).ok());
      for (int h = 0; h < 2; ++h) {
        for (int c = 0; c < f.d_latent; ++c) {
          float expect = want[static_cast<size_t>(c)];
          if (!pow2 && level == SimdLevel::kAvx512Bf16) expect = bf16_to_f32(f32_to_bf16(expect));
          ASSERT_EQ(out[static_cast<size_t>(h * f.d_latent + c)], expect)
              << path.name() << " column " << c << " code " << int{pool[static_cast<size_t>(c)]};
        }
      }
    }
  }
}

// Full fp8 pages are decoded exactly too, with the latent converted inside the QK tiles (several
// tokens at once, the out-of-line exact form where a chunk holds zero or a subnormal) and the RoPE
// part read from the page. Each token holds every e4m3 code (rotated per token) under its own
// power-of-two group scales. Row h selects one token through the RoPE part alone: q's RoPE is
// 512 on dimension h % d_rope, the selected token's RoPE is 1 there and 0 elsewhere, the latent query is
// 0, so the softmax puts weight exactly 1 on that token and exactly 0 on the rest, and out[h] must
// be the token's stored latent bit for bit. A second sequence has one group scale that is not a
// power of two, which sends its page down the other conversion (rounded to bf16 on that path).
void check_fp8_pages_exact(const MlaKvFormat& f) {
  SCOPED_TRACE("d_latent " + std::to_string(f.d_latent) + " d_rope " + std::to_string(f.d_rope));
  const int D = f.d_qk(), dl = f.d_latent;
  const int32_t lens[] = {101, 70};  // two pages each: a full one and a partial one (odd or even)
  const int pages_per_seq = 2, n_pages = 4;
  std::vector<uint8_t> pool(static_cast<size_t>(n_pages * f.page_bytes()), 0xff);
  const int32_t table[] = {2, 0, 3, 1};
  auto slot = [&](int b, int t) {
    return pool.data() + table[b * pages_per_seq + t / f.page_tokens] * f.page_bytes() +
           (t % f.page_tokens) * f.token_bytes();
  };
  // The latent and scales once: every e4m3 code in every token, rotated; power-of-two group scales
  // but one, which sends sequence 1's first page down the other conversion.
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < lens[b]; ++t) {
      uint8_t* tok = slot(b, t);
      for (int i = 0; i < dl; ++i) {
        uint8_t code = static_cast<uint8_t>((i + 37 * t) % 256);
        if ((code & 0x7f) == 0x7f) code ^= 1;  // no NaN codes
        tok[i] = code;
      }
      for (int g = 0; g < f.n_scale_groups(); ++g) {
        float scale = std::ldexp(1.0f, (t * 4 + g) % 41 - 20);
        if (b == 1 && t == 5 && g == 2) scale = 0.37f;
        std::memcpy(tok + f.scales_offset() + 4 * g, &scale, 4);
      }
    }
  }
  // 16 rows: the quad tiles; 64: one column of row-block tiles; 128: a second column, which reads
  // what the first converted. Row h selects through RoPE dimension h % d_rope.
  for (const int heads : {16, 64, 128}) {
    auto dec = MlaDecoder::create({.format = f, .max_batch = 2, .max_rows = heads});
    ASSERT_TRUE(dec.ok());
    std::vector<float> q(static_cast<size_t>(2 * heads * D), 0.0f);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < heads; ++h)
        q[static_cast<size_t>((b * heads + h) * D + dl + h % f.d_rope)] = 512.0f;
    std::vector<float> out(static_cast<size_t>(2 * heads * dl)), lse(static_cast<size_t>(2 * heads));
    const MlaDecodeParams p{.q = q.data(),
                            .batch = 2,
                            .s_q = 1,
                            .heads = heads,
                            .d_qk = D,
                            .cache = {pool.data(), n_pages, f.page_bytes(), f},
                            .block_table = table,
                            .max_pages = pages_per_seq,
                            .cache_seqlens = lens,
                            .softmax_scale = 1.0f,
                            .out = out.data(),
                            .lse = lse.data()};
    for (int round = 0; round < 7; ++round) {
      // Row h of sequence b selects token sel(b, h % d_rope): that token's RoPE is 1 on the dimension.
      auto sel = [&](int b, int h) { return (h * 7 + round * 5 + b) % lens[b]; };
      for (int b = 0; b < 2; ++b) {
        for (int t = 0; t < lens[b]; ++t) {
          for (int j = 0; j < f.d_rope; ++j) {
            const uint16_t h = f32_to_bf16(j < std::min(heads, f.d_rope) && sel(b, j) == t ? 1.0f : 0.0f);
            std::memcpy(slot(b, t) + f.rope_offset() + 2 * j, &h, 2);
          }
        }
      }
      for (const Path& path : available_paths()) {
        SimdCap cap(path);
        std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
        ASSERT_TRUE((*dec)->decode(p).ok());
        for (int b = 0; b < 2; ++b) {
          for (int h = 0; h < heads; ++h) {
            const int t = sel(b, h % f.d_rope);
            std::vector<float> want(static_cast<size_t>(D));
            mla_kv_decode_token(f, slot(b, t), want.data());
            for (int c = 0; c < dl; ++c) {
              float expect = want[static_cast<size_t>(c)];
              if (b == 1 && t == 5 && c / kMlaFp8GroupSize == 2 && path.level == SimdLevel::kAvx512Bf16)
                expect = bf16_to_f32(f32_to_bf16(expect));
              ASSERT_EQ(out[static_cast<size_t>((b * heads + h) * dl + c)], expect)
                  << path.name() << " heads " << heads << " round " << round << " sequence " << b << " row "
                  << h << " token " << t << " column " << c;
            }
            EXPECT_NEAR(lse[static_cast<size_t>(b * heads + h)], 512.0f, 1e-3f) << path.name();
          }
        }
      }
    }
  }
}

TEST(MlaDecode, Fp8FullPagesAreDecodedExactly) {
  check_fp8_pages_exact(v3_format(MlaKvDType::kFP8));
  // the tiny preset's widths: one scale group, 64 latent values (two chunks)
  check_fp8_pages_exact({.d_latent = 64, .d_rope = 32, .dtype = MlaKvDType::kFP8, .page_tokens = 64});
}

TEST(MlaDecode, Fp8CacheStaysWithinToleranceOfBf16) {
  // The same tokens through an FP8 and a BF16 cache (latents and queries N(0, 1), scale
  // 1/sqrt(192)). The worst case is bounded per output row from the two caches' decoded values:
  // with d = max_t |l_t - l'_t| over the row's logits and e_c = max_t |k_tc - k'_tc| per column,
  // softmax weights move by at most p_t (e^{2d} - 1), so
  //   |out_c - out'_c| <= e_c + (e^{2d} - 1) * sum_t p_t |k_tc - out_c|  and  |lse - lse'| <= d,
  // plus each kernel's own tolerance against float64 (tolerance_for). On average attention
  // averages e4m3's rounding (<= 2^-4 relative per value) down: RMS difference below 0.03 for out
  // and 0.06 for lse.
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (FATHOM_TEST_SEED to repeat)");
  const std::vector<int32_t> lens = random_lengths(seed, 6, 500);
  CaseSpec bf{.format = v3_format(MlaKvDType::kBF16), .heads = 16, .seqlens = lens};
  CaseSpec f8 = bf;
  f8.format.dtype = MlaKvDType::kFP8;
  Problem a = make_problem(bf, seed), b = make_problem(f8, seed);  // same seed: same tokens and q
  auto da = MlaDecoder::create({.format = bf.format, .max_batch = 8, .max_rows = 16});
  auto db = MlaDecoder::create({.format = f8.format, .max_batch = 8, .max_rows = 16});
  ASSERT_TRUE(da.ok() && db.ok());
  ASSERT_TRUE((*da)->decode(a.params()).ok());
  ASSERT_TRUE((*db)->decode(b.params()).ok());
  const Tolerance kt = tolerance_for(simd_level_supported());
  const int D = bf.format.d_qk(), dl = bf.format.d_latent;
  const double scale = a.spec.softmax_scale;
  double sq = 0, worst = 0, worst_share = 0, lse_sq = 0;
  int64_t lse_n = 0;
  std::vector<double> la, lb, p;
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t L = lens[s];
    const auto &ka = a.keys[s], &kb = b.keys[s];
    for (int h = 0; h < bf.heads; ++h) {
      const size_t row = s * static_cast<size_t>(bf.heads) + static_cast<size_t>(h);
      const float* oa = a.out.data() + row * static_cast<size_t>(dl);
      const float* ob = b.out.data() + row * static_cast<size_t>(dl);
      if (L == 0) {
        ASSERT_EQ(a.lse[row], kInf);
        ASSERT_EQ(b.lse[row], kInf);
        continue;
      }
      const float* q = a.q.data() + row * static_cast<size_t>(D);
      la.assign(static_cast<size_t>(L), 0.0);
      lb.assign(static_cast<size_t>(L), 0.0);
      double d = 0, mx = -INFINITY;
      for (int64_t t = 0; t < L; ++t) {
        double x = 0, y = 0;
        for (int c = 0; c < D; ++c) {
          x += static_cast<double>(q[c]) * ka[static_cast<size_t>(t * D + c)];
          y += static_cast<double>(q[c]) * kb[static_cast<size_t>(t * D + c)];
        }
        la[static_cast<size_t>(t)] = x * scale;
        lb[static_cast<size_t>(t)] = y * scale;
        d = std::max(d, std::fabs(x - y) * scale);
        mx = std::max(mx, x * scale);
      }
      p.assign(static_cast<size_t>(L), 0.0);
      double z = 0;
      for (int64_t t = 0; t < L; ++t)
        z += p[static_cast<size_t>(t)] = std::exp(la[static_cast<size_t>(t)] - mx);
      for (double& w : p) w /= z;
      const double grow = std::expm1(2 * d);
      for (int c = 0; c < dl; ++c) {
        double e = 0, spread = 0;
        for (int64_t t = 0; t < L; ++t) {
          const double x = ka[static_cast<size_t>(t * D + c)];
          e = std::max(e, std::fabs(x - kb[static_cast<size_t>(t * D + c)]));
          spread += p[static_cast<size_t>(t)] * std::fabs(x - oa[c]);
        }
        const double diff = std::fabs(static_cast<double>(oa[c]) - ob[c]);
        const double bound = e + grow * spread + 2 * (kt.out_atol + kt.out_rtol * (std::fabs(oa[c]) + e));
        ASSERT_LE(diff, bound) << "sequence " << s << " head " << h << " column " << c;
        sq += diff * diff;
        worst = std::max(worst, diff);
        worst_share = std::max(worst_share, diff / bound);
      }
      ASSERT_LE(std::fabs(a.lse[row] - b.lse[row]), d + 2 * kt.lse_atol) << "sequence " << s << " head " << h;
      lse_sq += (a.lse[row] - b.lse[row]) * (a.lse[row] - b.lse[row]);
      ++lse_n;
    }
  }
  const double rms = std::sqrt(sq / static_cast<double>(a.out.size()));
  const double lse_rms = std::sqrt(lse_sq / static_cast<double>(std::max<int64_t>(lse_n, 1)));
  std::printf("[ fp8-bf16 ] out max |diff| %.4f (%.2f of its bound), rms %.5f; lse rms %.5f\n", worst,
              worst_share, rms, lse_rms);
  EXPECT_LT(lse_rms, 0.06);
  EXPECT_LT(rms, 0.03);
}

}  // namespace
}  // namespace fathom
