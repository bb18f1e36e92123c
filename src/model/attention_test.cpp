// Prefill attention kernels against a float64 reference: random shapes, query and key offsets
// that leave some rows without visible keys in a block, several key blocks folded one after
// another, and the AVX-512 path against the scalar one; and a row independent of its call.
#include "model/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/rng.h"
#include "base/thread_pool.h"

namespace fathom {
namespace {

// A fresh seed per test, printed so that a failure can be replayed.
uint64_t printed_seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

struct Case {
  int heads, d_nope, d_rope, d_v;
  int64_t n_q, q_pos0, n_keys, key_block;
};

struct Inputs {
  std::vector<float> q, k_nope, k_pe, v;  // keys for all n_keys positions
};

Inputs random_inputs(Rng& rng, const Case& c) {
  Inputs in;
  const int dq = c.d_nope + c.d_rope;
  auto fill = [&](std::vector<float>& x, size_t n, double scale) {
    x.resize(n);
    for (auto& v : x) v = static_cast<float>(rng.normal() * scale);
  };
  fill(in.q, static_cast<size_t>(c.n_q * c.heads * dq), 1.0);
  fill(in.k_nope, static_cast<size_t>(c.n_keys * c.heads * c.d_nope), 1.0);
  fill(in.k_pe, static_cast<size_t>(c.n_keys * (c.d_rope + 3)), 1.0);  // stride d_rope + 3
  fill(in.v, static_cast<size_t>(c.n_keys * c.heads * c.d_v), 1.0);
  return in;
}

// out [n_q, heads, d_v] in float64: causal softmax over keys at positions <= the query's.
std::vector<double> reference(const Case& c, const Inputs& in, float scale) {
  const int dq = c.d_nope + c.d_rope;
  std::vector<double> out(static_cast<size_t>(c.n_q * c.heads * c.d_v), 0.0);
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int h = 0; h < c.heads; ++h) {
      const int64_t visible = std::min(c.n_keys, c.q_pos0 + i + 1);
      std::vector<double> s(static_cast<size_t>(std::max<int64_t>(visible, 0)));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int d = 0; d < c.d_nope; ++d)
          dot += double{in.q[static_cast<size_t>((i * c.heads + h) * dq + d)]} *
                 in.k_nope[static_cast<size_t>((j * c.heads + h) * c.d_nope + d)];
        for (int d = 0; d < c.d_rope; ++d)
          dot += double{in.q[static_cast<size_t>((i * c.heads + h) * dq + c.d_nope + d)]} *
                 in.k_pe[static_cast<size_t>(j * (c.d_rope + 3) + d)];
        s[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double l = 0;
      for (int64_t j = 0; j < visible; ++j) l += std::exp(s[static_cast<size_t>(j)] - mx);
      for (int64_t j = 0; j < visible; ++j) {
        const double w = std::exp(s[static_cast<size_t>(j)] - mx) / l;
        for (int d = 0; d < c.d_v; ++d)
          out[static_cast<size_t>((i * c.heads + h) * c.d_v + d)] +=
              w * in.v[static_cast<size_t>((j * c.heads + h) * c.d_v + d)];
      }
    }
  return out;
}

// Folds the keys in blocks of key_block through prefill_attention_block.
std::vector<float> run(const Case& c, const Inputs& in, float scale, bool bf16_operands = false) {
  std::vector<float> m(static_cast<size_t>(c.n_q * c.heads)), l(m.size()),
      acc(static_cast<size_t>(c.n_q * c.heads * c.d_v)), out(acc.size());
  attention_state_init(c.n_q, c.heads, c.d_v, m.data(), l.data(), acc.data());
  for (int64_t k0 = 0; k0 < c.n_keys; k0 += c.key_block) {
    PrefillAttentionParams p;
    p.n_q = c.n_q;
    p.q_pos0 = c.q_pos0;
    p.heads = c.heads, p.d_nope = c.d_nope, p.d_rope = c.d_rope, p.d_v = c.d_v;
    p.q = in.q.data();
    p.k0 = k0;
    p.n_k = std::min(c.key_block, c.n_keys - k0);
    p.k_nope = in.k_nope.data() + k0 * c.heads * c.d_nope;
    p.k_pe = in.k_pe.data() + k0 * (c.d_rope + 3);
    p.k_pe_stride = c.d_rope + 3;
    p.v = in.v.data() + k0 * c.heads * c.d_v;
    p.scale = scale;
    p.bf16_operands = bf16_operands;
    p.m = m.data(), p.l = l.data(), p.acc = acc.data();
    prefill_attention_block(p, default_pool());
  }
  attention_state_finish(c.n_q, c.heads, c.d_v, l.data(), acc.data(), out.data());
  return out;
}

double max_rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, mag = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  return err / mag;
}

// Fixed shapes, `extra`, then 12 random ones: heads, widths (d_v a multiple of 16, the rope part
// possibly empty), rows, a cached prefix and the key block size.
std::vector<Case> shapes(Rng& rng, const Case& extra) {
  std::vector<Case> cases = {
      {4, 128, 64, 128, 70, 0, 70, 1024},    // V2-Lite head shape, one key block, a row tail
      {2, 128, 64, 128, 33, 40, 73, 32},     // a cached prefix, blocks smaller than the rows
      {3, 16, 16, 48, 5, 0, 5, 1024},        // the tiny shapes, d_v not a multiple of 32 or 64
      {1, 32, 0, 16, 17, 100, 117, 50},      // no rope part
      {2, 64, 32, 64, 1, 200, 201, 64},      // one query row at the end of a long context
      {8, 32, 32, 32, 362, 512, 874, 1024},  // the tiny preset, a second prefill chunk
      extra,
  };
  for (int r = 0; r < 12; ++r) {
    Case c;
    c.heads = 1 + static_cast<int>(rng.below(4));
    c.d_nope = 16 * (1 + static_cast<int>(rng.below(8)));
    c.d_rope = 8 * static_cast<int>(rng.below(9));
    c.d_v = 16 * (1 + static_cast<int>(rng.below(8)));
    c.n_q = 1 + static_cast<int64_t>(rng.below(100));
    c.q_pos0 = static_cast<int64_t>(rng.below(150));
    c.n_keys = c.q_pos0 + c.n_q;
    c.key_block = 1 + static_cast<int64_t>(rng.below(200));
    cases.push_back(c);
  }
  return cases;
}

