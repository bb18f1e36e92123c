// ProgressBar drawing: "label [#####.....] 42% 1.2 GiB/2.9 GiB 310 MiB/s eta 5s".
#include "base/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace fathom {

std::string format_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

bool ProgressBar::enabled() {
  static const bool on = isatty(STDERR_FILENO) && std::getenv("FATHOM_NO_PROGRESS") == nullptr;
  return on;
}

ProgressBar::ProgressBar(ProgressOptions options) : options_(std::move(options)), active_(enabled()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::add(uint64_t amount) {
  done_.fetch_add(amount, std::memory_order_relaxed);
  draw(false);
}

void ProgressBar::set(uint64_t done) {
  done_.store(done, std::memory_order_relaxed);
  draw(false);
}

void ProgressBar::set_note(std::string note) {
  if (!active_) return;
  {
    std::lock_guard lock(draw_mutex_);
    note_ = std::move(note);
  }
  draw(false);
}

void ProgressBar::finish() {
  if (!active_ || finished_) return;
  draw(true);
}

void ProgressBar::draw(bool final) {
  if (!active_) return;
  const uint64_t now = now_ns();
  const uint64_t last = last_draw_ns_.load(std::memory_order_relaxed);
  if (!final && now - last < 100'000'000ull) return;
  std::unique_lock lock(draw_mutex_, std::defer_lock);
  if (final) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  if (finished_) return;
  last_draw_ns_.store(now, std::memory_order_relaxed);
  const uint64_t done = done_.load(std::memory_order_relaxed);
  const double secs = timer_.elapsed_s();
  const double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
  auto amount = [&](uint64_t v) {
    return options_.unit == ProgressUnit::kBytes ? format_bytes(v) : fmt::format("{}", v);
  };
  const char* unit = options_.unit == ProgressUnit::kTokens ? " tok" : "";
  std::string line = fmt::format("\r{} ", options_.label);
  if (options_.total > 0) {
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(options_.total));
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    line += '[' + std::string(static_cast<size_t>(filled), '#') +
            std::string(static_cast<size_t>(width - filled), '.') + ']';
    line += fmt::format(" {:3.0f}% {}/{}{}", frac * 100.0, amount(done), amount(options_.total), unit);
    if (rate > 0 && done < options_.total) {
      line += fmt::format(" eta {:.0f}s", static_cast<double>(options_.total - done) / rate);
    }
  } else {
    line += fmt::format("{}{}", amount(done), unit);
  }
  if (options_.unit == ProgressUnit::kBytes) {
    line += fmt::format(" {}/s", format_bytes(static_cast<uint64_t>(rate)));
  } else {
    line += fmt::format(" {:.1f}{}/s", rate, unit);
  }
  if (!note_.empty()) line += " " + note_;
  line += "\x1b[K";
  if (final) {
    line += '\n';
    finished_ = true;
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace fathom
