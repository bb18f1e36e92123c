// CRC32C with the SSE4.2 crc32 instruction. The instruction has a latency of three cycles and a
// throughput of one, so long buffers run three independent streams over adjacent blocks and
// join them: the raw CRC register is linear over GF(2), so CRC(A||B) = shift_|B|(CRC(A)) ^
// CRC_0(B), where shift_n appends n zero bytes. shift_n is a 4x256 table per block length, built
// once from the instruction itself.
#include <nmmintrin.h>

#include <cstring>

#include "storage/crc32c.h"

namespace fathom::storage::internal {
namespace {

constexpr size_t kLong = 8192;  // bytes per stream in the long loop
constexpr size_t kShort = 256;  // bytes per stream in the short loop

struct ShiftTable {
  uint32_t t[4][256];
};

// Raw register after `len` zero bytes (len a multiple of 8), starting from `reg`.
uint32_t zeros(uint32_t reg, size_t len) {
  uint64_t c = reg;
  for (size_t i = 0; i < len; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

void build(ShiftTable& table, size_t len) {
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) table.t[k][b] = zeros(b << (8 * k), len);
  }
}

uint32_t shift(const ShiftTable& table, uint32_t c) {
  return table.t[0][c & 0xff] ^ table.t[1][(c >> 8) & 0xff] ^ table.t[2][(c >> 16) & 0xff] ^
         table.t[3][c >> 24];
}

struct Tables {
  ShiftTable long_shift, short_shift;
};

const Tables& tables() {
  static const Tables t = [] {
    Tables x;
    build(x.long_shift, kLong);
    build(x.short_shift, kShort);
    return x;
  }();
  return t;
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Three streams of `block` bytes each, joined with `table` (which shifts by `block`).
inline uint64_t three_way(uint64_t crc, const uint8_t* p, size_t block, const ShiftTable& table) {
  uint64_t c0 = crc, c1 = 0, c2 = 0;
  for (size_t i = 0; i < block; i += 8) {
    c0 = _mm_crc32_u64(c0, load64(p + i));
    c1 = _mm_crc32_u64(c1, load64(p + block + i));
    c2 = _mm_crc32_u64(c2, load64(p + 2 * block + i));
  }
  uint32_t c = shift(table, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
  return shift(table, c) ^ static_cast<uint32_t>(c2);
}

}  // namespace

uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kShort) {
    const Tables& t = tables();
    while (n >= 3 * kLong) {
      c = three_way(c, p, kLong, t.long_shift);
      p += 3 * kLong;
      n -= 3 * kLong;
    }
    while (n >= 3 * kShort) {
      c = three_way(c, p, kShort, t.short_shift);
      p += 3 * kShort;
      n -= 3 * kShort;
    }
  }
  while (n >= 8) {
    c = _mm_crc32_u64(c, load64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

}  // namespace fathom::storage::internal
