// DeepSeek-V3's chat template rendered natively, the tools section of the system prompt, and the
// OpenAI JSON -> ChatMessage/ToolDefinition adapters. render() reproduces the Jinja template in
// DeepSeek-V3's tokenizer_config.json statement by statement (its namespace flags included), so
// its quirks are reproduced too; docs/tokenizer.md lists them.
#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fathom {

namespace {

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";

using OrderedJson = nlohmann::ordered_json;

void append_call(const ToolCall& c, std::string* out) {
  *out += c.type;
  *out += kSep;
  *out += c.name;
  *out += "\n```json\n";
  *out += c.arguments;
  *out += "\n```";
  *out += kCallEnd;
}

Result<const std::string*> content_of(const ChatMessage& m, size_t i) {
  if (!m.content) return invalid_argument("chat: messages[{}] ({}) has null content", i, m.role);
  return &*m.content;
}

// The template's namespace: ns.is_first, ns.is_tool, ns.is_output_first.
struct RenderState {
  bool is_first = false, is_tool = false, is_output_first = true;
};

Status render_message(const ChatMessage& m, size_t i, RenderState* ns, std::string* out) {
  if (m.role == "user") {
    ns->is_tool = false;
    *out += kUser;
    *out += *TRY(content_of(m, i));
  } else if (m.role == "assistant" && !m.content) {
    ns->is_tool = false;
    for (const ToolCall& c : m.tool_calls) {
      if (!ns->is_first) {
        *out += kAssistant;
        *out += kCallsBegin;
        *out += kCallBegin;
        append_call(c, out);
        ns->is_first = true;
      } else {
        *out += "\n";
        *out += kCallBegin;
        append_call(c, out);
        *out += kCallsEnd;
        *out += kEos;
      }
    }
  } else if (m.role == "assistant") {
    if (ns->is_tool) {
      *out += kOutputsEnd;
      ns->is_tool = false;
    } else {
      *out += kAssistant;
    }
    *out += *m.content;
    *out += kEos;
  } else if (m.role == "tool") {
    ns->is_tool = true;
    const std::string& content = *TRY(content_of(m, i));
    if (ns->is_output_first) {
      *out += kOutputsBegin;
      ns->is_output_first = false;
    } else {
      *out += "\n";
    }
    *out += kOutputBegin;
    *out += content;
    *out += kOutputEnd;
  }
  return {};
}

Result<std::string> compact_json(std::string_view text, std::string_view what) {
  OrderedJson j = OrderedJson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("{} is not valid JSON", what);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

const std::string& deepseek_v3_chat_template() {
  static const std::string t =
      "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set "
      "ns = "
      "namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) "
      "%}{%- for "
      "message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set "
      "ns.system_prompt = "
      "ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set "
      "ns.system_prompt = "
      "ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor "
      "%}{{bos_token}}{{ns."
      "system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = "
      "false "
      "-%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and "
      "message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- "
      "if not "
      "ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
      "'<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] "
      "+ "
      "'\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + "
      "'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + "
      "'```json' + "
      "'\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜>"
      "<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' "
      "and "
      "message['content'] is not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] "
      "+ "
      "'<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + "
      "message['content'] + "
      "'<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set "
      "ns.is_tool = true "
      "-%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + "
      "message['content'] + "
      "'<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else "
      "%}{{'\n<｜tool▁output▁begin｜>' + "
      "message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool "
      "%}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool "
      "%}{{'<｜Assistant｜>'}}{% endif %}";
  return t;
}

Result<ChatTemplate> ChatTemplate::for_tokenizer(const Tokenizer& tok, std::optional<ChatFormat> force) {
  std::string bos = tok.bos_token().empty() ? "<｜begin▁of▁sentence｜>" : tok.bos_token();
  if (force) return ChatTemplate(*force, std::move(bos));
  const std::string& t = tok.chat_template();
  if (t.empty() || t == deepseek_v3_chat_template())
    return ChatTemplate(ChatFormat::kDeepSeekV3, std::move(bos));
  return unimplemented(
      "chat template: this tokenizer_config.json's chat_template ({} bytes) is not DeepSeek-V3's; "
      "Fathom renders DeepSeek-V3's format natively (force it with ChatFormat::kDeepSeekV3)",
      t.size());
}

ChatTemplate ChatTemplate::deepseek_v3(std::string bos_token) {
  return ChatTemplate(ChatFormat::kDeepSeekV3, std::move(bos_token));
}

Result<std::string> ChatTemplate::render(std::span<const ChatMessage> messages,
                                         std::span<const ToolDefinition> tools,
                                         const ChatRenderOptions& options) const {
  std::string system;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "system") continue;
    const std::string& content = *TRY(content_of(messages[i], i));
    if (!first_system) system += "\n\n";
    system += content;
    first_system = false;
  }
  const std::string tools_text = TRY(render_tools_prompt(tools));
  if (!tools_text.empty()) {
    if (!first_system) system += "\n\n";
    system += tools_text;
  }
  std::string out;
  if (options.add_bos) out += bos_token_;
  out += system;
  RenderState ns;
  for (size_t i = 0; i < messages.size(); ++i) TRY(render_message(messages[i], i, &ns, &out));
  if (ns.is_tool) out += kOutputsEnd;
  if (options.add_generation_prompt && !ns.is_tool) out += kAssistant;
  return out;
}

