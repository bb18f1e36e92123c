// Status names, formatting and the failure paths of Result/CHECK.
#include "base/status.h"

#include <cstdio>
#include <cstdlib>

#include "base/check.h"

namespace fathom {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kAlreadyExists: return "already exists";
    case StatusCode::kOutOfRange: return "out of range";
    case StatusCode::kCorrupt: return "corrupt";
    case StatusCode::kIoError: return "i/o error";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kPermissionDenied: return "permission denied";
    case StatusCode::kCancelled: return "cancelled";
    case StatusCode::kFailedPrecondition: return "failed precondition";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

Status errno_status(int err, std::string_view what) {
  StatusCode code = StatusCode::kIoError;
  switch (err) {
    case ENOENT: code = StatusCode::kNotFound; break;
    case ENOSPC:
    case EDQUOT: code = StatusCode::kResourceExhausted; break;
    case EACCES:
    case EPERM: code = StatusCode::kPermissionDenied; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    case ETIMEDOUT: code = StatusCode::kTimeout; break;
    default: break;
  }
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

namespace internal {

void result_check_failed(const Status& status) {
  check_failed("base/status.h", 0, "Result::value() on an error", status.to_string());
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fflush(stdout);
  if (msg.empty()) {
    std::fprintf(stderr, "fathom: CHECK failed at %s:%d: %s\n", file, line, cond);
  } else {
    std::fprintf(stderr, "fathom: CHECK failed at %s:%d: %s: %s\n", file, line, cond, msg.c_str());
  }
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal
}  // namespace fathom
