// CRC32C dispatch and the byte-wise table reference. The fast path lives in crc32c_sse42.cpp
// (compiled with -msse4.2) and is chosen at run time from cpu_features().
#include "storage/crc32c.h"

#include <array>

#include "base/cpu.h"

namespace fathom::storage {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c_ref(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return ~c;
}

bool crc32c_hardware() {
  static const bool hw = cpu_features().sse42;
  return hw;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  if (crc32c_hardware()) return internal::crc32c_sse42(data, n, crc);
  return crc32c_ref(data, n, crc);
}

}  // namespace fathom::storage
