// ChatClient over cpp-httplib (Debian builds it with OpenSSL, so https endpoints work). See chat_client.h.
#include "agent/chat_client.h"

#include <httplib.h>

#include <thread>

#include "base/log.h"
#include "base/strings.h"
#include "base/timer.h"

namespace fathom::agent {

using json = nlohmann::json;

Status ChatStreamParser::feed(std::string_view data) {
  body_.append(data);
  buf_.append(data);
  size_t start = 0;
  for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line = std::string_view(buf_).substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!starts_with(line, "data:")) continue;  // event:, id:, comments, blank separators
    line.remove_prefix(5);
    saw_event_ = true;
    TRY(handle_event(std::string(trim(line))));
  }
  buf_.erase(0, start);
  return {};
}

Status ChatStreamParser::handle_event(const std::string& data) {
  try {
    return handle_event_unchecked(data);
  } catch (const std::exception& e) {
    return corrupt("endpoint sent a malformed stream event ({}): {}", e.what(), data.substr(0, 200));
  }
}

Status ChatStreamParser::handle_event_unchecked(const std::string& data) {
  if (data == "[DONE]") {
    done_ = true;
    return {};
  }
  if (Status st = check_json_nesting(data, "the endpoint's SSE event"); !st.ok())
    return corrupt("{}: {}", st.message(), utf8_prefix(data, 200));
  json chunk = json::parse(data, nullptr, false);
  if (chunk.is_discarded())
    return corrupt("endpoint sent an SSE event that is not JSON: {}", data.substr(0, 200));
  if (chunk.contains("error"))
    return unavailable("endpoint error in stream: {}", chunk["error"].dump().substr(0, 500));
  if (chunk.contains("usage") && !chunk["usage"].is_null()) usage_ = chunk["usage"];
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) return {};
  const json& choice = chunk["choices"][0];
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    finish_reason_ = choice["finish_reason"];
  const json delta = choice.value("delta", json::object());
  if (delta.contains("content") && delta["content"].is_string()) {
    const std::string& t = delta["content"].get_ref<const std::string&>();
    content_ += t;
    if (on_text_ && !t.empty()) on_text_(t);
  }
  if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string())
    reasoning_ += delta["reasoning_content"].get<std::string>();
  if (delta.contains("tool_calls") && delta["tool_calls"].is_array()) {
    for (const auto& tc : delta["tool_calls"]) {
      const size_t index = tc.value("index", tool_calls_.size());
      if (index > 128) return corrupt("endpoint sent tool call index {}", index);
      while (tool_calls_.size() <= index)
        tool_calls_.push_back(
            {{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
      json& dst = tool_calls_[index];
      if (tc.contains("id") && tc["id"].is_string()) dst["id"] = tc["id"];
      const json fn = tc.value("function", json::object());
      if (fn.contains("name") && fn["name"].is_string())
        dst["function"]["name"] = dst["function"]["name"].get<std::string>() + fn["name"].get<std::string>();
      if (fn.contains("arguments") && fn["arguments"].is_string())
        dst["function"]["arguments"] =
            dst["function"]["arguments"].get<std::string>() + fn["arguments"].get<std::string>();
    }
  }
  return {};
}

Result<ChatResponse> ChatStreamParser::finish(bool is_sse) {
  try {
    return finish_unchecked(is_sse);
  } catch (const std::exception& e) {
    return corrupt("endpoint answer is malformed ({}): {}", e.what(), body_.substr(0, 300));
  }
}

Result<ChatResponse> ChatStreamParser::finish_unchecked(bool is_sse) {
  ChatResponse r;
  if (is_sse || saw_event_) {
    if (!buf_.empty()) TRY(feed("\n"));
    r.streamed = true;
    r.message = {{"role", "assistant"},
                 {"content", content_.empty() && !tool_calls_.empty() ? json() : json(content_)}};
    if (!reasoning_.empty()) r.message["reasoning_content"] = reasoning_;
    if (!tool_calls_.empty()) r.message["tool_calls"] = tool_calls_;
    r.finish_reason = finish_reason_;
    r.usage = usage_;
    return r;
  }
  if (Status st = check_json_nesting(body_, "the endpoint's answer"); !st.ok())
    return corrupt("{}: {}", st.message(), utf8_prefix(body_, 300));
  json j = json::parse(body_, nullptr, false);
  if (j.is_discarded()) return corrupt("endpoint answer is neither SSE nor JSON: {}", body_.substr(0, 300));
  if (j.contains("error")) return unavailable("endpoint error: {}", j["error"].dump().substr(0, 500));
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() ||
      !j["choices"][0].contains("message"))
    return corrupt("endpoint answer has no choices[0].message: {}", body_.substr(0, 300));
  r.message = j["choices"][0]["message"];
  if (!r.message.is_object()) return corrupt("endpoint answer: choices[0].message is not an object");
  r.finish_reason = j["choices"][0].value("finish_reason", "");
  r.usage = j.value("usage", json());
  if (r.message.contains("content") && r.message["content"].is_string() && on_text_)
    on_text_(r.message["content"].get<std::string>());
  return r;
}

struct ChatClient::Impl {
  ChatClientOptions options;
  std::string host;  // scheme://host:port
  std::string path;  // /v1/chat/completions
};

ChatClient::ChatClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatClient::~ChatClient() = default;

Result<std::unique_ptr<ChatClient>> ChatClient::create(ChatClientOptions options) {
  auto impl = std::make_unique<Impl>();
  const std::string& url = options.endpoint;
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos ||
      (url.substr(0, scheme_end) != "http" && url.substr(0, scheme_end) != "https"))
    return invalid_argument("--endpoint '{}' must start with http:// or https://", url);
  const size_t path_start = url.find('/', scheme_end + 3);
  impl->host = url.substr(0, path_start);
  std::string base = path_start == std::string::npos ? "" : url.substr(path_start);
  while (!base.empty() && base.back() == '/') base.pop_back();
  impl->path = ends_with(base, "/chat/completions") ? base : base + "/chat/completions";
  if (options.model.empty()) return invalid_argument("--model is required");
  impl->options = std::move(options);
  return std::unique_ptr<ChatClient>(new ChatClient(std::move(impl)));
}

