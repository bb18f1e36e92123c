// MappedFile: a read-only memory mapping of a whole file. Checkpoints are used in place through
// it (zero-copy tensor views); nothing is read until touched. Empty files map to (nullptr, 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace fathom {

enum class MapAdvice { kNormal, kSequential, kRandom, kWillNeed };

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
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
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace fathom
