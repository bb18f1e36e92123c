// Tensor views and aligned buffers.
#include "tensor/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "base/check.h"

namespace fathom {

Tensor Tensor::contiguous(DType dtype, std::span<const int64_t> shape, void* data) {
  CHECK_MSG(shape.size() <= kMaxDims, "tensor rank {} exceeds {}", shape.size(), kMaxDims);
  Tensor t;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  t.data = data;
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  if (t.ndim > 0) {
    const DTypeInfo& info = dtype_info(dtype);
    int64_t stride = info.block_elems == 1 ? info.block_bytes : 0;
    t.stride[static_cast<size_t>(t.ndim - 1)] = stride;
    int64_t s = static_cast<int64_t>(dtype_bytes(dtype, static_cast<uint64_t>(shape.back())));
    for (int i = t.ndim - 2; i >= 0; --i) {
      t.stride[static_cast<size_t>(i)] = s;
      s *= shape[static_cast<size_t>(i)];
    }
  }
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

bool Tensor::is_contiguous() const {
  if (ndim == 0) return true;
  Tensor c = contiguous(dtype, std::span<const int64_t>(shape.data(), static_cast<size_t>(ndim)), data);
  for (int i = 0; i < ndim; ++i) {
    if (shape[static_cast<size_t>(i)] > 1 && c.stride[static_cast<size_t>(i)] != stride[static_cast<size_t>(i)]) {
      return false;
    }
  }
  return true;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Tensor::shape_string() const {
  return fathom::shape_string(std::span<const int64_t>(shape.data(), static_cast<size_t>(ndim)));
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0]);
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<uint8_t*>(data) + begin * stride[0];
  return t;
}

Tensor Tensor::reshape(std::span<const int64_t> new_shape) const {
  CHECK_MSG(is_contiguous(), "reshape of a strided view");
  Tensor t = contiguous(dtype, new_shape, data);
  CHECK_MSG(t.numel() == numel(), "reshape {} to {}", shape_string(), t.shape_string());
  return t;
}

Buffer Buffer::allocate(size_t bytes) {
  Buffer b;
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) return b;
  void* p = std::aligned_alloc(64, rounded);
  CHECK_MSG(p != nullptr, "out of memory allocating {} bytes", rounded);
  std::memset(p, 0, rounded);
  b.data_ = static_cast<uint8_t*>(p);
  b.size_ = bytes;
  return b;
}

Buffer Buffer::allocate_huge(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  Buffer b;
  if (bytes == 0) return b;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  CHECK_MSG(p != nullptr, "out of memory allocating {} bytes", rounded);
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // before the first touch, so the faults take huge pages
  std::memset(p, 0, (bytes + 63) / 64 * 64);
  b.data_ = static_cast<uint8_t*>(p);
  b.size_ = bytes;
  return b;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { std::free(data_); }

OwnedTensor OwnedTensor::zeros(DType dtype, std::span<const int64_t> shape) {
  OwnedTensor o;
  Tensor probe = Tensor::contiguous(dtype, shape, nullptr);
  o.buffer = Buffer::allocate(probe.nbytes());
  o.view = Tensor::contiguous(dtype, shape, o.buffer.data());
  return o;
}

}  // namespace fathom
