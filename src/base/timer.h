// Monotonic time: now_ns() and a Timer for measuring spans. Never wall-clock.
#pragma once

#include <chrono>
#include <cstdint>

namespace fathom {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

class Timer {
 public:
  Timer() : start_ns_(now_ns()) {}
  void reset() { start_ns_ = now_ns(); }
  uint64_t elapsed_ns() const { return now_ns() - start_ns_; }
  double elapsed_s() const { return static_cast<double>(elapsed_ns()) * 1e-9; }
  double elapsed_ms() const { return static_cast<double>(elapsed_ns()) * 1e-6; }

 private:
  uint64_t start_ns_;
};

}  // namespace fathom
