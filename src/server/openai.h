// The OpenAI API surface as data: request parsing/validation into engine requests, and the JSON
// of responses, stream chunks and errors. No networking here (server.cpp does that), so every
// rule is unit-testable.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"

namespace fathom {

// An API error: HTTP status plus OpenAI's {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
  nlohmann::ordered_json to_json() const;
};

ApiError api_error_from_status(const Status& st, std::string_view param = {});

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;
  bool stream = false;
  bool include_usage = false;
  bool json_object = false;
  GenerationRequest gen;      // sampling, stop, limits (prompt filled in by the server)
  std::optional<int64_t> max_tokens;
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_tokens;  // when the prompt is given as token ids
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  GenerationRequest gen;
  std::optional<int64_t> max_tokens;
};

// Parse and validate; errors name the parameter (ApiError.param) and the rule.
Result<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body, ApiError* error);
Result<CompletionRequest> parse_completion_request(const nlohmann::ordered_json& body, ApiError* error);

// Shared sampling fields (temperature, top_p, ..., stop, logprobs, seed).
bool parse_sampling(const nlohmann::ordered_json& body, GenerationRequest& gen, bool chat, ApiError* error);

// Builds chat prompts: the chat template rendered with every user-supplied string (message
// contents, tool-call names and arguments) as untrusted text — control-token strings in it stay
// text — and the template's own markup as control tokens. Made once per server.
class ChatPromptBuilder {
 public:
  static Result<ChatPromptBuilder> create(const Tokenizer& tok);
  Result<std::vector<int32_t>> build(const ChatRequest& req) const;

 private:
  const Tokenizer* tok_ = nullptr;
  std::optional<ChatTemplate> tmpl_;
  std::vector<std::vector<std::pair<std::string, int32_t>>> specials_by_byte_;  // [first byte] -> (text, id)
  std::vector<std::string> specials_;
};

std::string new_request_id(std::string_view prefix);  // "chatcmpl-<24 random chars>"

}  // namespace fathom
