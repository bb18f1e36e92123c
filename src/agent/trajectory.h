// Trajectory: the JSONL record of an agent run (format version 1, docs/agent.md): one object per
// line with "type" (meta, user, model_request, model_response, model_error, tool_call, tool_result,
// context, final), "t_ms" since the file was opened and "ts" (Unix seconds). Lines are written
// whole and flushed, so a crash leaves a readable prefix. Thread-safe. Internal.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/timer.h"

namespace fathom::agent {

class Trajectory {
 public:
  static Result<std::unique_ptr<Trajectory>> open(const std::string& path);
  ~Trajectory();
  void write(nlohmann::json event);

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  Timer timer_;
};

// Reads a trajectory; a malformed line is an error naming its number.
Result<std::vector<nlohmann::json>> read_trajectory(const std::string& path);

}  // namespace fathom::agent
