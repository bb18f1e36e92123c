// Row codecs of the ep wire formats: encode a row of f32/bf16 values into f32, bf16 or FP8
// (e4m3 + one f32 scale per 128 values, DeepEP's per_token_cast_to_fp8), and accumulate rows into
// f32 sums. Every function has a scalar reference (*_ref) and an AVX-512 kernel chosen at run time
// by simd_level(); the fast ones must match the references bit for bit on finite inputs (rows with
// NaN or inf get unspecified FP8 scales). Internal to ep/.
#pragma once

#include <cstdint>

#include "ep/ep.h"

namespace fathom::ep::internal {

// src: n values, bf16 when src_bf16 else f32. dst: wire_row_bytes(f, n) bytes; scales:
// fp8_scale_cols(n) floats for kFP8 (unused otherwise).
void encode_row(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales);
void encode_row_ref(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales);

// acc[i] += row[i], row in kF32 or kBF16.
void accumulate_row(float* acc, const void* row, WireFormat f, int64_t n);
void accumulate_row_ref(float* acc, const void* row, WireFormat f, int64_t n);

// acc[i] += w * row[i] (a product rounded to f32, then a sum: no fused multiply-add).
void axpy_row(float* acc, float w, const void* row, WireFormat f, int64_t n);
void axpy_row_ref(float* acc, float w, const void* row, WireFormat f, int64_t n);

// out[i] = (((0 + rows[0][i]) + rows[1][i]) + ...) over n rows in kF32 or kBF16, summed in
// registers and written once (with non-temporal stores when `stream` and out is 64-byte aligned).
void sum_rows(float* out, const void* const* rows, int n, WireFormat f, int64_t count, bool stream);
void sum_rows_ref(float* out, const void* const* rows, int n, WireFormat f, int64_t count);

// out[i] = (((0 + w[0] * rows[0][i]) + w[1] * rows[1][i]) + ...), each product rounded to f32
// before its addition (the same bits as axpy_row applied row by row to a zeroed out).
void weighted_sum_rows(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                       int64_t count);
void weighted_sum_rows_ref(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                           int64_t count);

// out[i] = e4m3(q[i]) * scales[i / 128].
void decode_fp8_row(const uint8_t* q, const float* scales, int64_t n, float* out);
void decode_fp8_row_ref(const uint8_t* q, const float* scales, int64_t n, float* out);

// dst[0, bytes) = src[0, bytes), with non-temporal stores when dst is 64-byte aligned (rows sent to
// another rank are not read again by this one: streaming them skips the read-for-ownership).
// Callers publish the rows only after stream_fence().
void copy_row_stream(void* dst, const void* src, uint64_t bytes);
// The same row into n destinations (a token routed to several experts of one rank): each block of
// the source is loaded once and stored n times (copy_row_stream is the one-destination case).
void copy_row_stream_multi(uint8_t* const* dsts, int n, const void* src, uint64_t bytes);
void copy_row_stream_multi_avx512(uint8_t* const* dsts, int n, const void* src, uint64_t bytes);
void stream_fence();

// encode_row into dst (the sender's own staging, cached stores) and the same wire bytes into each
// of nd destination rows, plus the kFP8 scales into each dst_scales[i] (when non-null). The
// destinations take each 128-value group as soon as it is encoded, with non-temporal stores when
// they are 64-byte aligned, so the streaming stores (bound by the core's line-fill buffers) run
// under the encoding arithmetic instead of after it; the scales' lines (not whole lines, so not
// streamed) are requested for writing before the row and stored after it. Callers publish after
// stream_fence().
void encode_row_multi(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales,
                      uint8_t* const* dsts, float* const* dst_scales, int nd);
void encode_row_multi_avx512(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst,
                             float* scales, uint8_t* const* dsts, float* const* dst_scales, int nd);

// AVX-512 kernels (codec_avx512.cpp).
void encode_row_avx512(const void* src, bool src_bf16, WireFormat f, int64_t n, void* dst, float* scales);
void accumulate_row_avx512(float* acc, const void* row, WireFormat f, int64_t n);
void axpy_row_avx512(float* acc, float w, const void* row, WireFormat f, int64_t n);
void decode_fp8_row_avx512(const uint8_t* q, const float* scales, int64_t n, float* out);
void sum_rows_avx512(float* out, const void* const* rows, int n, WireFormat f, int64_t count, bool stream);
void weighted_sum_rows_avx512(float* out, const void* const* rows, const float* w, int n, WireFormat f,
                              int64_t count);

}  // namespace fathom::ep::internal
