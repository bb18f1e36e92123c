// Internals shared by the sandbox helper's outside (sandbox_helper.cpp) and inside
// (sandbox_child.cpp) halves. Not a public header.
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "agent/sandbox.h"

namespace fathom::agent {

struct ChildSetup {
  SandboxProfile profile;  // paths already canonical
  std::vector<std::string> argv;
  bool probe = false;
  int clone_flags = 0;
  uid_t uid = 0;  // the uid/gid inside (and, through the id map, outside)
  gid_t gid = 0;
  std::vector<std::pair<std::string, int>> idmapped;  // path -> detached idmapped mount fd
  int go_fd = -1;      // the child waits for one byte: id maps and cgroup are in place
  int err_fd = -1;     // setup or exec errors, as text (close-on-exec)
  int report_fd = -1;  // probe findings, one JSON object per line
  nlohmann::json report = nlohmann::json::object();  // the outside half's findings
};

// Clones the sandbox child (PID 1 of the new namespaces when clone_flags has CLONE_NEWPID).
// Returns its pid, or -1 with errno set.
pid_t clone_child(ChildSetup* setup);

// argv as a null-terminated char* array (pointing into `args`).
std::vector<char*> to_argv(const std::vector<std::string>& args);

}  // namespace fathom::agent
