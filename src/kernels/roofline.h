// Machine limits measured in the same run as a benchmark, so every speed is reported as a
// fraction of what this machine (with the other load on it right now) can do:
// memory bandwidth (read-only sweep, copy, STREAM triad) over a buffer larger than the last-level
// cache, and peak arithmetic rates (BF16 dot products with vdpbf16ps, int8 VNNI vpdpbusd, f32
// FMA) from register-only loops with enough independent accumulators to hide latency.
#pragma once

#include <cstdint>
#include <string>

#include "base/cpu.h"
#include "base/thread_pool.h"
#include "tensor/tensor.h"

namespace fathom {

struct MemoryBandwidth {
  double read_gbs = 0;   // read-only sweep, GB/s (1e9 bytes/s)
  double copy_gbs = 0;   // bytes read + bytes written per second
  double triad_gbs = 0;  // a[i] = b[i] + s*c[i], STREAM's counting (3 arrays)
  uint64_t bytes = 0;    // buffer size swept
  int threads = 0;
};

// Best of `repeats` passes over a fresh `bytes`-sized buffer (default 1 GiB, > LLC).
MemoryBandwidth measure_memory_bandwidth(ThreadPool& pool, uint64_t bytes = uint64_t{1} << 30, int repeats = 3);

// A read-bandwidth probe over one buffer kept for the run, cheap enough (two sweeps of 512 MiB,
// a few tens of ms) to sample between steps of a benchmark: on a shared VM the bandwidth moves by
// 2x within minutes, so speed and bandwidth compare honestly only when measured seconds apart.
class BandwidthProbe {
 public:
  explicit BandwidthProbe(ThreadPool& pool, uint64_t bytes = uint64_t{512} << 20);
  double read_gbs(int passes = 2);  // best of `passes` read sweeps, GB/s

 private:
  ThreadPool& pool_;
  uint64_t bytes_;
  Buffer buf_;
};

struct PeakCompute {
  double bf16_gflops = 0;  // 2 FLOP per bf16 product; vdpbf16ps path or the best emulation
  double amx_bf16_gflops = 0;  // AMX tiles (TDPBF16PS) where amx_bf16_usable, else 0
  double int8_gops = 0;    // 2 ops per int8 multiply-add (vpdpbusd); 0 without VNNI
  double f32_gflops = 0;   // FMA
  int threads = 0;
  SimdLevel level = SimdLevel::kScalar;
  // The BF16 rate the matmul kernels run at here: AMX tiles where they are used (amx_bf16_usable),
  // else the vector dot products. Rooflines of work done by matmul (prefill, batched decode) use
  // this; the MLA decode kernel uses amx_bf16_gflops where mla_decode_uses_amx, else bf16_gflops.
  double matmul_bf16_gflops() const { return amx_bf16_gflops > 0 ? amx_bf16_gflops : bf16_gflops; }
  // The peak of the arithmetic matmul uses for weights of `dtype` (kernels/matmul.h): int8 VNNI for
  // q8_0/q4_0, matmul_bf16_gflops for bf16/fp8 where vdpbf16ps exists, fp32 FMA otherwise; `arith`
  // receives its name ("int8", "amx_bf16", "bf16", "f32"). The benches' rooflines for linears.
  double for_weights(DType dtype, std::string* arith) const;
};

PeakCompute measure_peak_compute(ThreadPool& pool, double seconds = 0.2);

namespace internal {
// Per-thread kernels (ISA-specific files); each returns operations performed.
double peak_bf16_avx512bf16(uint64_t iterations);
double peak_amx_bf16(uint64_t iterations);
double peak_int8_avx512(uint64_t iterations);
double peak_f32_avx512(uint64_t iterations);
double peak_f32_avx2(uint64_t iterations);
double peak_int8_avx2(uint64_t iterations);
uint64_t read_sweep_avx512(const uint8_t* p, uint64_t n);
uint64_t read_sweep_avx2(const uint8_t* p, uint64_t n);
}  // namespace internal

}  // namespace fathom
