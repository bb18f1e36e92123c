// MappedFile: a read-only memory mapping of a whole file. Checkpoints are used in place through
// it (zero-copy tensor views); nothing is read until touched. Empty files map to (nullptr, 0).
//
// LoadMode::kRead (`--no-mmap` on the model commands, as in llama.cpp) reads the file into private
// anonymous memory instead (huge pages advised) and drops what the read put in the page cache, so
// the bytes are resident once. Weight streaming from such memory measured 1.1-1.4x faster than
// from mapped page-cache pages on the development VM; it costs the whole file in RAM up front.
//
// Alignment: a mapping starts on a page, so file byte i sits at i mod 64 within its cache line.
// The copy of kRead can do better: open(path, mode, align_at) places file byte `align_at` (a
// format's data section) on a kCacheLine boundary. The reference safetensors writer pads its header
// to 8 bytes only, so a checkpoint's tensors usually start mid line, which costs the FP8 kernels
// 2-7% (the tile pair loop 1.8x before its line requests took the extra line; docs/PERFORMANCE.md,
// "Cache-line-aligned weights").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace fathom {

enum class MapAdvice { kNormal, kSequential, kRandom, kWillNeed };
enum class LoadMode { kMap, kRead };

// The mode MappedFile::open(path) uses; process-wide, kMap unless set (by the CLI before loading).
void set_default_load_mode(LoadMode mode);
LoadMode default_load_mode();

inline constexpr uint64_t kCacheLine = 64;

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path, LoadMode mode);
  // As above; with kRead, file byte `align_at` lands on a kCacheLine boundary (ignored by kMap).
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path, LoadMode mode, uint64_t align_at);
  LoadMode mode() const { return mode_; }
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Hints for a byte range (rounded out to pages); errors are ignored (advice only).
  void advise(size_t offset, size_t length, MapAdvice advice) const;
  // Touches every page of the range so later reads do not fault (used before benchmarks).
  void prefault(size_t offset, size_t length) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size, LoadMode mode, void* base, size_t base_size)
      : path_(std::move(path)), data_(data), size_(size), mode_(mode), base_(base), base_size_(base_size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
  LoadMode mode_;
  void* base_;  // what munmap releases: the mapping, or the copy's allocation (data_ may sit past it)
  size_t base_size_;
};

}  // namespace fathom
