// OpenAI request parsing and validation, and prompt construction for chat requests.
#include "server/openai.h"

#include <algorithm>
#include <charconv>
#include <random>
#include <set>

#include "engine/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

// Ordered: a request's key order is kept (tool parameters reach the prompt and the argument
// constraint in the order the client declared them, as OpenAI keeps them).
using json = nlohmann::ordered_json;

bool fail(ApiError* e, std::string param, std::string message) {
  e->http_status = 400;
  e->type = "invalid_request_error";
  e->param = std::move(param);
  e->message = std::move(message);
  return false;
}

bool get_number(const json& b, const char* key, double lo, double hi, bool lo_open, double* out, ApiError* e) {
  if (!b.contains(key) || b[key].is_null()) return true;
  if (!b[key].is_number()) return fail(e, key, fmt::format("'{}' must be a number", key));
  const double v = b[key].get<double>();
  if (v > hi || v < lo || (lo_open && v == lo)) {
    return fail(e, key, fmt::format("'{}' is {}; it must be within {}{}, {}]", key, v, lo_open ? "(" : "[", lo, hi));
  }
  *out = v;
  return true;
}

bool get_int(const json& b, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out, ApiError* e) {
  if (!b.contains(key) || b[key].is_null()) return true;
  if (!b[key].is_number_integer()) return fail(e, key, fmt::format("'{}' must be an integer", key));
  const int64_t v = b[key].get<int64_t>();
  if (v < lo || v > hi) return fail(e, key, fmt::format("'{}' is {}; it must be within [{}, {}]", key, v, lo, hi));
  *out = v;
  return true;
}

bool get_bool(const json& b, const char* key, bool* out, ApiError* e) {
  if (!b.contains(key) || b[key].is_null()) return true;
  if (!b[key].is_boolean()) return fail(e, key, fmt::format("'{}' must be true or false", key));
  *out = b[key].get<bool>();
  return true;
}

bool get_model(const json& b, std::string* model, ApiError* e) {
  if (!b.contains("model") || !b["model"].is_string()) return fail(e, "model", "'model' is required and must be a string");
  *model = b["model"].get<std::string>();
  return true;
}

bool get_stream(const json& b, bool* stream, bool* include_usage, ApiError* e) {
  if (!get_bool(b, "stream", stream, e)) return false;
  if (b.contains("stream_options") && !b["stream_options"].is_null()) {
    const json& so = b["stream_options"];
    if (!so.is_object()) return fail(e, "stream_options", "'stream_options' must be an object");
    if (!*stream) return fail(e, "stream_options", "'stream_options' is only allowed with stream: true");
    if (!get_bool(so, "include_usage", include_usage, e)) return false;
  }
  return true;
}

// The text of a message's content: string, null, or an array of text parts joined by "\n".
bool content_text(const json& m, const std::string& where, std::optional<std::string>* out, ApiError* e) {
  if (!m.contains("content") || m["content"].is_null()) {
    out->reset();
    return true;
  }
  const json& c = m["content"];
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return fail(e, where + ".content", "content must be a string, null or an array of text parts");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return fail(e, fmt::format("{}.content[{}]", where, i), "only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    if (i) text += "\n";
    text += part["text"].get<std::string>();
  }
  *out = text;
  return true;
}

