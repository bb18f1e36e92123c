// cpuid/xgetbv probing. Only x86-64 is detected; elsewhere everything is scalar.
#include "base/cpu.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fathom {
namespace {

#if defined(__x86_64__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = (c >> 27) & 1;
  f.sse42 = (c >> 20) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);
  f.avx = ((c >> 28) & 1) && os_avx;
  f.fma = f.fma && os_avx;
  f.f16c = f.f16c && os_avx;

  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = ((b >> 5) & 1) && os_avx;
    f.avx512f = ((b >> 16) & 1) && os_avx512;
    f.avx512dq = ((b >> 17) & 1) && os_avx512;
    f.avx512bw = ((b >> 30) & 1) && os_avx512;
    f.avx512vl = ((b >> 31) & 1) && os_avx512;
    f.avx512_vnni = ((c >> 11) & 1) && os_avx512;
    f.avx512_fp16 = ((d >> 23) & 1) && os_avx512;
    f.amx_bf16 = ((d >> 22) & 1) && os_amx;
    f.amx_tile = ((d >> 24) & 1) && os_amx;
    f.amx_int8 = ((d >> 25) & 1) && os_amx;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx_vnni = ((a >> 4) & 1) && os_avx;
    f.avx512_bf16 = ((a >> 5) & 1) && os_avx512;
  }
  __get_cpuid(0x80000000, &a, &b, &c, &d);
  if (a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    std::string s = brand;
    while (!s.empty() && s.back() == ' ') s.pop_back();
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    f.brand = s;
  }
  return f;
}
#else
CpuFeatures detect() {
  CpuFeatures f;
  f.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  return f;
}
#endif

SimdLevel initial_cap() {
  if (const char* env = std::getenv("FATHOM_SIMD")) {
    auto level = parse_simd_level(env);
    if (level.ok()) return *level;
  }
  return SimdLevel::kAvx512Bf16;
}

std::atomic<int>& cap_ref() {
  static std::atomic<int> cap{static_cast<int>(initial_cap())};
  return cap;
}

}  // namespace

std::string CpuFeatures::to_string() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(avx_vnni, "avx_vnni");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  if (!brand.empty()) s += " (" + brand + ")";
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return "scalar";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

Result<SimdLevel> parse_simd_level(std::string_view name) {
  if (name == "scalar") return SimdLevel::kScalar;
  if (name == "avx2") return SimdLevel::kAvx2;
  if (name == "avx512") return SimdLevel::kAvx512;
  if (name == "avx512bf16") return SimdLevel::kAvx512Bf16;
  return invalid_argument("SIMD level '{}' is not one of scalar, avx2, avx512, avx512bf16", name);
}

SimdLevel simd_level_supported() {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.f16c)) return SimdLevel::kScalar;
  if (!(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni)) return SimdLevel::kAvx2;
  if (!f.avx512_bf16) return SimdLevel::kAvx512;
  return SimdLevel::kAvx512Bf16;
}

SimdLevel simd_level() {
  static const SimdLevel supported = simd_level_supported();
  const int cap = cap_ref().load(std::memory_order_relaxed);
  return static_cast<SimdLevel>(std::min(cap, static_cast<int>(supported)));
}

void set_simd_level_cap(SimdLevel cap) { cap_ref().store(static_cast<int>(cap)); }

namespace {

bool amx_detect() {
  const CpuFeatures& f = cpu_features();
  if (!(f.amx_tile && f.amx_bf16 && f.avx512_bf16)) return false;
  if (const char* env = std::getenv("FATHOM_AMX"); env != nullptr && std::strcmp(env, "0") == 0) return false;
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023;  // asm/prctl.h
  constexpr long kXfeatureXtileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
#else
  return false;
#endif
}

std::atomic<bool>& amx_enabled_ref() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

}  // namespace

bool amx_bf16_available() {
  static const bool available = amx_detect();
  return available;
}

bool amx_bf16_usable() {
  return amx_bf16_available() && amx_enabled_ref().load(std::memory_order_relaxed);
}

void set_amx_enabled(bool enabled) { amx_enabled_ref().store(enabled); }

}  // namespace fathom