Result<std::string> render_tools_prompt(std::span<const ToolDefinition> tools) {
  if (tools.empty()) return std::string();
  std::string out = "## Tools\n\nYou can call the following tools.\n";
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolDefinition& t = tools[i];
    if (t.name.empty()) return invalid_argument("tools[{}]: the name is empty", i);
    const std::string params =
        TRY(compact_json(t.parameters_json, fmt::format("tools[{}] ('{}').parameters", i, t.name)));
    out += fmt::format("\n### {}\n", t.name);
    if (!t.description.empty()) out += fmt::format("Description: {}\n", t.description);
    out += fmt::format("Parameters: {}\n", params);
  }
  out += fmt::format(
      "\nTo call tools, reply with:\n{}{}function{}TOOL_NAME\n```json\nARGUMENTS\n```{}{}\nwhere TOOL_NAME "
      "is one of the "
      "tools above and ARGUMENTS is a JSON object that follows its Parameters schema. Put each further call "
      "on a new "
      "line, starting with {}.",
      kCallsBegin, kCallBegin, kSep, kCallEnd, kCallsEnd, kCallBegin);
  return out;
}

namespace {

Result<std::optional<std::string>> parse_content(const nlohmann::json& m, size_t i) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (!it->is_array())
    return invalid_argument("messages[{}].content must be a string, null or an array of parts", i);
  std::string joined;
  for (size_t k = 0; k < it->size(); ++k) {
    const auto& part = (*it)[k];
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return unimplemented(
          "messages[{}].content[{}]: only {{\"type\": \"text\", \"text\": ...}} parts are supported", i, k);
    }
    if (k) joined += "\n";
    joined += part["text"].get<std::string>();
  }
  return std::optional<std::string>(std::move(joined));
}

Result<ToolCall> parse_tool_call(const nlohmann::json& c, size_t i, size_t k) {
  const std::string where = fmt::format("messages[{}].tool_calls[{}]", i, k);
  if (!c.is_object()) return invalid_argument("{} must be an object", where);
  ToolCall call;
  if (auto id = c.find("id"); id != c.end() && id->is_string()) call.id = id->get<std::string>();
  if (auto type = c.find("type"); type != c.end() && type->is_string()) call.type = type->get<std::string>();
  auto fn = c.find("function");
  if (fn == c.end() || !fn->is_object()) return invalid_argument("{}.function must be an object", where);
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string())
    return invalid_argument("{}.function.name must be a string", where);
  call.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_string()) {
    call.arguments = args->get<std::string>();
  } else {
    call.arguments = args->dump();  // some clients send an object; render it as compact JSON
  }
  return call;
}

}  // namespace

Result<std::vector<ChatMessage>> parse_chat_messages(std::string_view messages_json) {
  nlohmann::json j = nlohmann::json::parse(messages_json.begin(), messages_json.end(), nullptr, false);
  if (j.is_discarded()) return invalid_argument("messages: not valid JSON");
  if (!j.is_array()) return invalid_argument("messages: must be an array");
  std::vector<ChatMessage> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    if (!m.is_object()) return invalid_argument("messages[{}] must be an object", i);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return invalid_argument("messages[{}].role must be a string", i);
    ChatMessage msg;
    msg.role = role->get<std::string>();
    msg.content = TRY(parse_content(m, i));
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!calls->is_array()) return invalid_argument("messages[{}].tool_calls must be an array", i);
      for (size_t k = 0; k < calls->size(); ++k)
        msg.tool_calls.push_back(TRY(parse_tool_call((*calls)[k], i, k)));
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && id->is_string())
      msg.tool_call_id = id->get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

Result<std::vector<ToolDefinition>> parse_tool_definitions(std::string_view tools_json) {
  OrderedJson j = OrderedJson::parse(tools_json.begin(), tools_json.end(), nullptr, false);
  if (j.is_discarded()) return invalid_argument("tools: not valid JSON");
  if (!j.is_array()) return invalid_argument("tools: must be an array");
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& t = j[i];
    if (!t.is_object()) return invalid_argument("tools[{}] must be an object", i);
    if (t.contains("type") && t["type"] != "function") {
      return unimplemented("tools[{}].type '{}' is not supported (only \"function\")", i, t["type"].dump());
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return invalid_argument("tools[{}].function must be an object", i);
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
      return invalid_argument("tools[{}].function.name must be a non-empty string", i);
    }
    ToolDefinition d;
    d.name = name->get<std::string>();
    if (auto desc = fn->find("description"); desc != fn->end() && desc->is_string())
      d.description = desc->get<std::string>();
    if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
      if (!p->is_object()) return invalid_argument("tools[{}].function.parameters must be an object", i);
      d.parameters_json = p->dump();
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace fathom