nlohmann::ordered_json ChatClient::request_body(const nlohmann::ordered_json& messages,
                                                const nlohmann::ordered_json& tools) const {
  const auto& o = impl_->options;
  nlohmann::ordered_json body = {{"model", o.model}, {"messages", messages}, {"stream", o.stream}};
  if (!tools.empty()) body["tools"] = tools;
  if (o.stream) body["stream_options"] = {{"include_usage", true}};
  if (o.temperature) body["temperature"] = *o.temperature;
  if (o.max_tokens > 0) body["max_tokens"] = o.max_tokens;
  return body;
}

Result<ChatResponse> ChatClient::complete(const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools,
                                          const std::function<void(const std::string&)>& on_text) {
  const auto& o = impl_->options;
  const std::string body =
      request_body(messages, tools).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  Status last;
  for (int attempt = 0; attempt <= o.retries; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 << (attempt - 1)));
    Timer t;
    httplib::Client cli(impl_->host);
    cli.set_connection_timeout(10);
    cli.set_read_timeout(o.timeout_s);
    cli.set_write_timeout(60);
    httplib::Request req;
    req.method = "POST";
    req.path = impl_->path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", o.stream ? "text/event-stream, application/json" : "application/json");
    if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
    int status = 0;
    bool is_sse = false;
    std::string error_body;
    bool emitted = false;
    ChatStreamParser parser([&](const std::string& s) {
      emitted = true;
      if (on_text) on_text(s);
    });
    Status parse_error;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      is_sse = r.get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      if (status != 200) {
        if (error_body.size() < 4096) error_body.append(data, len);
        return true;
      }
      parse_error = parser.feed(std::string_view(data, len));
      return parse_error.ok();
    };
    auto res = cli.send(req);
    if (!parse_error.ok()) return parse_error;
    if (!res) {
      last = unavailable("endpoint {}{}: {}", impl_->host, impl_->path, httplib::to_string(res.error()));
      if (emitted) return last;  // text already shown: do not repeat it
      continue;
    }
    if (status != 200) {
      last = unavailable("endpoint {}{} answered HTTP {}: {}", impl_->host, impl_->path, status,
                         std::string(trim(error_body)).substr(0, 500));
      if (status == 429 || status >= 500) continue;
      return Status(
          status == 401 || status == 403 ? StatusCode::kPermissionDenied : StatusCode::kInvalidArgument,
          last.message());
    }
    auto r = parser.finish(is_sse);
    if (!r.ok()) return r.status();
    r->ms = t.elapsed_ms();
    return r;
  }
  return last;
}

}  // namespace fathom::agent
