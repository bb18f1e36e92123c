// Status and Result<T>: the one channel for operating errors (bad file, bad request, peer gone,
// disk full). Broken invariants use CHECK (check.h) instead. Exceptions from dependencies are caught
// at the adapter and converted here; they never cross a component boundary.
//
//   Result<Config> parse(std::string_view text);
//   Status load(...) { Config c = TRY(parse(text)); TRY(validate(c)); return {}; }
//
// TRY(expr) works on both Status and Result<T>: on error it returns the Status from the enclosing
// function (which may return Status or any Result<U>); on success it yields the value (or void).
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace fathom {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,    // the caller's input is wrong (bad option, malformed request)
  kNotFound,           // a named thing does not exist (file, tensor, key, model)
  kAlreadyExists,
  kOutOfRange,         // an index, length or position past a limit
  kCorrupt,            // stored data fails validation (bad header, checksum mismatch)
  kIoError,            // the operating system refused (read, write, open, mmap)
  kUnimplemented,      // valid but not supported (a dtype, a quantisation)
  kResourceExhausted,  // a capacity is full (disk, pages, queue)
  kTimeout,
  kUnavailable,        // a peer or service cannot be reached now
  kPermissionDenied,
  kCancelled,
  kFailedPrecondition,  // the system is not in a state to do this
  kInternal,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>", or "ok".
  std::string to_string() const;
  // The same error with "<context>: " in front of the message (for adding a file name, a layer).
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

#define FATHOM_STATUS_FACTORY(fn, code)                                              \
  template <typename... Args>                                                        \
  Status fn(fmt::format_string<Args...> format, Args&&... args) {                    \
    return Status(StatusCode::code, fmt::format(format, std::forward<Args>(args)...)); \
  }
FATHOM_STATUS_FACTORY(invalid_argument, kInvalidArgument)
FATHOM_STATUS_FACTORY(not_found, kNotFound)
FATHOM_STATUS_FACTORY(already_exists, kAlreadyExists)
FATHOM_STATUS_FACTORY(out_of_range, kOutOfRange)
FATHOM_STATUS_FACTORY(corrupt, kCorrupt)
FATHOM_STATUS_FACTORY(io_error, kIoError)
FATHOM_STATUS_FACTORY(unimplemented, kUnimplemented)
FATHOM_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
FATHOM_STATUS_FACTORY(timeout_error, kTimeout)
FATHOM_STATUS_FACTORY(unavailable, kUnavailable)
FATHOM_STATUS_FACTORY(permission_denied, kPermissionDenied)
FATHOM_STATUS_FACTORY(cancelled, kCancelled)
FATHOM_STATUS_FACTORY(failed_precondition, kFailedPrecondition)
FATHOM_STATUS_FACTORY(internal_error, kInternal)
#undef FATHOM_STATUS_FACTORY

// An I/O error carrying strerror(err): "open 'x': No such file or directory". ENOENT maps to
// kNotFound, ENOSPC/EDQUOT to kResourceExhausted, EACCES/EPERM to kPermissionDenied.
Status errno_status(int err, std::string_view what);

namespace internal {
[[noreturn]] void result_check_failed(const Status& status);
}

template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "Result<Status> makes no sense");
  static_assert(!std::is_reference_v<T>, "Result<T&> is not supported; return a pointer");

 public:
  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}  // NOLINT: implicit on purpose
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, Result<T>>>>
  Result(U&& value) : v_(std::in_place_index<1>, T(std::forward<U>(value))) {}  // NOLINT
  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {        // NOLINT
    if (std::get<0>(v_).ok()) v_.template emplace<0>(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return v_.index() == 1; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<0>(v_);
  }
  T& value() & {
    if (!ok()) internal::result_check_failed(std::get<0>(v_));
    return std::get<1>(v_);
  }
  const T& value() const& {
    if (!ok()) internal::result_check_failed(std::get<0>(v_));
    return std::get<1>(v_);
  }
  T&& value() && {
    if (!ok()) internal::result_check_failed(std::get<0>(v_));
    return std::move(std::get<1>(v_));
  }
  T value_or(T fallback) const& { return ok() ? std::get<1>(v_) : std::move(fallback); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline Status take_status(const Status& s) { return s; }
template <typename T>
Status take_status(const Result<T>& r) { return r.status(); }
inline void take_value(Status&&) {}
inline void take_value(Status&) {}
template <typename T>
T take_value(Result<T>&& r) { return std::move(r).value(); }
template <typename T>
T take_value(Result<T>& r) { return std::move(r).value(); }
}  // namespace internal

}  // namespace fathom

// Propagates an error to the caller; yields the value of a Result on success.
#define TRY(expr)                                                          \
  ({                                                                       \
    auto&& fathom_try_result_ = (expr);                                    \
    if (!fathom_try_result_.ok()) [[unlikely]]                             \
      return ::fathom::internal::take_status(fathom_try_result_);         \
    ::fathom::internal::take_value(std::move(fathom_try_result_));        \
  })
