// AMX BF16 peak loop (compiled with -mamx-tile -mamx-bf16; run only where amx_bf16_usable): four
// independent 16x16 fp32 accumulator tiles, each TDPBF16PS 16 x 16 x 32 products (16384 FLOP),
// operands resident in tile registers, as the matmul kernels' (matmul_amx_avx512bf16.cpp) upper
// bound.
#include <immintrin.h>

#include <cstdint>
#include "kernels/amx_tiles.h"
#include "kernels/roofline.h"

namespace fathom::internal {

double peak_amx_bf16(uint64_t iterations) {
  alignas(64) uint16_t operand[16 * 32];
  for (auto& v : operand) v = 0x3c00;  // 2^-7: sums stay finite
  alignas(64) float out[256];
  amx::configure_full_tiles();
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (uint64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  volatile float sink = out[0];
  (void)sink;
  return static_cast<double>(iterations) * 4 * 16 * 16 * 32 * 2;
}

}  // namespace fathom::internal
