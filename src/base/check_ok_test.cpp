// CHECK_OK accepts both a Status and a Result<T> and aborts with the error's message.
#include <gtest/gtest.h>

#include "base/check.h"
#include "base/status.h"

namespace fathom {
namespace {

TEST(CheckOkDeathTest, AcceptsStatusAndResult) {
  CHECK_OK(Status());
  CHECK_OK(Result<int>(3));
  EXPECT_DEATH(CHECK_OK(invalid_argument("bad status {}", 1)), "bad status 1");
  EXPECT_DEATH(CHECK_OK(Result<int>(not_found("missing tensor"))), "missing tensor");
}

}  // namespace
}  // namespace fathom