bool parse_messages(const json& body, std::vector<ChatMessage>* out, ApiError* e) {
  if (!body.contains("messages") || !body["messages"].is_array()) {
    return fail(e, "messages", "'messages' is required and must be an array");
  }
  const json& msgs = body["messages"];
  if (msgs.empty()) return fail(e, "messages", "'messages' must not be empty");
  bool seen_user = false;
  bool tools_open = false;  // the previous message was an assistant tool call (or a tool result)
  std::set<std::string> open_call_ids;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const json& m = msgs[i];
    if (!m.is_object()) return fail(e, where, "each message must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return fail(e, where + ".role", "'role' is required");
    ChatMessage cm;
    cm.role = m["role"].get<std::string>();
    if (cm.role == "developer") cm.role = "system";
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool") {
      return fail(e, where + ".role", fmt::format("unknown role '{}' (system, user, assistant or tool)", cm.role));
    }
    if (!content_text(m, where, &cm.content, e)) return false;
    if (cm.role == "tool") {
      if (!tools_open) {
        return fail(e, where + ".role", "a 'tool' message must follow an assistant message with tool_calls");
      }
      if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string()) {
        return fail(e, where + ".tool_call_id", "a 'tool' message needs 'tool_call_id'");
      }
      cm.tool_call_id = m["tool_call_id"].get<std::string>();
      if (!open_call_ids.empty() && !open_call_ids.count(cm.tool_call_id)) {
        return fail(e, where + ".tool_call_id", fmt::format("no preceding tool call has id '{}'", cm.tool_call_id));
      }
      if (!cm.content) cm.content = "";
    } else {
      tools_open = false;
      open_call_ids.clear();
    }
    if (cm.role == "user") {
      seen_user = true;
      if (!cm.content) return fail(e, where + ".content", "a user message needs content");
    }
    if (cm.role == "system" && !cm.content) return fail(e, where + ".content", "a system message needs content");
    if (cm.role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& tc = m["tool_calls"];
      if (!tc.is_array()) return fail(e, where + ".tool_calls", "'tool_calls' must be an array");
      for (size_t k = 0; k < tc.size(); ++k) {
        const std::string w = fmt::format("{}.tool_calls[{}]", where, k);
        const json& c = tc[k];
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
            !c["function"]["name"].is_string()) {
          return fail(e, w, "each tool call needs function.name");
        }
        ToolCall call;
        call.name = c["function"]["name"].get<std::string>();
        if (c["function"].contains("arguments")) {
          const json& a = c["function"]["arguments"];
          call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
        }
        if (c.contains("id") && c["id"].is_string()) {
          call.id = c["id"].get<std::string>();
          open_call_ids.insert(call.id);
        }
        cm.tool_calls.push_back(std::move(call));
      }
      if (!cm.tool_calls.empty()) {
        tools_open = true;
        cm.content.reset();  // DeepSeek's template renders the calls when content is null
      }
    }
    out->push_back(std::move(cm));
  }
  if (!seen_user) return fail(e, "messages", "the conversation needs at least one user message");
  return true;
}

// OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$.
bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool parse_tools(const json& body, ChatRequest& r, ApiError* e) {
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return fail(e, "tools", "'tools' must be an array");
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string()) {
        return fail(e, fmt::format("tools[{}]", i), "each tool needs {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      if (!valid_tool_name(t["function"]["name"].get<std::string>())) {
        return fail(e, fmt::format("tools[{}].function.name", i), "tool names must match ^[a-zA-Z0-9_-]{1,64}$");
      }
    }
    auto defs = parse_tool_definitions(body["tools"].dump());
    if (!defs.ok()) return fail(e, "tools", defs.status().message());
    r.tools = std::move(*defs);
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const std::string v = tc.get<std::string>();
      if (v == "none") r.tool_choice = ToolChoice::kNone;
      else if (v == "auto") r.tool_choice = ToolChoice::kAuto;
      else if (v == "required") r.tool_choice = ToolChoice::kRequired;
      else return fail(e, "tool_choice", fmt::format("tool_choice '{}' is not none, auto or required", v));
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() && tc["function"].contains("name") &&
               tc["function"]["name"].is_string()) {
      r.tool_choice = ToolChoice::kNamed;
      r.tool_choice_name = tc["function"]["name"].get<std::string>();
      const bool known = std::any_of(r.tools.begin(), r.tools.end(), [&](const ToolDefinition& d) { return d.name == r.tool_choice_name; });
      if (!known) return fail(e, "tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", r.tool_choice_name));
    } else {
      return fail(e, "tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if ((r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) && r.tools.empty()) {
      return fail(e, "tool_choice", "tool_choice requires 'tools'");
    }
  }
  return true;
}

}  // namespace

