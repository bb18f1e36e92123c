// CHECK_OK accepts both a Status and a Result<T> and aborts with the error's message.
#include <gtest/gtest.h>

#include "base/check.h"
#include "base/status.h"

namespace fathom {
namespace {

Result<int> answer(bool ok) {
  if (!ok) return not_found("missing tensor");
  return 42;
}

TEST(CheckOkDeathTest, AcceptsStatusAndResult) {
  const Status fine;
  CHECK_OK(fine);
  CHECK_OK(answer(true));
  EXPECT_DEATH(CHECK_OK(invalid_argument("bad status {}", 1)), "bad status 1");
  EXPECT_DEATH(CHECK_OK(answer(false)), "missing tensor");
}

}  // namespace
}  // namespace fathom
