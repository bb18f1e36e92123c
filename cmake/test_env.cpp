// Linked into every unit-test binary: sets FATHOM_BIN and FATHOM_SOURCE_DIR (unless the caller set
// them) before main, since ctest's per-test ENVIRONMENT cannot carry two variables through
// gtest_discover_tests.
#include <cstdlib>

namespace {
struct TestEnv {
  TestEnv() {
    setenv("FATHOM_BIN", FATHOM_TEST_BIN, 0);
    setenv("FATHOM_SOURCE_DIR", FATHOM_TEST_SOURCE_DIR, 0);
  }
} const kTestEnv;
}  // namespace
