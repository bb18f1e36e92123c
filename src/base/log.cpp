// Logging sink: formats "fathom I 15:04:05.123 [prefix] message" lines to stderr under a mutex.
#include "base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace fathom {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("FATHOM_LOG");
  if (env == nullptr) return LogLevel::kInfo;
  auto level = parse_log_level(env);
  return level.ok() ? *level : LogLevel::kInfo;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

std::string& prefix_ref() {
  static std::string prefix;
  return prefix;
}

}  // namespace

void set_log_level(LogLevel level) { level_ref().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed)); }

Result<LogLevel> parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off" || name == "none") return LogLevel::kOff;
  return invalid_argument("log level '{}' is not one of debug, info, warn, error, off", name);
}

void set_log_prefix(std::string prefix) {
  std::lock_guard lock(sink_mutex());
  prefix_ref() = std::move(prefix);
}

void log_write(LogLevel level, std::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E', '?'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::lock_guard lock(sink_mutex());
  const std::string& prefix = prefix_ref();
  std::fprintf(stderr, "fathom %c %02d:%02d:%02d.%03d %s%s%.*s\n", kLetters[static_cast<int>(level)],
               tm.tm_hour, tm.tm_min, tm.tm_sec, ms, prefix.c_str(), prefix.empty() ? "" : " ",
               static_cast<int>(message.size()), message.data());
}

}  // namespace fathom
