// CHECK: always-on assertions for broken invariants (never for bad input, which gets a Status).
// A failed CHECK prints file, line, the condition and an optional message, then aborts.
#pragma once

#include <fmt/format.h>

#include <string>

namespace fathom::internal {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) [[unlikely]]                                           \
      ::fathom::internal::check_failed(__FILE__, __LINE__, #cond, {}); \
  } while (0)

// CHECK_MSG(n > 0, "n is {}", n)
#define CHECK_MSG(cond, ...)                                                                   \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::fathom::internal::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)

// CHECK_OK(status_or_result): for calls that cannot fail unless the program is wrong. Works on a
// Status or a Result<T> (both need base/status.h at the use site).
#define CHECK_OK(expr)                                                                        \
  do {                                                                                        \
    const auto& fathom_check_ok_ = (expr);                                                    \
    if (!fathom_check_ok_.ok()) [[unlikely]]                                                  \
      ::fathom::internal::check_failed(__FILE__, __LINE__, #expr,                            \
                                       ::fathom::internal::take_status(fathom_check_ok_).to_string()); \
  } while (0)
