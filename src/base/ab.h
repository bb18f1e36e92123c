// A/B switch for measuring a code change inside one process. Two binaries run back to back on a
// shared VM differ by up to ±20% from memory-bandwidth drift alone, far more than most changes;
// alternating the two variants step by step in one process cancels that drift.
//
// Workflow (docs/DEVELOPING.md, "Measuring a change in one process"): guard the candidate code with
// `if (ab::variant() == 1)` (a temporary edit, never committed), then run
// `fathom bench serve --ab ...`: the engine sets variant 0 and 1 on alternate steps and the bench
// reports the decode time per token of each. Without such a guard both variants are the same code,
// and the ratio measures the harness's own spread (0.987-1.016 in three runs at 32 clients).
//
// Reading the variant is one relaxed atomic load: cheap enough for a kernel's per-call path (not
// for an inner loop).
#pragma once

#include <atomic>

namespace fathom::ab {

inline std::atomic<int> g_variant{0};

inline int variant() {
  return g_variant.load(std::memory_order_relaxed);
}

inline void set_variant(int v) {
  g_variant.store(v, std::memory_order_relaxed);
}

}  // namespace fathom::ab
