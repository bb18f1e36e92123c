// SlotAllocator: per-class group bitmaps with sets of partly used and absent groups.
#include "storage/allocator.h"
#include "storage/ids.h"

#include <algorithm>
#include <bit>

#include "base/check.h"

namespace fathom::storage {

std::vector<uint32_t> SlotAllocator::default_slot_sizes() {
  std::vector<uint32_t> sizes;
  for (int k = 12; k < 26; ++k) {
    sizes.push_back(1u << k);
    if (k >= 13) sizes.push_back(3u << (k - 1));  // 1.5 * 2^k (6 KiB is not a block multiple)
  }
  sizes.push_back(1u << 26);
  return sizes;
}

std::vector<SlotClass> SlotAllocator::make_classes(const std::vector<uint32_t>& slot_sizes,
                                                   uint64_t group_bytes_target) {
  std::vector<SlotClass> classes;
  for (uint32_t s : slot_sizes) {
    const uint64_t n = std::clamp<uint64_t>(group_bytes_target / s, 1, kMaxSlotsPerGroup);
    classes.push_back(SlotClass{s, static_cast<uint32_t>(n)});
  }
  return classes;
}

SlotAllocator::SlotAllocator(std::vector<SlotClass> classes) : classes_(std::move(classes)) {
  CHECK(!classes_.empty() && classes_.size() <= 255);
  for (size_t i = 0; i < classes_.size(); ++i) {
    CHECK(classes_[i].slot_bytes % 4096 == 0 && classes_[i].slot_bytes > 0);
    CHECK(classes_[i].slots_per_group >= 1 && classes_[i].slots_per_group <= kMaxSlotsPerGroup);
    if (i > 0) CHECK(classes_[i].slot_bytes > classes_[i - 1].slot_bytes);
  }
  state_.resize(classes_.size());
}

int SlotAllocator::class_for(uint64_t length) const {
  for (size_t i = 0; i < classes_.size(); ++i) {
    if (classes_[i].slot_bytes >= length) return static_cast<int>(i);
  }
  return -1;
}

std::optional<Slot> SlotAllocator::allocate(int cls) {
  ClassState& st = state_[cls];
  if (st.partial.empty()) return std::nullopt;
  const uint32_t g = *st.partial.begin();
  Group& group = st.groups[g];
  const SlotClass& c = classes_[cls];
  for (uint32_t w = 0; w < group.bits.size(); ++w) {
    const uint64_t free_bits = ~group.bits[w];
    if (free_bits == 0) continue;
    const uint32_t idx = w * 64 + static_cast<uint32_t>(std::countr_zero(free_bits));
    CHECK_MSG(idx < c.slots_per_group, "group {} of class {} marked partial but full", g, cls);
    group.bits[w] |= uint64_t{1} << (idx % 64);
    if (group.used == 0) became_used(cls, g);
    if (++group.used == c.slots_per_group) st.partial.erase(g);
    used_bytes_ += c.slot_bytes;
    ++used_slots_;
    return Slot{static_cast<uint8_t>(cls), group_offset(cls, g) + uint64_t{idx} * c.slot_bytes};
  }
  CHECK_MSG(false, "group {} of class {} marked partial but has no free bit", g, cls);
  return std::nullopt;
}

uint32_t SlotAllocator::next_group(int cls) const {
  const ClassState& st = state_[cls];
  return st.absent.empty() ? static_cast<uint32_t>(st.groups.size()) : *st.absent.begin();
}

void SlotAllocator::add_group(int cls, uint32_t group) {
  ClassState& st = state_[cls];
  const SlotClass& c = classes_[cls];
  while (st.groups.size() <= group) {
    st.absent.insert(static_cast<uint32_t>(st.groups.size()));
    st.groups.emplace_back();
  }
  Group& g = st.groups[group];
  CHECK(!g.reserved);
  g = Group{};
  g.reserved = true;
  // Bits past slots_per_group stay set so they are never handed out.
  for (uint32_t i = c.slots_per_group; i < kMaxSlotsPerGroup; ++i) g.bits[i / 64] |= uint64_t{1} << (i % 64);
  st.absent.erase(group);
  st.partial.insert(group);
  reserved_bytes_ += c.group_bytes();
  became_empty(cls, group);
}

void SlotAllocator::became_used(int cls, uint32_t group) {
  state_[cls].empty.erase(group);
  empty_bytes_ -= classes_[cls].group_bytes();
}

void SlotAllocator::became_empty(int cls, uint32_t group) {
  state_[cls].empty.insert(group);
  empty_bytes_ += classes_[cls].group_bytes();
}

std::optional<uint32_t> SlotAllocator::highest_empty_group(int cls) const {
  const ClassState& st = state_[cls];
  if (st.empty.empty()) return std::nullopt;
  return *st.empty.rbegin();
}

Result<std::pair<uint32_t, uint32_t>> SlotAllocator::locate(const Slot& slot) const {
  if (slot.size_class >= classes_.size()) {
    return corrupt("slot class {} (the target has {} classes)", slot.size_class, classes_.size());
  }
  const SlotClass& c = classes_[slot.size_class];
  const uint64_t g = slot.offset / c.group_bytes();
  const uint64_t within = slot.offset - g * c.group_bytes();
  if (within % c.slot_bytes != 0 || g > UINT32_MAX) {
    return corrupt("offset {} is not a slot boundary of class {} ({} B slots)", slot.offset, slot.size_class,
                   c.slot_bytes);
  }
  return std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(g),
                                       static_cast<uint32_t>(within / c.slot_bytes));
}