json ApiError::to_json() const {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ApiError api_error_from_status(const Status& st, std::string_view param) {
  ApiError e;
  e.message = st.message();
  e.param = std::string(param);
  switch (st.code()) {
    case StatusCode::kResourceExhausted: e.http_status = 429; e.type = "rate_limit_exceeded"; e.code = "server_busy"; break;
    case StatusCode::kOutOfRange: e.http_status = 400; e.code = "context_length_exceeded"; break;
    case StatusCode::kNotFound: e.http_status = 404; e.type = "not_found_error"; break;
    case StatusCode::kUnimplemented: e.http_status = 400; e.code = "unsupported"; break;
    case StatusCode::kInvalidArgument: e.http_status = 400; break;
    case StatusCode::kUnavailable: e.http_status = 503; e.type = "server_error"; break;
    default: e.http_status = 500; e.type = "server_error"; break;
  }
  return e;
}

bool parse_sampling(const json& b, GenerationRequest& gen, bool chat, ApiError* e) {
  SamplingParams& s = gen.sampling;
  double v = s.temperature;
  if (!get_number(b, "temperature", 0, 2, false, &v, e)) return false;
  s.temperature = static_cast<float>(v);
  v = s.top_p;
  if (!get_number(b, "top_p", 0, 1, true, &v, e)) return false;
  s.top_p = static_cast<float>(v);
  v = s.min_p;
  if (!get_number(b, "min_p", 0, 1, false, &v, e)) return false;
  s.min_p = static_cast<float>(v);
  v = s.presence_penalty;
  if (!get_number(b, "presence_penalty", -2, 2, false, &v, e)) return false;
  s.presence_penalty = static_cast<float>(v);
  v = s.frequency_penalty;
  if (!get_number(b, "frequency_penalty", -2, 2, false, &v, e)) return false;
  s.frequency_penalty = static_cast<float>(v);
  v = s.repetition_penalty;
  if (!get_number(b, "repetition_penalty", 0, 2, true, &v, e)) return false;
  s.repetition_penalty = static_cast<float>(v);
  std::optional<int64_t> k, seed, n, top_lp;
  if (!get_int(b, "top_k", -1, 1 << 30, &k, e)) return false;
  if (k && *k > 0) s.top_k = static_cast<int32_t>(*k);
  if (!get_int(b, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
  if (seed) s.seed = static_cast<uint64_t>(*seed);
  if (!get_int(b, "n", 1, 1 << 20, &n, e)) return false;
  if (n && *n != 1) return fail(e, "n", "only n = 1 is supported");
  if (chat) {
    if (!get_bool(b, "logprobs", &s.logprobs, e)) return false;
    if (!get_int(b, "top_logprobs", 0, 20, &top_lp, e)) return false;
    if (top_lp) {
      if (!s.logprobs) return fail(e, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
      s.top_logprobs = static_cast<int32_t>(*top_lp);
    }
  } else if (b.contains("logprobs") && !b["logprobs"].is_null()) {
    if (!get_int(b, "logprobs", 0, 5, &top_lp, e)) return false;
    s.logprobs = true;
    s.top_logprobs = static_cast<int32_t>(*top_lp);
  }
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    const json& lb = b["logit_bias"];
    if (!lb.is_object()) return fail(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      const std::string& k = it.key();
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
      if (ec != std::errc() || end != k.data() + k.size() || id < 0 || id > INT32_MAX)
        return fail(e, "logit_bias", fmt::format("logit_bias key '{}' is not a token id", k));
      if (!it.value().is_number() || !(it.value().get<double>() >= -100 && it.value().get<double>() <= 100))
        return fail(e, "logit_bias", fmt::format("logit_bias of token {} must be a number within [-100, 100]", k));
      s.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
    }
  }
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& st = b["stop"];
    if (st.is_string()) {
      gen.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 16) {
      for (const auto& x : st) {
        if (!x.is_string()) return fail(e, "stop", "'stop' must be a string or an array of up to 16 strings");
        gen.stop.push_back(x.get<std::string>());
      }
    } else {
      return fail(e, "stop", "'stop' must be a string or an array of up to 16 strings");
    }
    for (const auto& x : gen.stop) {
      if (x.empty()) return fail(e, "stop", "stop strings must not be empty");
    }
  }
  if (b.contains("stop_token_ids") && !b["stop_token_ids"].is_null()) {
    if (!b["stop_token_ids"].is_array()) return fail(e, "stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (const auto& x : b["stop_token_ids"]) {
      if (!x.is_number_integer()) return fail(e, "stop_token_ids", "'stop_token_ids' must be an array of integers");
      gen.stop_tokens.push_back(x.get<int32_t>());
    }
  }
  if (!get_bool(b, "ignore_eos", &gen.ignore_eos, e)) return false;
  return true;
}

Result<ChatRequest> parse_chat_request(const json& b, ApiError* e) {
  ChatRequest r;
  auto bad = [&] { return invalid_argument("{}", e->message); };
  if (!b.is_object()) {
    fail(e, "", "the request body must be a JSON object");
    return bad();
  }
  if (!get_model(b, &r.model, e) || !parse_messages(b, &r.messages, e) || !parse_tools(b, r, e) ||
      !get_stream(b, &r.stream, &r.include_usage, e) || !parse_sampling(b, r.gen, true, e)) {
    return bad();
  }
  std::optional<int64_t> mt, mct;
  if (!get_int(b, "max_tokens", 1, 1 << 30, &mt, e) || !get_int(b, "max_completion_tokens", 1, 1 << 30, &mct, e)) return bad();
  r.max_tokens = mct ? mct : mt;
  if (b.contains("response_format") && !b["response_format"].is_null()) {
    const json& rf = b["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      fail(e, "response_format",
           "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
           "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}");
      return bad();
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      r.json_object = true;
    } else if (type == "json_schema") {
      // OpenAI's structured outputs: the reply is one object that follows the schema, enforced by
      // the decoder (engine/json_schema.h says what it follows).
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
        fail(e, "response_format.json_schema", "response_format json_schema needs a 'json_schema' object");
        return bad();
      }
      const json& js = rf["json_schema"];
      if (!js.contains("name") || !js["name"].is_string() || !valid_tool_name(js["name"].get<std::string>())) {
        fail(e, "response_format.json_schema.name", "json_schema.name must match ^[a-zA-Z0-9_-]{1,64}$");
        return bad();
      }
      if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null()) {
        fail(e, "response_format.json_schema.strict", "json_schema.strict must be a boolean");
        return bad();
      }
      if (!js.contains("schema") || !js["schema"].is_object()) {
        fail(e, "response_format.json_schema.schema", "json_schema.schema must be a JSON Schema object");
        return bad();
      }
      auto compiled = JsonSchema::compile(js["schema"].dump(), /*strict=*/true);
      if (!compiled.ok()) {
        fail(e, "response_format.json_schema.schema", compiled.status().message());
        return bad();
      }
      r.json_object = true;
      r.gen.json_schema = std::move(*compiled);
    } else if (type != "text") {
      fail(e, "response_format",
           fmt::format("response_format type '{}' is not supported (text, json_object or json_schema)", type));
      return bad();
    }
  }
  if (r.json_object && !r.tools.empty() && r.tool_choice != ToolChoice::kNone) {
    fail(e, "response_format", "JSON output cannot be combined with tool calls; set tool_choice to \"none\"");
    return bad();
  }
  return r;
}

