// ChatClient: POST /chat/completions on any OpenAI-compatible endpoint (Fathom's server, vLLM,
// llama.cpp, DeepSeek's API) with `tools`; streams with SSE (text deltas to a callback, tool-call
// deltas merged by index) and accepts a plain JSON answer to a streaming request. Retries
// connection failures, 429 and 5xx (3 times, backoff). Internal to the agent component.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"

namespace fathom::agent {

struct ChatClientOptions {
  std::string endpoint;  // base URL, e.g. http://127.0.0.1:8000/v1 (…/chat/completions is appended)
  std::string model;
  std::string api_key;  // sent as a Bearer token when not empty
  bool stream = true;
  int timeout_s = 600;
  int retries = 3;
  std::optional<double> temperature;
  int64_t max_tokens = 0;  // 0: not sent
};

struct ChatResponse {
  nlohmann::json message;  // {"role":"assistant","content":...,"tool_calls":[...]}
  std::string finish_reason;
  nlohmann::json usage;   // as the server reported it (may be null)
  bool streamed = false;  // SSE (false: plain JSON, also when a stream was asked for)
  double ms = 0;
};

class ChatClient {
 public:
  static Result<std::unique_ptr<ChatClient>> create(ChatClientOptions options);
  ~ChatClient();
  // The request body that complete() would send (for trajectories).
  // Ordered JSON: the request goes out with keys in the order the caller built them (a tool's
  // parameters as declared, which the server shows the model).
  nlohmann::ordered_json request_body(const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools) const;
  Result<ChatResponse> complete(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                const std::function<void(const std::string&)>& on_text);
  struct Impl;

 private:
  explicit ChatClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Parses one SSE stream or JSON body incrementally (exposed for tests).
class ChatStreamParser {
 public:
  explicit ChatStreamParser(std::function<void(const std::string&)> on_text) : on_text_(std::move(on_text)) {}
  // Feeds body bytes; SSE is recognised by "data:" lines.
  Status feed(std::string_view data);
  // Finishes: for a plain JSON body parses it whole.
  Result<ChatResponse> finish(bool is_sse);

 private:
  Status handle_event(const std::string& data);
  Status handle_event_unchecked(const std::string& data);
  Result<ChatResponse> finish_unchecked(bool is_sse);
  std::function<void(const std::string&)> on_text_;
  std::string buf_, body_;
  std::string content_, reasoning_;
  nlohmann::json tool_calls_ = nlohmann::json::array();
  std::string finish_reason_;
  nlohmann::json usage_;
  bool done_ = false, saw_event_ = false;
};

}  // namespace fathom::agent
