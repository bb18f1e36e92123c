// DeepSeek-V3's chat template, rendered natively (the same string its Jinja template produces,
// checked against the npm reference), the tool definitions rendered into the system prompt in a
// documented, stable format (docs/tokenizer.md), and the incremental tool-call parser that turns
// generated text in DeepSeek's format back into OpenAI `tool_calls`.
//
// Not a Jinja engine: a tokenizer_config.json whose chat_template is not DeepSeek-V3's is refused
// by ChatTemplate::for_tokenizer unless the caller asks for the DeepSeek-V3 format explicitly.
// Thread safety: ChatTemplate is immutable (share it); a ToolCallParser is one stream's state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fathom {

class Tokenizer;

struct ToolCall {
  std::string id;                 // "call_..." (OpenAI); DeepSeek's template does not render it
  std::string type = "function";  // rendered before <｜tool▁sep｜>
  std::string name;
  std::string arguments;  // JSON text, as OpenAI's function.arguments
};

struct ChatMessage {
  std::string role;                    // system | user | assistant | tool; others are ignored
  std::optional<std::string> content;  // nullopt is JSON null: an assistant turn with tool calls
  std::vector<ToolCall> tool_calls;    // assistant only; rendered only when content is null
  std::string tool_call_id;            // tool only; not rendered by DeepSeek's template
};

struct ToolDefinition {
  std::string name;
  std::string description;
  std::string parameters_json = "{}";  // the JSON schema, serialised as given (key order kept)
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;  // end with <｜Assistant｜> (unless tool outputs are open)
  bool add_bos = true;                // start with the BOS string, as the template does
};

enum class ChatFormat : uint8_t { kDeepSeekV3 };

class ChatTemplate {
 public:
  // The format of tok.chat_template(): DeepSeek-V3's template (or none) gives kDeepSeekV3; any
  // other template is kUnimplemented unless `force` names the format to use instead.
  static Result<ChatTemplate> for_tokenizer(const Tokenizer& tok, std::optional<ChatFormat> force = {});
  static ChatTemplate deepseek_v3(std::string bos_token = "<｜begin▁of▁sentence｜>");

  // Exactly what DeepSeek-V3's Jinja template renders for `messages` (its quirks included: see
  // docs/tokenizer.md), with `tools` rendered by render_tools_prompt() and appended to the
  // system prompt. A message with an unknown role is skipped, as the template does.
  Result<std::string> render(std::span<const ChatMessage> messages,
                             std::span<const ToolDefinition> tools = {},
                             const ChatRenderOptions& options = {}) const;
  ChatFormat format() const { return format_; }
  const std::string& bos_token() const { return bos_token_; }

 private:
  ChatTemplate(ChatFormat format, std::string bos) : format_(format), bos_token_(std::move(bos)) {}
  ChatFormat format_;
  std::string bos_token_;
};

// The tools section appended to the system prompt ("" for no tools); format in docs/tokenizer.md.
Result<std::string> render_tools_prompt(std::span<const ToolDefinition> tools);

// OpenAI request JSON -> our types. `messages_json` is the "messages" array; content may be a
// string, null, or an array of {"type":"text","text":...} parts (joined with "\n").
Result<std::vector<ChatMessage>> parse_chat_messages(std::string_view messages_json);
// The "tools" array: [{"type":"function","function":{"name","description","parameters"}}].
Result<std::vector<ToolDefinition>> parse_tool_definitions(std::string_view tools_json);

// ---- Tool-call parsing ------------------------------------------------------------------------
//
// Generated text (decoded with the chat tokens kept) looks like
//   content<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//   <｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
// (V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` is accepted too.)

// One streaming delta of one call, as OpenAI's `choices[].delta.tool_calls[]`: the first delta
// of a call carries id, type and name; later ones carry argument text only.
struct ToolCallDelta {
  int32_t index = 0;
  std::string id;         // first delta only
  std::string name;       // first delta only
  std::string arguments;  // the next piece of the arguments text
};

struct ParserDelta {
  std::string content;  // text for the user, in order
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

struct ToolCallParserOptions {
  uint64_t id_seed = 0;           // ids are "call_" + 24 chars from this seed (0: from the OS)
  size_t max_header_bytes = 512;  // a header not ending within this many bytes is malformed (content)
};

class ToolCallParser {
 public:
  explicit ToolCallParser(const ToolCallParserOptions& options = {});

  // Feeds the next piece of generated text; returns what is now certain. Text that may be the
  // start of a marker is held back until the next push or finish.
  ParserDelta push(std::string_view text);
  // End of generation: flushes what was held back. A call cut off before <｜tool▁call▁end｜> is
  // returned with the arguments seen so far and error() says so; a call header cut off before
  // its name was complete is returned as plain content.
  ParserDelta finish();

  // ok, or the first problem seen: a truncated call, a malformed header (returned as content),
  // arguments that are not a JSON object (the call keeps the raw text).
  const Status& error() const { return error_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }  // everything parsed so far
  const std::string& content() const { return content_; }

 private:
  enum class State : uint8_t { kContent, kBetweenCalls, kHeader, kArgs };
  // Each step consumes from buf_ and returns false when it needs more input.
  bool step_content(bool at_end, ParserDelta* out);
  bool step_between(bool at_end, ParserDelta* out);
  bool step_header(bool at_end, ParserDelta* out);
  bool step_args(bool at_end, ParserDelta* out);
  void malformed_header(size_t n, std::string_view why, ParserDelta* out);
  void emit_content(std::string_view text, ParserDelta* out);
  void emit_args(std::string_view text, ParserDelta* out);
  void close_call(bool complete, ParserDelta* out);
  void note_error(Status s);
  std::string next_id();

  ToolCallParserOptions options_;
  State state_ = State::kContent;
  std::string buf_;  // input not consumed yet
  bool args_fence_checked_ = false;
  bool args_fenced_ = false;
  std::vector<ToolCall> calls_;
  std::string content_;
  Status error_;
  uint64_t rng_ = 0;
};

struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> tool_calls;
  Status error;
};
// One-shot parse: the same as pushing all of `text` and finishing.
ParsedToolCalls parse_tool_calls(std::string_view text, const ToolCallParserOptions& options = {});

}  // namespace fathom