Result<CompletionRequest> parse_completion_request(const json& b, ApiError* e) {
  CompletionRequest r;
  auto bad = [&] { return invalid_argument("{}", e->message); };
  if (!b.is_object()) {
    fail(e, "", "the request body must be a JSON object");
    return bad();
  }
  if (!get_model(b, &r.model, e) || !get_stream(b, &r.stream, &r.include_usage, e) || !parse_sampling(b, r.gen, false, e) ||
      !get_bool(b, "echo", &r.echo, e)) {
    return bad();
  }
  if (!b.contains("prompt")) {
    fail(e, "prompt", "'prompt' is required");
    return bad();
  }
  const json& p = b["prompt"];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const auto& x : p) {
      if (!x.is_number_integer()) {
        fail(e, "prompt", "a token-id prompt must be an array of integers");
        return bad();
      }
      r.prompt_tokens.push_back(x.get<int32_t>());
    }
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt_text = p[0].get<std::string>();
  } else {
    fail(e, "prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
    return bad();
  }
  std::optional<int64_t> mt;
  if (!get_int(b, "max_tokens", 1, 1 << 30, &mt, e)) return bad();
  r.max_tokens = mt ? mt : std::optional<int64_t>(16);  // OpenAI's default for completions
  return r;
}

std::string new_request_id(std::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id(prefix);
  id += '-';
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

Result<ChatPromptBuilder> ChatPromptBuilder::create(const Tokenizer& tok) {
  ChatPromptBuilder b;
  b.tok_ = &tok;
  b.tmpl_ = TRY(ChatTemplate::for_tokenizer(tok, ChatFormat::kDeepSeekV3));
  b.specials_by_byte_.resize(256);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.token_type(id) != TokenType::kControl && !tok.is_special(id)) continue;
    auto s = tok.id_to_token(id);
    if (!s.ok() || s->empty()) continue;
    b.specials_.emplace_back(*s);
    b.specials_by_byte_[static_cast<uint8_t>((*s)[0])].emplace_back(std::string(*s), id);
  }
  // Longest first, so a token that prefixes another never shadows it.
  for (auto& v : b.specials_by_byte_) {
    std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }
  return b;
}

