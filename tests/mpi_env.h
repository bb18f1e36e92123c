// A private Open MPI session directory for each test process that starts mpirun. ctest runs
// several mpirun at once, and Open MPI 4 puts every run's session under one shared
// /tmp/ompi.<host>.<uid>, which each run creates and removes: a run that starts while another
// removes it fails in orte_init ("A call to mkdir was unable to create the desired directory ...
// File exists"). Call before each mpirun; the directory is removed when the process exits.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace fathom::testing {

inline std::string ompi_tmpdir_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/fathom_ompi_" + std::to_string(::getpid());
}

inline void use_private_ompi_tmpdir() {
  static const bool once = [] {
    ::setenv("OMPI_MCA_orte_tmpdir_base", ompi_tmpdir_path().c_str(), 1);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ompi_tmpdir_path(), ec);
    });
    return true;
  }();
  (void)once;
}

}  // namespace fathom::testing
