// Trajectory writer and reader. See trajectory.h.
#include "agent/trajectory.h"

#include <chrono>

#include "base/fs.h"
#include "base/strings.h"

namespace fathom::agent {

using json = nlohmann::json;

Result<std::unique_ptr<Trajectory>> Trajectory::open(const std::string& path) {
  auto t = std::make_unique<Trajectory>();
  t->file_ = std::fopen(path.c_str(), "a");
  if (!t->file_) return errno_status(errno, "trajectory '" + path + "'");
  return t;
}

Trajectory::~Trajectory() {
  if (file_) std::fclose(file_);
}

void Trajectory::write(json event) {
  event["t_ms"] = timer_.elapsed_ms();
  event["ts"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

Result<std::vector<json>> read_trajectory(const std::string& path) {
  const std::string text = TRY(read_file(path));
  std::vector<json> events;
  size_t n = 0;
  for (auto line : split(text, '\n')) {
    ++n;
    if (trim(line).empty()) continue;
    if (Status st = check_json_nesting(line, fmt::format("{}: line {}", path, n)); !st.ok())
      return corrupt("{}", st.message());
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("type"))
      return corrupt("{}: line {} is not a trajectory event", path, n);
    events.push_back(std::move(j));
  }
  if (events.empty() || events[0].value("type", "") != "meta")
    return corrupt("{}: does not start with a meta event", path);
  if (events[0].value("version", 0) != 1)
    return unimplemented("{}: trajectory version {} (this build reads 1)", path,
                         events[0].value("version", 0));
  return events;
}

}  // namespace fathom::agent
