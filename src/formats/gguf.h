// GGUF (llama.cpp's checkpoint format), versions 2 and 3: reader and streaming writer.
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count, metadata key/value pairs
// (every value type incl. nested arrays), tensor infos (name, n_dims <= 4, ne[] innermost
// first, ggml type, offset), padding to general.alignment (default 32), then tensor data.
// Shapes here are outermost-first like every other format in Fathom: GGUF's ne is reversed at
// the boundary (a weight with ne = [2048, 576] is shape [576, 2048]).
//
// The reader validates before use: magic and version, counts and string/array lengths bounded by
// the bytes left, known value and ggml types, nesting depth, unique keys and tensor names,
// alignment a power of two, offsets aligned, each tensor's bytes inside the file, no overlaps,
// and the innermost dimension a whole number of quantisation blocks.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fs.h"
#include "base/mmap.h"
#include "base/status.h"
#include "formats/safetensors.h"
#include "tensor/tensor.h"

namespace fathom {

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::kU32;
  uint64_t u = 0;   // unsigned integer types
  int64_t i = 0;    // signed integer types
  double f = 0;     // f32/f64
  bool b = false;
  std::string s;
  GgufType elem_type = GgufType::kU32;  // arrays
  std::vector<GgufValue> arr;

  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue f32(float v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string v);
  static GgufValue string_array(const std::vector<std::string>& v);
  static GgufValue i32_array(const std::vector<int32_t>& v);
  static GgufValue f32_array(const std::vector<float>& v);

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  int64_t as_int() const { return type == GgufType::kI8 || type == GgufType::kI16 || type == GgufType::kI32 || type == GgufType::kI64 ? i : static_cast<int64_t>(u); }
  nlohmann::json to_json(size_t max_array_items = SIZE_MAX) const;
};

// ggml type ids <-> DType (F32=0, F16=1, Q4_0=2, ..., Q8_0=8, ..., BF16=30, ...).
Result<DType> ggml_type_to_dtype(uint32_t ggml_type);
Result<uint32_t> dtype_to_ggml_type(DType dtype);
// Names as llama.cpp prints them: "F32", "Q8_0", "BF16", "Q4_K".
std::string ggml_type_name(DType dtype);

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first
  uint64_t offset = 0;         // absolute byte offset in the file
  uint64_t size = 0;
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  static Result<std::unique_ptr<GgufFile>> parse(const uint8_t* data, size_t size, std::string path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_bytes() const { return size_; }
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* get(std::string_view key) const;
  // Typed getters: not_found when absent, invalid_argument naming the key when of the wrong type.
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;  // accepts integers too
  Result<std::string> get_string(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find(std::string_view name) const;
  Tensor view(const GgufTensorInfo& t) const;

 private:
  GgufFile() = default;
  std::unique_ptr<MappedFile> map_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

// Writes a GGUF v3 file: metadata and tensor infos up front, then tensor data streamed in
// declaration order (append may be called in pieces; padding is inserted between tensors).
class GgufWriter {
 public:
  static Result<GgufWriter> create(const std::string& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                                   const std::vector<TensorSpec>& tensors, uint32_t alignment = 32);
  GgufWriter(GgufWriter&&) = default;
  GgufWriter& operator=(GgufWriter&&) = default;
  Status append(const void* data, size_t bytes);
  Status finish();

 private:
  GgufWriter(OutputFile file, std::vector<uint64_t> sizes, uint32_t alignment)
      : file_(std::move(file)), sizes_(std::move(sizes)), alignment_(alignment) {}
  Status advance();
  OutputFile file_;
  std::vector<uint64_t> sizes_;
  uint32_t alignment_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
};

}  // namespace fathom
