// Tensor: a non-owning view (dtype, shape, byte strides, data) and Buffer, an owned 64-byte
// aligned allocation. Shapes are outermost-first in every format (PyTorch order: a linear
// weight is [out_features, in_features]); GGUF's reversed `ne` order is converted at the reader.
// Quantised dtypes keep their innermost dimension contiguous and a whole number of blocks.
//
// Views are cheap to copy and never free anything; the owner (a MappedFile, a Buffer) must
// outlive them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace fathom {

constexpr int kMaxDims = 6;

struct Tensor {
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // bytes; for quantised types stride[ndim-1] is unused
  void* data = nullptr;

  // A contiguous row-major view.
  static Tensor contiguous(DType dtype, std::span<const int64_t> shape, void* data);
  static Tensor contiguous(DType dtype, std::initializer_list<int64_t> shape, void* data) {
    return contiguous(dtype, std::span<const int64_t>(shape.begin(), shape.size()), data);
  }

  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? ndim + i : i)]; }
  int64_t numel() const;
  int64_t cols() const { return ndim ? shape[static_cast<size_t>(ndim - 1)] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }
  uint64_t row_bytes() const { return dtype_bytes(dtype, static_cast<uint64_t>(cols())); }
  uint64_t nbytes() const { return dtype_bytes(dtype, static_cast<uint64_t>(numel())); }
  bool is_contiguous() const;
  std::vector<int64_t> shape_vector() const { return {shape.begin(), shape.begin() + ndim}; }
  std::string shape_string() const;  // "[576, 2048]"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // Row r of the view flattened to 2-D [rows, cols] (contiguous views).
  uint8_t* row_ptr(int64_t r) const { return static_cast<uint8_t*>(data) + static_cast<uint64_t>(r) * row_bytes(); }
  // Rows [begin, end) along dimension 0.
  Tensor slice0(int64_t begin, int64_t end) const;
  Tensor reshape(std::span<const int64_t> shape) const;  // contiguous views only
  Tensor reshape(std::initializer_list<int64_t> s) const {
    return reshape(std::span<const int64_t>(s.begin(), s.size()));
  }
};

std::string shape_string(std::span<const int64_t> shape);

// An owned, 64-byte aligned, zero-initialised allocation. Move-only.
class Buffer {
 public:
  Buffer() = default;
  static Buffer allocate(size_t bytes);
  // The same, 2 MiB aligned and advised into transparent huge pages (MADV_HUGEPAGE; advice only),
  // as the loader's --no-mmap weight copies are: for benchmarks' weight arenas.
  static Buffer allocate_huge(size_t bytes);
  Buffer(Buffer&& other) noexcept : data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(data_); }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A tensor that owns its storage.
struct OwnedTensor {
  Buffer buffer;
  Tensor view;
  static OwnedTensor zeros(DType dtype, std::span<const int64_t> shape);
  static OwnedTensor zeros(DType dtype, std::initializer_list<int64_t> shape) {
    return zeros(dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }
};

}  // namespace fathom
