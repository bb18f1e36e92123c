// Bandwidth and peak measurement drivers; the inner loops live in roofline_<isa>.cpp.
#include "kernels/roofline.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "base/timer.h"
#include "tensor/tensor.h"

namespace fathom {
namespace {

uint64_t read_sweep_scalar(const uint8_t* p, uint64_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (uint64_t i = 0; i + 4 <= n / 8; i += 4) {
    a ^= w[i];
    b ^= w[i + 1];
    c ^= w[i + 2];
    d ^= w[i + 3];
  }
  return a ^ b ^ c ^ d;
}

uint64_t read_sweep(const uint8_t* p, uint64_t n) {
  const SimdLevel level = simd_level();
  if (level >= SimdLevel::kAvx512) return internal::read_sweep_avx512(p, n);
  if (level >= SimdLevel::kAvx2) return internal::read_sweep_avx2(p, n);
  return read_sweep_scalar(p, n);
}

// Splits [0, bytes) into one 4 KiB-aligned slice per thread and times `fn(slice)` on all of them.
template <typename F>
double timed_slices(ThreadPool& pool, uint64_t bytes, F fn) {
  const int threads = pool.size();
  const uint64_t per = (bytes / static_cast<uint64_t>(threads)) / 4096 * 4096;
  Timer t;
  pool.run(threads, [&](int64_t task, int) {
    const uint64_t begin = static_cast<uint64_t>(task) * per;
    fn(begin, per);
  });
  return t.elapsed_s();
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(ThreadPool& pool, uint64_t bytes, int repeats) {
  MemoryBandwidth r;
  r.threads = pool.size();
  bytes = std::max<uint64_t>(bytes / 3 / 4096 * 4096, 4096);  // three arrays for triad
  r.bytes = bytes * 3;
  Buffer a = Buffer::allocate(bytes), b = Buffer::allocate(bytes), c = Buffer::allocate(bytes);
  // first touch in parallel so pages spread like the benchmark's own data
  timed_slices(pool, bytes, [&](uint64_t off, uint64_t n) {
    std::memset(a.data() + off, 1, n);
    std::memset(b.data() + off, 2, n);
    std::memset(c.data() + off, 3, n);
  });
  std::atomic<uint64_t> sink{0};
  for (int rep = 0; rep < repeats; ++rep) {
    // read: all three arrays
    double s = timed_slices(pool, bytes, [&](uint64_t off, uint64_t n) {
      sink.fetch_xor(read_sweep(a.data() + off, n) ^ read_sweep(b.data() + off, n) ^ read_sweep(c.data() + off, n));
    });
    r.read_gbs = std::max(r.read_gbs, 3.0 * static_cast<double>(bytes) / s * 1e-9);
    s = timed_slices(pool, bytes, [&](uint64_t off, uint64_t n) { std::memcpy(a.data() + off, b.data() + off, n); });
    r.copy_gbs = std::max(r.copy_gbs, 2.0 * static_cast<double>(bytes) / s * 1e-9);
    s = timed_slices(pool, bytes, [&](uint64_t off, uint64_t n) {
      float* x = reinterpret_cast<float*>(a.data() + off);
      const float* y = reinterpret_cast<const float*>(b.data() + off);
      const float* z = reinterpret_cast<const float*>(c.data() + off);
      const uint64_t m = n / 4;
      for (uint64_t i = 0; i < m; ++i) x[i] = y[i] + 0.5f * z[i];
    });
    r.triad_gbs = std::max(r.triad_gbs, 3.0 * static_cast<double>(bytes) / s * 1e-9);
  }
  if (sink.load() == 42) r.read_gbs += 0;  // keep the sweeps alive
  return r;
}

// bytes_ is a whole number of 4 KiB pages per thread, so timed_slices sweeps all of it.
BandwidthProbe::BandwidthProbe(ThreadPool& pool, uint64_t bytes)
    : pool_(pool),
      bytes_(std::max<uint64_t>(bytes / (4096u * pool.size()), 1) * 4096u * pool.size()),
      buf_(Buffer::allocate(bytes_)) {
  timed_slices(pool_, bytes_, [&](uint64_t off, uint64_t n) { std::memset(buf_.data() + off, 1, n); });
}

double BandwidthProbe::read_gbs(int passes) {
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int i = 0; i < std::max(passes, 1); ++i) {
    const double s = timed_slices(
        pool_, bytes_, [&](uint64_t off, uint64_t n) { sink.fetch_xor(read_sweep(buf_.data() + off, n)); });
    best = std::max(best, static_cast<double>(bytes_) / s * 1e-9);
  }
  if (sink.load() == 42) best += 0;  // keep the sweeps alive
  return best;
}

double PeakCompute::for_weights(DType dtype, std::string* arith) const {
  if (dtype == DType::kQ8_0 || dtype == DType::kQ4_0) {
    *arith = "int8";
    return int8_gops;
  }
  if ((dtype == DType::kBF16 || dtype == DType::kF8E4M3) && level >= SimdLevel::kAvx512Bf16) {
    *arith = amx_bf16_gflops > 0 ? "amx_bf16" : "bf16";  // AMX tiles where they run
    return matmul_bf16_gflops();
  }
  *arith = "f32";
  return f32_gflops;
}

PeakCompute measure_peak_compute(ThreadPool& pool, double seconds) {
  PeakCompute r;
  r.threads = pool.size();
  r.level = simd_level();
  auto measure = [&](double (*kernel)(uint64_t)) {
    if (kernel == nullptr) return 0.0;
    // calibrate on one thread, then run all threads for about `seconds`
    uint64_t iters = 1 << 14;
    while (true) {
      Timer t;
      kernel(iters);
      if (t.elapsed_s() > 0.02) {
        iters = static_cast<uint64_t>(static_cast<double>(iters) * seconds / t.elapsed_s()) + 1;
        break;
      }
      iters *= 4;
    }
    double best = 0;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<double> ops(static_cast<size_t>(pool.size()));
      Timer t;
      pool.run(pool.size(), [&](int64_t task, int) { ops[static_cast<size_t>(task)] = kernel(iters); });
      const double s = t.elapsed_s();
      double total = 0;
      for (double o : ops) total += o;
      best = std::max(best, total / s * 1e-9);
    }
    return best;
  };
  const CpuFeatures& f = cpu_features();
  if (r.level >= SimdLevel::kAvx512Bf16) {
    r.bf16_gflops = measure(internal::peak_bf16_avx512bf16);
    if (amx_bf16_usable()) r.amx_bf16_gflops = measure(internal::peak_amx_bf16);
  }
  if (r.level >= SimdLevel::kAvx512) {
    r.int8_gops = measure(internal::peak_int8_avx512);
    r.f32_gflops = measure(internal::peak_f32_avx512);
  } else if (r.level >= SimdLevel::kAvx2) {
    r.f32_gflops = measure(internal::peak_f32_avx2);
    if (f.avx_vnni) r.int8_gops = measure(internal::peak_int8_avx2);
  }
  // Without native BF16 dot products, bf16 math runs as f32 FMAs after widening.
  if (r.bf16_gflops == 0) r.bf16_gflops = r.f32_gflops;
  return r;
}

}  // namespace fathom
