// Internals of ops.cpp: the per-ISA row kernels (fp32 everywhere). Not a public header.
#pragma once

#include <cstdint>

namespace fathom::ops_internal {

// y[:n] = x[:n] * (1 / sqrt(mean(x^2) + eps)) * w[:n] (w may be nullptr)
void rms_norm_row_scalar(const float* x, const float* w, float* y, int64_t n, float eps);
void rms_norm_row_avx2(const float* x, const float* w, float* y, int64_t n, float eps);
void rms_norm_row_avx512(const float* x, const float* w, float* y, int64_t n, float eps);

// y[:n] = scale * softmax(x[:n]) (y may equal x); returns max + log(sum of exp(x - max)), -inf
// (and y all zero) for a row of -inf. The SIMD paths sum in fp32 lanes over blocks of kSumBlock
// values and add the blocks' sums in double, so a 129280-entry row rounds like a short one.
constexpr int64_t kSumBlock = 1024;
double softmax_row_scalar(const float* x, float* y, int64_t n, float scale);
double softmax_row_avx2(const float* x, float* y, int64_t n, float scale);
double softmax_row_avx512(const float* x, float* y, int64_t n, float scale);

void silu_mul_scalar(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);
void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n);

// argmax (ops.h) in two passes: the largest non-NaN value (-inf if none), then the first index
// holding it (0 if none).
int64_t argmax_scalar(const float* x, int64_t n);
int64_t argmax_avx2(const float* x, int64_t n);
int64_t argmax_avx512(const float* x, int64_t n);

void exp_scalar(const float* x, float* out, int64_t n);
void exp_avx2(const float* x, float* out, int64_t n);
void exp_avx512(const float* x, float* out, int64_t n);

// The SIMD exp: exp(x) = 2^n * p(r), n = round(x log2 e), r = x - n ln2 (two-step), p the
// Cephes expf polynomial (about 1 ulp on [-ln2/2, ln2/2]); 2^n built in two halves so every
// normal result is exact in range. x < kExpLo -> 0 (results below the normal range flush to 0),
// x > kExpHi -> inf, NaN -> NaN. The scalar path uses std::exp.
constexpr float kExpLo = -87.33654f;
constexpr float kExpHi = 88.72283f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f,
                            8.3334519073e-3f, 1.3981999507e-3f, 1.9875691500e-4f};

}  // namespace fathom::ops_internal
