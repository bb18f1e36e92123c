// Server: the OpenAI-compatible HTTP API in front of an Engine (cpp-httplib).
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
// GET /metrics (Prometheus text). Streaming is Server-Sent Events as OpenAI sends them
// (chat.completion.chunk objects, tool_calls deltas, an optional usage chunk, "data: [DONE]").
// Errors are OpenAI error objects with the matching HTTP status. A request's pages are freed as
// soon as its streaming client goes away. Bounded: request bodies (413), the engine's queue
// (429), the HTTP worker pool, read/write timeouts (slow clients).
//
// Thread safety: handlers run on the HTTP pool; they only submit to the engine and read streams.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace fathom {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: any free port (see Server::port())
  std::string served_model_name;        // also answers to "default"
  std::string api_key;                  // non-empty: every route but /health needs Bearer auth
  size_t max_body_bytes = 4u << 20;
  int http_threads = 256;               // concurrent connections served
  int read_timeout_s = 10;              // a client that sends nothing for this long is dropped
  int write_timeout_s = 30;
  // With tools active, a call's name is decoded constrained to the offered tools' names
  // (engine/tool_name_constraint.h); false lets the model write any name (to measure it unaided).
  bool constrain_tool_names = true;
  // How the constrained name is picked among two or more offered tools (engine.h).
  ToolNameSelection tool_name_selection = ToolNameSelection::kWhole;
  // With kWhole: the weight of a head's fence and first key against its name
  // (GenerationRequest::tool_head_weight).
  double tool_head_weight = kDefaultToolHeadWeight;
  // Testing only: honour a request field "fathom_test_output" (text the model is made to emit,
  // special tokens included) so tool-call round trips can be tested with random weights.
  bool enable_test_hooks = false;
  // Testing only (with enable_test_hooks): outputs forced, in order, on the chat completions that
  // carry no "fathom_test_output" — so a client that cannot add fields (the agent) can be scripted.
  std::vector<std::string> test_outputs;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> create(Engine& engine, const ServerOptions& options);
  ~Server();
  // Binds the socket (so port() is known and clients can connect), then serves until stop().
  Status bind();
  Status serve();
  void stop();
  int port() const;
  const std::string& model_name() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
