// SharedArena: one POSIX shared-memory mapping per node, created collectively by the ranks of a
// node communicator (the lowest rank creates and sizes it, the others map it by name, and the
// name is unlinked as soon as everyone has it, so nothing outlives the processes). Pages are
// committed on first touch; creation checks /dev/shm has room for the whole size. Internal.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "base/status.h"

namespace fathom::ep::internal {

class SharedArena {
 public:
  static Result<std::unique_ptr<SharedArena>> create(MPI_Comm node_comm, uint64_t bytes, int64_t timeout_ms);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  SharedArena(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  uint64_t size_;
};

// Private, lazily committed memory (anonymous mapping) for large per-rank buffers.
class PrivateRegion {
 public:
  static Result<PrivateRegion> allocate(uint64_t bytes, std::string_view what);
  PrivateRegion() = default;
  PrivateRegion(PrivateRegion&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr, o.size_ = 0;
  }
  PrivateRegion& operator=(PrivateRegion&& o) noexcept;
  ~PrivateRegion();
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace fathom::ep::internal
