// The environment every test that starts mpirun gives it.
//
// A private Open MPI session directory for each test process: ctest runs several mpirun at once,
// and Open MPI 4 puts every run's session under one shared /tmp/ompi.<host>.<uid>, which each run
// creates and removes; a run that starts while another removes it fails in orte_init ("A call to
// mkdir was unable to create the desired directory ... File exists"). The directory is removed
// when the test process exits.
//
// Yield when idle (the ranks oversubscribe this machine's cores), and, for sanitizer builds, Open
// MPI's own allocations suppressed in the ranks' leak reports: its MCA components stay loaded
// (dlclose'd ones leave frames LeakSanitizer cannot name) and malloc stacks are unwound in full
// (Debian's Open MPI has no frame pointers), so the suppressions file sees its frames. Fathom's
// own leaks are still reported. Call before starting mpirun; calling it again is harmless.
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

// `lsan_suppressions`: the suppressions file for Open MPI (tests/pipeline/lsan_openmpi.supp).
inline void use_mpi_test_env(const char* lsan_suppressions) {
  static const bool once = [] {
    ::setenv("OMPI_MCA_orte_tmpdir_base", ompi_tmpdir_path().c_str(), 1);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ompi_tmpdir_path(), ec);
    });
    return true;
  }();
  (void)once;
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
  ::setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
  ::setenv("LSAN_OPTIONS", (std::string("suppressions=") + lsan_suppressions).c_str(), 1);
  const char* asan = std::getenv("ASAN_OPTIONS");
  if (asan == nullptr || std::string(asan).find("fast_unwind_on_malloc") == std::string::npos) {
    ::setenv("ASAN_OPTIONS",
             (std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "fast_unwind_on_malloc=0").c_str(),
             1);
  }
}

}  // namespace fathom::testing
