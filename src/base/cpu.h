// CPU feature detection (cpuid + xgetbv, so features the OS does not enable are reported absent)
// and the SIMD level kernels dispatch on. The shipped binary is generic x86-64; kernels compiled
// for wider ISAs are chosen at run time by simd_level().
//
// FATHOM_SIMD=scalar|avx2|avx512|avx512bf16 caps the level (to test or compare every path);
// tests call set_simd_level_cap() directly.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom {

struct CpuFeatures {
  std::string vendor;
  std::string brand;
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx512_fp16 = false;
  bool avx_vnni = false;
  bool amx_tile = false;  // cpuid bits and OS-enabled tile state (XCR0 bits 17/18)
  bool amx_bf16 = false;
  bool amx_int8 = false;
  int logical_cpus = 0;
  std::string to_string() const;  // "avx2 fma f16c avx512f ... (AMD EPYC)"
};

const CpuFeatures& cpu_features();

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

std::string_view simd_level_name(SimdLevel level);
Result<SimdLevel> parse_simd_level(std::string_view name);
// The best level this CPU supports (AVX2 needs FMA+F16C; AVX-512 needs F/BW/VL/DQ + VNNI).
SimdLevel simd_level_supported();
// min(supported, cap); what kernels use.
SimdLevel simd_level();
void set_simd_level_cap(SimdLevel cap);

// Whether AMX BF16 tile instructions may run in this process: the CPU has AMX-TILE and AMX-BF16,
// the OS enables the tile state, and Linux granted this process the tile data permission
// (arch_prctl ARCH_REQ_XCOMP_PERM, requested once on the first call). FATHOM_AMX=0 turns it off
// for the process (to compare paths); kernels also honour set_amx_enabled for tests.
bool amx_bf16_usable();
// The same without set_amx_enabled's override: fixed for the process, so buffers sized by it stay
// consistent when a test turns AMX off and on.
bool amx_bf16_available();
// Overrides amx_bf16_usable for tests and benchmarks: false disables AMX, true restores detection.
void set_amx_enabled(bool enabled);

}  // namespace fathom
