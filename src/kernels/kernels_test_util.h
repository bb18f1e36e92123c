// Helpers for the kernels' unit tests (included by *_test.cpp only): a printed, overridable seed
// (FATHOM_TEST_SEED), random weights in every dtype, and a guard that caps the SIMD level.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/cpu.h"
#include "base/rng.h"
#include "kernels/matmul.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace fathom::testing {

// A fresh seed per test unless FATHOM_TEST_SEED is set; printed so a failure can be replayed.
inline uint64_t test_seed() {
  uint64_t seed = 0;
  if (const char* env = std::getenv("FATHOM_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 0);
  } else {
    seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[ seed ] %s.%s FATHOM_TEST_SEED=%llu\n", info ? info->test_suite_name() : "?",
              info ? info->name() : "?", static_cast<unsigned long long>(seed));
  return seed;
}

// Every SIMD level this CPU supports, lowest first.
inline std::vector<SimdLevel> supported_levels() {
  std::vector<SimdLevel> out;
  for (int l = 0; l <= static_cast<int>(simd_level_supported()); ++l)
    out.push_back(static_cast<SimdLevel>(l));
  return out;
}

class SimdCap {
 public:
  explicit SimdCap(SimdLevel level) { set_simd_level_cap(level); }
  ~SimdCap() { set_simd_level_cap(SimdLevel::kAvx512Bf16); }
  SimdCap(const SimdCap&) = delete;
  SimdCap& operator=(const SimdCap&) = delete;
};

inline std::vector<float> random_floats(Rng& rng, int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal()) * scale;
  return v;
}

// A weight with its storage.
struct TestWeight {
  Buffer data;
  std::vector<float> scale;
  WeightView view;
};

// Random [rows, cols] weight in `dtype`. raw_bits: fill with uniformly random bit patterns (finite
// for floats; every int8 value incl. -128 for q8_0) instead of quantising Gaussian values.
inline TestWeight random_weight(Rng& rng, DType dtype, int64_t rows, int64_t cols, bool raw_bits = false) {
  TestWeight t;
  const uint64_t bytes = dtype_bytes(dtype, static_cast<uint64_t>(rows * cols));
  t.data = Buffer::allocate(bytes);
  std::vector<float> f = random_floats(rng, rows * cols, 0.5f);
  if (dtype == DType::kF8E4M3) {
    const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    t.scale.resize(static_cast<size_t>(br * bc));
    quantize_fp8_blocks(f.data(), rows, cols, t.data.data(), t.scale.data());
    if (raw_bits) {
      for (uint64_t i = 0; i < bytes; ++i) {
        uint8_t b = static_cast<uint8_t>(rng.below(256));
        if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);  // no NaN
        t.data.data()[i] = b;
      }
      for (auto& s : t.scale)
        s = static_cast<float>(std::ldexp(0.5 + rng.uniform(), static_cast<int>(rng.below(9)) - 8));
    }
  } else if (raw_bits && dtype == DType::kQ8_0) {
    CHECK_OK(from_f32(dtype, f.data(), t.data.data(), rows * cols));
    auto* b = t.data.as<BlockQ8_0>();
    for (int64_t i = 0; i < rows * cols / 32; ++i)
      for (auto& q : b[i].qs) q = static_cast<int8_t>(static_cast<int>(rng.below(256)) - 128);
  } else {
    CHECK_OK(from_f32(dtype, f.data(), t.data.data(), rows * cols));
  }
  t.view = WeightView{dtype, rows, cols, t.data.data(), t.scale.empty() ? nullptr : t.scale.data()};
  return t;
}

// sum_c |x[c] * W[r, c]| for every (i, r): the scale of a dot product's rounding error.
inline std::vector<double> abs_dot(const WeightView& w, const float* x, int64_t m) {
  std::vector<double> out(static_cast<size_t>(m * w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_weight_row(w, r, row.data());
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c)
        s += std::fabs(static_cast<double>(x[i * w.cols + c]) * row[static_cast<size_t>(c)]);
      out[static_cast<size_t>(i * w.rows + r)] = s;
    }
  }
  return out;
}

}  // namespace fathom::testing
