// Hugging Face safetensors: reader (memory-mapped, zero-copy views, O(header) to open) and a
// streaming writer; sharded checkpoints through model.safetensors.index.json.
//
// File layout: u64 little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data section; offsets are relative to its start. The reader validates everything
// before any tensor is used: header length inside the file, well-formed JSON (no duplicate
// names), known dtypes, non-negative shapes, every range inside the data section, no two ranges
// overlapping, and shape x dtype size == byte length. Errors name the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/fs.h"
#include "base/mmap.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace fathom {

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t size = 0;    // bytes
};

// safetensors dtype strings ("BF16", "F8_E4M3", ...) <-> DType.
Result<DType> safetensors_dtype(std::string_view name);
Result<std::string_view> safetensors_dtype_name(DType dtype);

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses a file image already in memory (the fuzzer's entry point). `data` must outlive it.
  static Result<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* data, size_t size, std::string path);

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const TensorEntry* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }
  uint64_t file_bytes() const { return size_; }
  // A zero-copy view of the tensor's bytes (valid while this file is open).
  Tensor view(const TensorEntry& entry) const;
  const MappedFile* mapping() const { return map_.get(); }

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> map_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint64_t header_bytes_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Streams a safetensors file: the header (from the full list of specs) first, then each tensor's
// bytes in spec order, possibly in pieces. Memory stays bounded by the caller's pieces.
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> create(const std::string& path, std::vector<TensorSpec> specs,
                                          const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = default;

  // Appends bytes to the current tensor (moving on to the next when it is full).
  Status append(const void* data, size_t bytes);
  // Syncs and closes; fails if any tensor is incomplete.
  Status finish();
  const std::vector<TensorSpec>& specs() const { return specs_; }
  size_t current_tensor() const { return current_; }
  uint64_t total_data_bytes() const { return total_; }

 private:
  SafetensorsWriter(OutputFile file, std::vector<TensorSpec> specs, std::vector<uint64_t> sizes)
      : file_(std::move(file)), specs_(std::move(specs)), sizes_(std::move(sizes)) {}
  OutputFile file_;
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> sizes_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
  uint64_t total_ = 0;
};

// A Hugging Face checkpoint's tensors, from one model.safetensors or several shards listed in
// model.safetensors.index.json. Tensor names are unique across shards (checked).
class SafetensorsCheckpoint {
 public:
  // `path` is a directory (index or single file inside) or a .safetensors file.
  static Result<std::unique_ptr<SafetensorsCheckpoint>> open(const std::string& path);

  struct Located {
    const SafetensorsFile* file;
    const TensorEntry* entry;
  };
  const std::vector<Located>& tensors() const { return all_; }
  const Located* find(std::string_view name) const;
  Tensor view(const Located& t) const { return t.file->view(*t.entry); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Located> all_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Writes model.safetensors.index.json for shards already written: weight_map name -> file name.
Status write_safetensors_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size);

}  // namespace fathom