TEST(PrefillAttention, EveryPathMatchesTheFloat64Reference) {
  Rng rng(printed_seed());
  const SimdLevel native = simd_level_supported();
  std::vector<Case> cases = shapes(rng, Case{8, 32, 32, 32, 42, 832, 874, 1024});  // + after a cached prefix
  for (const Case& c : cases) {
    const Inputs in = random_inputs(rng, c);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d_nope + c.d_rope));
    const std::vector<double> want = reference(c, in, scale);
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx512}) {
      if (level > native) continue;
      set_simd_level_cap(level);
      const double err = max_rel_err(run(c, in, scale), want);
      EXPECT_LT(err, 2e-5) << "simd " << simd_level_name(level) << " heads " << c.heads << " d_nope "
                           << c.d_nope << " d_rope " << c.d_rope << " d_v " << c.d_v << " n_q " << c.n_q
                           << " q_pos0 " << c.q_pos0 << " key_block " << c.key_block;
    }
    set_simd_level_cap(native);
  }
}

// A row's output does not depend on the other rows of the call: a prompt whose prefix is cached
// prefills only its suffix, and attention must not be what makes it differ from a whole prefill
// (the first case is the tiny preset's 874-token prompt with 832 tokens cached). Bit for bit, on
// the f32 paths and, where the CPU has AMX, on the tiles (bf16 operands).
TEST(PrefillAttention, ARowsResultDoesNotDependOnTheOtherRowsOfTheCall) {
  Rng rng(printed_seed());
  for (int rep = 0; rep < 20; ++rep) {
    Case c;
    c.heads = 1 + static_cast<int>(rng.below(3));
    c.d_nope = 32;
    c.d_rope = 16;
    c.d_v = 32 + 16 * static_cast<int>(rng.below(2));
    c.n_q = 2 + static_cast<int64_t>(rng.below(150));
    c.q_pos0 = 0;
    c.n_keys = c.n_q;
    c.key_block = 1 + static_cast<int64_t>(rng.below(300));
    if (rep == 0) c = Case{8, 32, 32, 32, 874, 0, 874, 1024};
    const Inputs in = random_inputs(rng, c);
    const float scale = 0.125f;
    // The same keys, but only the queries from `skip` on (a cached prefix of `skip` tokens).
    int64_t skip = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(c.n_q - 1)));
    if (rep == 0) skip = 832;
    Case s = c;
    s.n_q = c.n_q - skip;
    s.q_pos0 = skip;
    Inputs sin = in;
    const int dq = c.d_nope + c.d_rope;
    sin.q.assign(in.q.begin() + skip * c.heads * dq, in.q.end());
    for (bool bf16 : {false, true}) {
      if (bf16 && !amx_bf16_usable()) continue;
      const std::vector<float> all = run(c, in, scale, bf16);
      const std::vector<float> part = run(s, sin, scale, bf16);
      for (size_t i = 0; i < part.size(); ++i)
        ASSERT_EQ(part[i], all[static_cast<size_t>(skip * c.heads * c.d_v) + i])
            << "bf16 " << bf16 << " n_q " << c.n_q << " skip " << skip << " key_block " << c.key_block
            << " element " << i;
    }
  }
}

// With bf16 operands allowed, CPUs with AMX run both products on tiles with Q, K, V and P rounded
// to bf16: the error against the float64 reference is then that rounding's (bf16 keeps 8 bits,
// so ~2^-9 per operand; 1e-2 of the largest output). Also checked: the f32 paths are unchanged
// by the flag where AMX is off, and rows past a block's last visible key, key blocks shorter
// than a tile, odd numbers of 16-key and 16-column tiles and widths that are not multiples of 32.
TEST(PrefillAttention, AmxTilesMatchTheFloat64ReferenceWithinBf16Rounding) {
  if (!amx_bf16_usable()) GTEST_SKIP() << "no AMX BF16 in this process";
  Rng rng(printed_seed());
  // + V2-Lite's 16 heads, a 512-token chunk after 512 (too slow for the scalar path)
  std::vector<Case> cases = shapes(rng, Case{16, 128, 64, 128, 512, 512, 1024, 1024});
  for (const Case& c : cases) {
    const Inputs in = random_inputs(rng, c);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d_nope + c.d_rope));
    const std::vector<double> want = reference(c, in, scale);
    const double err = max_rel_err(run(c, in, scale, true), want);
    EXPECT_LT(err, 1e-2) << "heads " << c.heads << " d_nope " << c.d_nope << " d_rope " << c.d_rope << " d_v "
                         << c.d_v << " n_q " << c.n_q << " q_pos0 " << c.q_pos0 << " key_block "
                         << c.key_block;
    EXPECT_GT(err, 1e-6) << "the tiles' bf16 rounding should show (the f32 path ran?)";
    set_amx_enabled(false);  // without AMX the flag changes nothing: the f32 paths' accuracy
    EXPECT_LT(max_rel_err(run(c, in, scale, true), want), 2e-5);
    set_amx_enabled(true);
  }
}

}  // namespace
}  // namespace fathom
