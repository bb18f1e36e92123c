// ProgressBar: a one-line progress display on stderr for long work (loading, synthesis, benches).
// Drawn only when stderr is a terminal and FATHOM_NO_PROGRESS is unset; otherwise silent, so
// logs and pipes stay clean. Thread-safe: add() may be called from worker threads. Redraws at
// most ten times a second.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/timer.h"

namespace fathom {

enum class ProgressUnit { kItems, kBytes, kTokens };

struct ProgressOptions {
  std::string label;
  uint64_t total = 0;  // 0: unknown (shows count and rate only)
  ProgressUnit unit = ProgressUnit::kItems;
};

class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options);
  ~ProgressBar();  // finishes the line if still open
  void add(uint64_t amount);
  void set(uint64_t done);
  void finish();
  // Text shown after the rate ("loss 3.21 lr 3e-4"); replaces the previous note.
  void set_note(std::string note);
  static bool enabled();  // stderr is a tty and FATHOM_NO_PROGRESS unset

 private:
  void draw(bool final);
  ProgressOptions options_;
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> last_draw_ns_{0};
  std::mutex draw_mutex_;
  Timer timer_;
  bool active_;
  std::atomic<bool> finished_{false};
  std::string note_;  // guarded by draw_mutex_
};

// "1.50 GiB", "512 B"
std::string format_bytes(uint64_t bytes);

}  // namespace fathom
