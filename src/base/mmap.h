// MappedFile: a read-only memory mapping of a whole file. Checkpoints are used in place through
// it (zero-copy tensor views); nothing is read until touched. Empty files map to (nullptr, 0).
//
// LoadMode::kRead (`--no-mmap` on the model commands, as in llama.cpp) reads the file into private
// anonymous memory instead (huge pages advised) and drops what the read put in the page cache, so
// the bytes are resident once. Weight streaming from such memory measured 1.1-1.4x faster than
// from mapped page-cache pages on the development VM; it costs the whole file in RAM up front.
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

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path, LoadMode mode);
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
  MappedFile(std::string path, const uint8_t* data, size_t size, LoadMode mode)
      : path_(std::move(path)), data_(data), size_(size), mode_(mode) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
  LoadMode mode_;
};

}  // namespace fathom
