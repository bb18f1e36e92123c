// Leveled logging to stderr: log_info("loaded {} tensors", n). Thread-safe; one line per call.
// Level from FATHOM_LOG (debug|info|warn|error|off) or set_log_level(); default info.
// Under MPI, set_log_prefix("rank 3") tags every line.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "base/status.h"

namespace fathom {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
Result<LogLevel> parse_log_level(std::string_view name);
void set_log_prefix(std::string prefix);
void log_write(LogLevel level, std::string_view message);

inline bool log_enabled(LogLevel level) { return level >= log_level(); }

template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kDebug)) log_write(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kInfo)) log_write(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kWarn)) log_write(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_enabled(LogLevel::kError)) log_write(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fathom
