// AlignedBuffer: a 4096-aligned heap buffer for O_DIRECT transfers and socket I/O, grown on
// demand and reused (servers keep one per connection), zero-filled where it grows. Not
// thread-safe. Internal to storage/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace fathom::storage {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr, o.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  static Result<AlignedBuffer> allocate(size_t size);
  // Ensures at least `size` bytes (contents are not preserved when it grows).
  Status reserve(size_t size);
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fathom::storage
