// Internal: Server::Impl, shared by server.cpp (routes, streaming) and metrics.cpp.
#pragma once

#include <httplib.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/openai.h"
#include "server/server.h"

namespace fathom {

// What a chat stream needs to know besides the engine events.
struct ChatContext {
  std::string id;
  int64_t created = 0;
  bool include_usage = false;
  bool logprobs = false;
  bool tools_active = false;
  std::string forced_prefix;  // tool-call markup the prompt ended with (tool_choice)
};

struct StreamState {
  std::shared_ptr<RequestStream> stream;
  ChatContext ctx;
  ToolCallParser parser;
  bool started = false;
  std::vector<std::vector<ToolCallDelta>> pending_calls;  // per call index, until complete
  size_t n_calls = 0;                                     // calls already sent
  int64_t text_offset = 0;
};

struct Server::Impl {
  Engine* engine = nullptr;
  Model* model = nullptr;
  ServerOptions options;
  std::string model_name;
  std::string fingerprint;
  int64_t started = 0;
  int bound_port = -1;
  std::unique_ptr<httplib::Server> http;
  std::unique_ptr<ChatPromptBuilder> builder;
  // The five markers a tool call is written with: kept in the reply's text (the parser reads them)
  // when the request offers tools; otherwise a reply that starts a call ends there.
  std::vector<int32_t> tool_marker_ids;
  // The text of every marker here. A reply's stray or malformed call markup comes back as plain
  // content (the parser passes it through), and with `ignore_eos` a reply runs on past the markers
  // that end a turn; the markers themselves are cut out of `content` either way.
  std::vector<std::string> marker_texts;
  std::string without_markers(std::string text) const;
  // Every other control token the detokenizer would keep as text (DeepSeek-V3's chat markers are
  // added tokens not flagged special: <｜User｜>, <｜Assistant｜>, the tool-output markers, FIM):
  // none of them can be part of an assistant's reply, so a chat reply that produces one has ended
  // its turn. Generation stops there (unless the request sets `ignore_eos`, which treats them as
  // it treats EOS) and the marker never reaches `content`. Among them is <｜tool▁outputs▁begin｜>:
  // only the client writes tool outputs.
  std::vector<int32_t> turn_end_ids;
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> requests;  // (route, status) -> count
  size_t next_test_output = 0;                               // into options.test_outputs (under mu)

  struct Collected {
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<SampleResult> logprobs;
    FinishReason finish = FinishReason::kNone;
    Usage usage;
    Status error;
  };
  struct ChatOutcome {
    std::string content;
    std::vector<ToolCall> tool_calls;
    std::string finish;
  };

  void install_routes();
  void send_error(httplib::Response& res, const ApiError& e);
  void count(const std::string& route, int status);
  bool parse_body(const httplib::Request& req, httplib::Response& res, nlohmann::ordered_json* body);
  bool check_model(const std::string& name, httplib::Response& res);
  nlohmann::ordered_json usage_json(const Usage& u) const;
  nlohmann::ordered_json token_logprob_json(const SampleResult& r) const;
  nlohmann::ordered_json completion_logprobs(const std::vector<SampleResult>& lps, int64_t offset) const;
  Collected collect(const std::shared_ptr<RequestStream>& stream);
  ChatOutcome chat_outcome(const ChatContext& ctx, const Collected& c) const;
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_models(httplib::Response& res);
  void stream_chat(httplib::Response& res, std::shared_ptr<RequestStream> stream, ChatContext ctx);
  nlohmann::ordered_json chunk(const StreamState& st, nlohmann::ordered_json delta,
                               nlohmann::ordered_json finish, bool chat) const;
  bool stream_step(StreamState& st, httplib::DataSink& sink, bool chat);
  template <typename Write>
  bool write_chat_deltas(StreamState& st, const GenerationEvent& ev, Write& write);
  bool cancel(StreamState& st);
  std::string metrics_text();
};

}  // namespace fathom