Result<std::vector<int32_t>> ChatPromptBuilder::build(const ChatRequest& req) const {
  const Tokenizer& tok = *tok_;
  const ChatTemplate& tmpl = *tmpl_;
  // 1. Every user-supplied string becomes a placeholder with a per-request nonce.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string nonce = fmt::format("\x01" "FATHOM{:016x}_", rng());
  std::vector<std::string> values;
  auto hold = [&](const std::string& v) {
    values.push_back(v);
    return fmt::format("{}{}\x01", nonce, values.size() - 1);
  };
  std::vector<ChatMessage> msgs = req.messages;
  for (auto& m : msgs) {
    if (m.content) m.content = hold(*m.content);
    for (auto& c : m.tool_calls) {
      c.name = hold(c.name);
      c.arguments = hold(c.arguments);
    }
  }
  // Tool definitions are the developer's: they may not contain control-token strings.
  const bool with_tools = !req.tools.empty() && req.tool_choice != ToolChoice::kNone;
  const std::vector<std::string>& specials = specials_;
  if (with_tools) {
    for (size_t i = 0; i < req.tools.size(); ++i) {
      const ToolDefinition& t = req.tools[i];
      for (const auto& sp : specials) {
        if (t.name.find(sp) != std::string::npos || t.description.find(sp) != std::string::npos ||
            t.parameters_json.find(sp) != std::string::npos) {
          return invalid_argument("tools[{}] contains the reserved token string '{}'", i, sp);
        }
      }
    }
  }
  std::string text = TRY(tmpl.render(msgs, with_tools ? std::span<const ToolDefinition>(req.tools)
                                                      : std::span<const ToolDefinition>()));
  // Forced tool calls: the reply starts inside a call's arguments (named) or at its name (required).
  if (with_tools && req.tool_choice == ToolChoice::kNamed) {
    text += "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + req.tool_choice_name + "\n```json\n";
  } else if (with_tools && req.tool_choice == ToolChoice::kRequired) {
    text += "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>";
  }
  // 2. Split: control-token strings in template text become their tokens; every other run of
  //    text (template text and user values alike) is encoded as untrusted plain text.
  std::vector<int32_t> ids;
  std::string plain;
  auto flush = [&]() -> Status {
    if (plain.empty()) return {};
    TRY(tok.encode_into(plain, {.add_special = false, .untrusted = true}, &ids));
    plain.clear();
    return {};
  };
  size_t pos = 0;
  while (pos < text.size()) {
    if (text.compare(pos, nonce.size(), nonce) == 0) {
      const size_t end = text.find('\x01', pos + nonce.size());
      const size_t k = std::stoul(text.substr(pos + nonce.size(), end - pos - nonce.size()));
      plain += values[k];
      pos = end + 1;
      continue;
    }
    bool matched = false;
    for (const auto& [sp, id] : specials_by_byte_[static_cast<uint8_t>(text[pos])]) {
      if (text.compare(pos, sp.size(), sp) == 0) {
        TRY(flush());
        ids.push_back(id);
        pos += sp.size();
        matched = true;
        break;
      }
    }
    if (!matched) plain += text[pos++];
  }
  TRY(flush());
  return ids;
}

}  // namespace fathom
