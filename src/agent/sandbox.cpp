// Sandbox profiles, the helper command line, probing and the report. The helper itself (the
// process that builds the namespaces) is in sandbox_helper.cpp.
#include "agent/sandbox.h"

#include <unistd.h>

#include <algorithm>

#include <cstdlib>

#include "agent/process.h"
#include "base/strings.h"

namespace fathom::agent {

using json = nlohmann::json;

json SandboxProfile::to_json() const {
  return {{"mode", mode},
          {"network", network},
          {"workspace", workspace},
          {"read_only", read_only},
          {"read_write", read_write},
          {"uid", uid},
          {"gid", gid},
          {"limits",
           {{"cpu_seconds", limits.cpu_seconds},
            {"address_space_bytes", limits.address_space_bytes},
            {"open_files", limits.open_files},
            {"file_size_bytes", limits.file_size_bytes},
            {"pids_max", limits.pids_max},
            {"wall_timeout_ms", limits.wall_timeout_ms},
            {"tmp_bytes", limits.tmp_bytes}}}};
}

Result<SandboxProfile> SandboxProfile::from_json(const json& j) {
  SandboxProfile p;
  try {
    p.mode = j.value("mode", p.mode);
    p.network = j.value("network", p.network);
    p.workspace = j.value("workspace", p.workspace);
    p.read_only = j.value("read_only", p.read_only);
    p.read_write = j.value("read_write", p.read_write);
    p.uid = j.value("uid", p.uid);
    p.gid = j.value("gid", p.gid);
    const json l = j.value("limits", json::object());
    p.limits.cpu_seconds = l.value("cpu_seconds", p.limits.cpu_seconds);
    p.limits.address_space_bytes = l.value("address_space_bytes", p.limits.address_space_bytes);
    p.limits.open_files = l.value("open_files", p.limits.open_files);
    p.limits.file_size_bytes = l.value("file_size_bytes", p.limits.file_size_bytes);
    p.limits.pids_max = l.value("pids_max", p.limits.pids_max);
    p.limits.wall_timeout_ms = l.value("wall_timeout_ms", p.limits.wall_timeout_ms);
    p.limits.tmp_bytes = l.value("tmp_bytes", p.limits.tmp_bytes);
  } catch (const std::exception& e) {
    return invalid_argument("sandbox profile: {}", e.what());
  }
  if (p.mode != "auto" && p.mode != "require" && p.mode != "off")
    return invalid_argument("sandbox profile: mode '{}' is not one of auto, require, off", p.mode);
  return p;
}

std::vector<std::string> sandbox_wrap(const SandboxProfile& profile, const std::vector<std::string>& argv) {
  if (profile.mode == "off") return argv;
  // The small launcher next to this executable when it is there (it starts in a fraction of the
  // time of the whole fathom binary), else `fathom agent sandbox`.
  const std::string self = self_executable();
  const std::string launcher = self.substr(0, self.rfind('/') + 1) + "fathom-sandbox";
  std::vector<std::string> out;
  if (self.find('/') != std::string::npos && ::access(launcher.c_str(), X_OK) == 0) {
    out = {launcher};
  } else {
    out = {self, "agent", "sandbox"};
  }
  out.insert(out.end(), {"--profile", profile.to_json().dump(), "--"});
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

bool inside_sandbox() {
  const char* v = std::getenv("FATHOM_SANDBOX");
  return v && std::string_view(v) == "1";
}

std::string SandboxReport::summary() const {
  std::vector<std::string> on, off;
  for (const auto& [k, v] : active.items()) (v.is_boolean() && v.get<bool>() ? on : off).push_back(k);
  std::string s = "active: " + (on.empty() ? std::string("none") : join(on, ", "));
  if (!off.empty()) s += "; NOT active: " + join(off, ", ");
  if (!notes.empty()) s += " (" + join(notes, "; ") + ")";
  return s;
}

Result<SandboxReport> probe_sandbox(const SandboxProfile& profile) {
  SandboxReport report;
  if (profile.mode == "off") {
    report.notes.push_back("sandbox disabled (--sandbox off)");
    report.ok = true;
    return report;
  }
  std::vector<std::string> argv = sandbox_wrap(profile, {"probe"});
  argv.insert(std::find(argv.begin(), argv.end(), "--profile"), "--probe");
  SpawnOptions so{.argv = argv, .env = environment_subset({"PATH", "FATHOM_LOG"}), .pipe_stdin = false};
  auto proc = TRY(ChildProcess::spawn(so));
  std::string out, err;
  char buf[4096];
  for (ssize_t n; (n = ::read(proc->stdout_fd(), buf, sizeof(buf))) > 0;)
    out.append(buf, static_cast<size_t>(n));
  for (ssize_t n; (n = ::read(proc->stderr_fd(), buf, sizeof(buf))) > 0;)
    err.append(buf, static_cast<size_t>(n));
  proc->wait(-1);
  json j = json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return unavailable("sandbox probe failed ({}): {}", proc->describe_exit(), std::string(trim(err)));
  report.ok = j.value("ok", false);
  report.active = j.value("active", json::object());
  report.notes = j.value("notes", std::vector<std::string>{});
  report.uid = j.value("uid", 0u);
  if (!report.ok) return unavailable("sandbox probe: {}", report.summary());
  return report;
}

}  // namespace fathom::agent
