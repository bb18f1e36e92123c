// SlotAllocator: free-space bitmaps over a target's data files. Each size class (4 KiB .. 64 MiB,
// powers of two and 1.5x between them, so a chunk wastes at most a third of its slot) has one
// data file divided into groups of up to 256 equal slots; a group is the unit of disk
// reservation (fallocate) and release (hole punch), a bit per slot says whether it is in use.
// A group whose last slot is freed stays reserved (and allocatable) until the caller releases
// it; empty_bytes() and highest_empty_group() say which are empty.
// Allocation takes the lowest free slot of the lowest partly used group, so data stays dense.
// The allocator holds no persistent state: after a restart it is rebuilt from the chunk
// metadata (mark_used), and every slot no chunk references is free.
//
// Not thread-safe: the chunk engine calls it under its mutex. Internal to storage/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom::storage {

struct SlotClass {
  uint32_t slot_bytes = 0;
  uint32_t slots_per_group = 0;
  uint64_t group_bytes() const { return uint64_t{slot_bytes} * slots_per_group; }
};

struct Slot {
  uint8_t size_class = 0;
  uint64_t offset = 0;  // in the class's data file
  uint64_t key() const { return (uint64_t{size_class} << 56) | (offset >> 12); }
};

class SlotAllocator {
 public:
  static constexpr uint32_t kMaxSlotsPerGroup = 256;
  // 4 KiB, 8 KiB, 12 KiB, 16 KiB, 24 KiB, 32 KiB, ..., 32 MiB, 48 MiB, 64 MiB (28 classes).
  static std::vector<uint32_t> default_slot_sizes();
  // Each class gets clamp(group_bytes_target / slot, 1, 256) slots per group.
  static std::vector<SlotClass> make_classes(const std::vector<uint32_t>& slot_sizes,
                                             uint64_t group_bytes_target);

  explicit SlotAllocator(std::vector<SlotClass> classes);

  const std::vector<SlotClass>& classes() const { return classes_; }
  // The smallest class whose slot holds `length` bytes; -1 when none does.
  int class_for(uint64_t length) const;

  // A free slot of class `cls` in an already reserved group, or nullopt (reserve a group first).
  std::optional<Slot> allocate(int cls);
  // The group index the next reservation of `cls` would use (the lowest one not reserved).
  uint32_t next_group(int cls) const;
  uint64_t group_offset(int cls, uint32_t group) const { return classes_[cls].group_bytes() * group; }
  // The disk space of `group` is reserved: its slots become allocatable.
  void add_group(int cls, uint32_t group);
  // Frees a slot; returns its group when that group is now empty (the caller may release it).
  std::optional<uint32_t> free(const Slot& slot);
  // An empty reserved group gives its space back.
  void release_group(int cls, uint32_t group);
  // The highest-numbered reserved group of `cls` with no slot in use, if any.
  std::optional<uint32_t> highest_empty_group(int cls) const;
  // Rebuild: the slot is in use by `owner`. Errors name the owner on a bad or doubly used slot.
  Status mark_used(const Slot& slot, std::string_view owner);
  bool group_reserved(int cls, uint32_t group) const;
  uint32_t group_count(int cls) const { return static_cast<uint32_t>(state_[cls].groups.size()); }

  uint64_t reserved_bytes() const { return reserved_bytes_; }
  uint64_t empty_bytes() const { return empty_bytes_; }  // of reserved groups with no slot in use
  uint64_t used_bytes() const { return used_bytes_; }    // slot bytes of used slots
  uint64_t used_slots() const { return used_slots_; }

 private:
  struct Group {
    std::array<uint64_t, kMaxSlotsPerGroup / 64> bits{};
    uint32_t used = 0;
    bool reserved = false;
  };
  struct ClassState {
    std::vector<Group> groups;
    std::set<uint32_t> partial;  // reserved groups with a free slot
    std::set<uint32_t> absent;   // indices below groups.size() that are not reserved
    std::set<uint32_t> empty;    // reserved groups with no slot in use
  };
  Result<std::pair<uint32_t, uint32_t>> locate(const Slot& slot) const;  // (group, index)
  void trim(int cls);
  // Bookkeeping of st.empty when a group's use count leaves or reaches zero.
  void became_used(int cls, uint32_t group);
  void became_empty(int cls, uint32_t group);

  std::vector<SlotClass> classes_;
  std::vector<ClassState> state_;
  uint64_t reserved_bytes_ = 0;
  uint64_t empty_bytes_ = 0;
  uint64_t used_bytes_ = 0;
  uint64_t used_slots_ = 0;
};

}  // namespace fathom::storage
