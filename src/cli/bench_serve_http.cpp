// `fathom bench serve --url`: the request runner that goes through a running OpenAI-compatible
// server — streamed POST /v1/completions with a token-id prompt, greedy, `ignore_eos`, usage in
// the last chunk (see bench_serve.h). One HTTP connection per request, from the client's thread.
// It does not measure the server's steps (no roofline) and sends no chat template.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "cli/bench_serve.h"

namespace fathom::cli {
namespace {

using nlohmann::json;

// The error message of an OpenAI-style error body, or the body itself.
std::string error_message(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.contains("error") && j["error"].is_object()) {
    return j["error"].value("message", body);
  }
  return body.substr(0, 500);
}

struct SseState {
  RequestRecord rec;
  std::string buffer, finish, error;
  int64_t completion_tokens = -1, chunks_seen = 0;
  double last_s = 0;
};

// One `data: ...` payload of the stream.
void on_event(SseState& st, const std::string& payload, double now, const OnTokens& on_tokens) {
  if (payload == "[DONE]") return;
  const json j = json::parse(payload, nullptr, false);
  if (j.is_discarded()) {
    st.error = "the server sent an SSE event that is not JSON: " + payload.substr(0, 200);
    return;
  }
  if (j.contains("error")) {
    st.error = error_message(payload);
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    st.completion_tokens = u.value("completion_tokens", int64_t{-1});
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      st.rec.cached = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
    }
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  const json& c = j["choices"][0];
  const bool finish = c.contains("finish_reason") && c["finish_reason"].is_string();
  if (finish) st.finish = c["finish_reason"];
  // A token chunk: text, possibly empty (tokens that add no text yet, which Fathom and vLLM still
  // send a chunk for); the closing chunk's empty text is no token.
  if (!c.contains("text") || !c["text"].is_string()) return;
  if (c["text"].get<std::string>().empty() && finish) return;
  if (st.rec.first_s < 0) {
    st.rec.first_s = now;
  } else {
    st.rec.itl.push_back(now - st.last_s);
  }
  st.last_s = now;
  ++st.chunks_seen;
  on_tokens(1);
}

Result<RequestRecord> post_completion(const HttpTarget& t, std::vector<int32_t> prompt, int64_t max_tokens,
                                      const Timer& clock, const OnTokens& on_tokens) {
  httplib::Client cli(t.url);
  cli.set_read_timeout(3600, 0);
  const json body = {{"model", t.model},
                     {"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  if (!t.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + t.api_key);
  req.headers.emplace("Content-Type", "application/json");
  req.body = body.dump();
  SseState st;
  st.rec.n_prompt = static_cast<int64_t>(prompt.size());
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double now = clock.elapsed_s();
    st.buffer.append(data, n);
    size_t end;
    while ((end = st.buffer.find("\n\n")) != std::string::npos) {
      const std::string event = st.buffer.substr(0, end);
      st.buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) on_event(st, event.substr(6), now, on_tokens);
    }
    return st.error.empty();
  };
  st.rec.submit_s = clock.elapsed_s();
  auto res = cli.send(req);
  st.rec.end_s = clock.elapsed_s();
  if (!st.error.empty()) return internal_error("{}: {}", t.url, st.error);
  if (!res) return unavailable("cannot reach {}: {} error", t.url, httplib::to_string(res.error()));
  if (res->status != 200) {
    return unavailable("{} answered HTTP {}: {}", t.url, res->status,
                       error_message(res->body.empty() ? st.buffer : res->body));
  }
  if (st.finish != "length" || st.completion_tokens != max_tokens) {
    return internal_error(
        "{}: the stream ended with finish_reason '{}' and {} completion tokens ({} expected; does "
        "the server honour ignore_eos?)",
        t.url, st.finish, st.completion_tokens, max_tokens);
  }
  // Tokens whose text is an incomplete UTF-8 sequence stream as no text (a random model's byte
  // tokens, say): a request whose every token was such has its first text at the end.
  if (st.rec.first_s < 0) st.rec.first_s = st.rec.end_s;
  st.rec.n_out = st.completion_tokens;
  if (st.completion_tokens > st.chunks_seen) on_tokens(st.completion_tokens - st.chunks_seen);
  return st.rec;
}

}  // namespace

Result<RequestRunner> http_runner(const HttpTarget& target) {
  httplib::Client cli(target.url);
  if (!cli.is_valid()) return invalid_argument("--url '{}' is not a valid http:// URL", target.url);
  cli.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!target.api_key.empty()) headers.emplace("Authorization", "Bearer " + target.api_key);
  auto res = cli.Get("/v1/models", headers);
  if (!res) return unavailable("cannot reach {}: {} error", target.url, httplib::to_string(res.error()));
  if (res->status != 200) {
    return unavailable("{}/v1/models answered HTTP {}: {}", target.url, res->status,
                       error_message(res->body));
  }
  const json j = json::parse(res->body, nullptr, false);
  bool found = false;
  if (!j.is_discarded() && j.contains("data") && j["data"].is_array()) {
    for (const json& m : j["data"]) found = found || (m.is_object() && m.value("id", "") == target.model);
  }
  if (!found)
    return not_found("{} does not serve a model named '{}' (see its /v1/models)", target.url, target.model);
  return RequestRunner([target](std::vector<int32_t> prompt, int64_t max_tokens, const Timer& clock,
                                const OnTokens& on_tokens) {
    return post_completion(target, std::move(prompt), max_tokens, clock, on_tokens);
  });
}

}  // namespace fathom::cli
