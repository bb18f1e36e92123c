// The test harness for `mpirun -np N fathom pipeline train ...`: runs it, captures stdout, stderr
// and the exit code, parses the last stdout line as JSON, with the Open MPI and sanitizer
// environment of tests/mpi_env.h.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "../mpi_env.h"

namespace fathom::pipeline::testing {

struct MpiRun {
  int rc = -1;
  std::string out, err;
  nlohmann::json json;  // the last stdout line, when it parses
};

// A path under TMPDIR unique to this process; whatever is left at it is removed when the process
// exits (configs and outputs the tests write there and do not remove themselves).
inline std::string temp_path(const std::string& name) {
  static struct Made {
    std::vector<std::string> paths;
    ~Made() {
      for (const auto& p : paths) {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    }
  } made;
  const char* dir = std::getenv("TMPDIR");
  std::string path =
      std::string(dir ? dir : "/tmp") + "/fathom_pipeline_mpi_" + std::to_string(::getpid()) + "_" + name;
  made.paths.push_back(path);
  return path;
}

inline MpiRun mpirun(int ranks, const std::string& args, int timeout_s = 240) {
  const char* bin = std::getenv("FATHOM_BIN");
  EXPECT_NE(bin, nullptr) << "FATHOM_BIN is not set (run through ctest)";
  fathom::testing::use_mpi_test_env(FATHOM_LSAN_OPENMPI_SUPP);
  const std::string err_path = temp_path("stderr");
  const std::string cmd = "timeout " + std::to_string(timeout_s) +
                          " mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " " +
                          (bin ? bin : "fathom") + " pipeline train --threads 1 " + args + " 2>" + err_path;
  MpiRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  const size_t end = r.out.find_last_not_of('\n');
  if (end != std::string::npos) {
    const size_t start = r.out.rfind('\n', end);
    const std::string last = r.out.substr(start == std::string::npos ? 0 : start + 1,
                                          end + 1 - (start == std::string::npos ? 0 : start + 1));
    r.json = nlohmann::json::parse(last, nullptr, false);
  }
  return r;
}

}  // namespace fathom::pipeline::testing