std::optional<uint32_t> SlotAllocator::free(const Slot& slot) {
  auto where = locate(slot);
  CHECK_MSG(where.ok(), "free of a bad slot: {}", where.status().to_string());
  const auto [g, idx] = *where;
  ClassState& st = state_[slot.size_class];
  CHECK(g < st.groups.size());
  Group& group = st.groups[g];
  const uint64_t bit = uint64_t{1} << (idx % 64);
  CHECK_MSG(group.reserved && (group.bits[idx / 64] & bit), "double free of class {} offset {}",
            slot.size_class, slot.offset);
  group.bits[idx / 64] &= ~bit;
  --group.used;
  st.partial.insert(g);
  used_bytes_ -= classes_[slot.size_class].slot_bytes;
  --used_slots_;
  if (group.used > 0) return std::nullopt;
  became_empty(slot.size_class, g);
  return g;
}

void SlotAllocator::release_group(int cls, uint32_t group) {
  ClassState& st = state_[cls];
  CHECK(group < st.groups.size() && st.groups[group].reserved && st.groups[group].used == 0);
  st.groups[group].reserved = false;
  st.partial.erase(group);
  st.empty.erase(group);
  empty_bytes_ -= classes_[cls].group_bytes();
  st.absent.insert(group);
  reserved_bytes_ -= classes_[cls].group_bytes();
  trim(cls);
}

void SlotAllocator::trim(int cls) {
  ClassState& st = state_[cls];
  while (!st.groups.empty() && !st.groups.back().reserved) {
    st.absent.erase(static_cast<uint32_t>(st.groups.size() - 1));
    st.groups.pop_back();
  }
}

Status SlotAllocator::mark_used(const Slot& slot, std::string_view owner) {
  auto where = locate(slot);
  if (!where.ok()) return where.status().with_context(fmt::format("chunk '{}'", printable_id(owner)));
  const auto [g, idx] = *where;
  ClassState& st = state_[slot.size_class];
  if (g >= st.groups.size() || !st.groups[g].reserved) add_group(slot.size_class, g);
  Group& group = st.groups[g];
  const uint64_t bit = uint64_t{1} << (idx % 64);
  if (group.bits[idx / 64] & bit) {
    return corrupt("chunk '{}': slot at offset {} of class {} is already used by another chunk",
                   printable_id(owner), slot.offset, slot.size_class);
  }
  group.bits[idx / 64] |= bit;
  const SlotClass& c = classes_[slot.size_class];
  if (group.used == 0) became_used(slot.size_class, g);
  if (++group.used == c.slots_per_group) st.partial.erase(g);
  used_bytes_ += c.slot_bytes;
  ++used_slots_;
  return {};
}

bool SlotAllocator::group_reserved(int cls, uint32_t group) const {
  const ClassState& st = state_[cls];
  return group < st.groups.size() && st.groups[group].reserved;
}

}  // namespace fathom::storage
