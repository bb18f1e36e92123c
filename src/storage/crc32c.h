// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum on every stored chunk and on
// every RPC frame. crc32c() uses the SSE4.2 crc32 instruction on three interleaved streams when
// the CPU has it and the table-driven reference otherwise; both give identical results.
// Internal to storage/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fathom::storage {

// Extends `crc` (the value returned for the preceding bytes; 0 for none) over data[0, n).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// Copies src[0, n) to dst (non-overlapping) and returns crc32c(src, n, crc), in one pass: each
// piece is checksummed from the destination while it is still in cache, so the bytes cross the
// memory bus once instead of twice (a client placing a shared-memory read verifies it this way).
uint32_t crc32c_copy(void* dst, const void* src, size_t n, uint32_t crc = 0);
// The scalar reference (byte-wise table), used by tests and on CPUs without SSE4.2.
uint32_t crc32c_ref(const void* data, size_t n, uint32_t crc = 0);
// CRC32C of A||B from crc32c(A), crc32c(B) and |B|, in O(log |B|) (GF(2) matrix powers).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);
// True when crc32c() runs on the hardware instruction.
bool crc32c_hardware();

namespace internal {
uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc);
}

}  // namespace fathom::storage
