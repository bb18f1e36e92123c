// The AMX tile configuration Fathom's tile code uses: palette 1, all eight tiles 16 rows x 64
// bytes (16 x 32 bf16 operands, 16 x 16 fp32 accumulators). Include only from files compiled with
// -mamx-tile (matmul_amx_avx512bf16.cpp, roofline_amx_avx512bf16.cpp); callers run only where
// amx_bf16_usable, configure at the start of a call and _tile_release() at its end.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fathom::amx {
namespace {  // NOLINT(build/namespaces): private to each AMX translation unit

inline void configure_full_tiles() {
  struct alignas(64) Config {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

}  // namespace
}  // namespace fathom::amx
