// CRC32C dispatch and the byte-wise table reference. The fast path lives in crc32c_sse42.cpp
// (compiled with -msse4.2) and is chosen at run time from cpu_features().
#include "storage/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

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

namespace {

// A 32x32 GF(2) matrix as 32 columns; times() multiplies it with a vector.
uint32_t times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

void square(uint32_t* out, const uint32_t* mat) {
  for (int i = 0; i < 32; ++i) out[i] = times(mat, mat[i]);
}

}  // namespace

// crc(A||B) = shift_|B|(crc(A)) ^ crc(B) (the pre/post inversions cancel); shift by n zero bytes
// is the n-th power of the one-zero-bit operator, applied by repeated squaring.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  if (length_b == 0) return crc_a;
  uint32_t odd[32], even[32];
  odd[0] = kPoly;  // the operator for one zero bit
  for (int i = 1; i < 32; ++i) odd[i] = 1u << (i - 1);
  square(even, odd);  // two zero bits
  square(odd, even);  // four zero bits
  uint32_t crc = crc_a;
  for (;;) {
    square(even, odd);  // first pass: one zero byte
    if (length_b & 1) crc = times(even, crc);
    length_b >>= 1;
    if (length_b == 0) break;
    square(odd, even);
    if (length_b & 1) crc = times(odd, crc);
    length_b >>= 1;
    if (length_b == 0) break;
  }
  return crc ^ crc_b;
}

bool crc32c_hardware() {
  static const bool hw = cpu_features().sse42;
  return hw;
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  if (crc32c_hardware()) return internal::crc32c_sse42(data, n, crc);
  return crc32c_ref(data, n, crc);
}

uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc) {
  constexpr size_t kPiece = 64u << 10;  // well inside L2
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t len = std::min(kPiece, n - at);
    std::memcpy(d + at, s + at, len);
    crc = crc32c(d + at, len, crc);
  }
  return crc;
}

}  // namespace fathom::storage
