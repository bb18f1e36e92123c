// AlignedBuffer: posix_memalign'ed storage.
#include "storage/buffer.h"

#include <cstdlib>
#include <cstring>

#include "storage/io.h"

namespace fathom::storage {

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

Result<AlignedBuffer> AlignedBuffer::allocate(size_t size) {
  AlignedBuffer b;
  TRY(b.reserve(size));
  return b;
}

Status AlignedBuffer::reserve(size_t size) {
  if (size <= size_ && data_ != nullptr) return {};
  const size_t n = align_up(size ? size : 1);
  void* p = nullptr;
  if (posix_memalign(&p, kIoAlign, n) != 0)
    return resource_exhausted("cannot allocate an I/O buffer of {} bytes", n);
  std::memset(p, 0, n);
  std::free(data_);
  data_ = static_cast<uint8_t*>(p);
  size_ = n;
  return {};
}

}  // namespace fathom::storage
