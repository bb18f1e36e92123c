// The HTTP layer: routes, auth, errors, SSE streaming and metrics, on cpp-httplib.
#include "server/server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "base/log.h"
#include "base/strings.h"
#include "server/openai.h"
#include "server/server_impl.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// Ordered: a request's key order is kept (tool parameters reach the prompt and the argument
// constraint in the order the client declared them, as OpenAI keeps them).
using json = nlohmann::ordered_json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace

void Server::Impl::send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.to_json().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void Server::Impl::count(const std::string& route, int status) {
  std::lock_guard lock(mu);
  ++requests[{route, status}];
}

bool Server::Impl::parse_body(const httplib::Request& req, httplib::Response& res, json* body) {
  if (Status st = check_json_nesting(req.body, "the request body"); !st.ok()) {
    send_error(res, ApiError{400, st.message()});
    return false;
  }
  try {
    *body = json::parse(req.body);
  } catch (const json::exception& ex) {
    send_error(res, ApiError{400, fmt::format("the request body is not valid JSON: {}", ex.what())});
    return false;
  }
  return true;
}

bool Server::Impl::check_model(const std::string& name, httplib::Response& res) {
  if (name == model_name || name == "default") return true;
  ApiError e{404, fmt::format("The model '{}' does not exist (this server serves '{}' and 'default')", name, model_name),
             "invalid_request_error", "model", "model_not_found"};
  send_error(res, e);
  return false;
}

json Server::Impl::usage_json(const Usage& u) const {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Server::Impl::token_logprob_json(const SampleResult& r) const {
  auto entry = [&](int32_t t, float lp) {
    const std::string text = model->tokenizer().token_bytes(t).value_or("");
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(c);
    return json{{"token", text}, {"logprob", lp}, {"bytes", bytes}};
  };
  json e = entry(r.token, r.logprob);
  json top = json::array();
  for (const auto& t : r.top) top.push_back(entry(t.token, t.logprob));
  e["top_logprobs"] = top;
  return e;
}

// Runs a request to completion (non-streaming).
Server::Impl::Collected Server::Impl::collect(const std::shared_ptr<RequestStream>& stream) {
  Collected c;
  while (true) {
    auto ev = stream->next(1000);
    if (!ev) continue;
    c.text += ev->text;
    c.tokens.insert(c.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    c.logprobs.insert(c.logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
    if (ev->finish != FinishReason::kNone) {
      c.finish = ev->finish;
      c.usage = ev->usage;
      c.error = ev->error;
      return c;
    }
  }
}

std::string Server::Impl::without_markers(std::string text) const {
  for (const std::string& m : marker_texts) {
    for (size_t at = text.find(m); at != std::string::npos; at = text.find(m, at)) text.erase(at, m.size());
  }
  return text;
}

// The tool-call view of a finished chat completion (see server_impl.h).
Server::Impl::ChatOutcome Server::Impl::chat_outcome(const ChatContext& ctx, const Collected& c) const {
  ChatOutcome o;
  o.finish = finish_reason_name(c.finish);
  if (!ctx.tools_active) {
    o.content = without_markers(c.text);
    return o;
  }
  ParsedToolCalls p = parse_tool_calls(ctx.forced_prefix + c.text);
  if (p.error.ok() && !p.tool_calls.empty()) {
    o.tool_calls = p.tool_calls;
    o.content = without_markers(p.content);
    if (c.finish == FinishReason::kStop) o.finish = "tool_calls";
    return o;
  }
  if (p.tool_calls.empty()) {
    o.content = without_markers(p.content);
    return o;
  }
  // A call cut off (by max_tokens): the complete ones stay calls, the cut one becomes plain text.
  o.tool_calls.assign(p.tool_calls.begin(), p.tool_calls.end() - 1);
  const ToolCall& cut = p.tool_calls.back();
  o.content = without_markers(p.content + cut.name + "\n" + cut.arguments);
  return o;
}

void Server::Impl::handle_chat(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, &body)) return;
  ApiError err;
  auto parsed = parse_chat_request(body, &err);
  if (!parsed.ok()) return send_error(res, err);
  ChatRequest& cr = *parsed;
  if (!check_model(cr.model, res)) return;
  auto prompt = builder->build(cr);
  if (!prompt.ok()) return send_error(res, api_error_from_status(prompt.status(), "messages"));
  ChatContext ctx;
  ctx.tools_active = !cr.tools.empty() && cr.tool_choice != ToolChoice::kNone;
  if (ctx.tools_active && cr.tool_choice == ToolChoice::kNamed) {
    ctx.forced_prefix = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" + cr.tool_choice_name + "\n```json\n";
  } else if (ctx.tools_active && cr.tool_choice == ToolChoice::kRequired) {
    ctx.forced_prefix = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>";
  }
  GenerationRequest gen = std::move(cr.gen);
  gen.prompt = std::move(*prompt);
  gen.json_object = cr.json_object;
  if (!gen.ignore_eos) {
    gen.stop_tokens.insert(gen.stop_tokens.end(), turn_end_ids.begin(), turn_end_ids.end());
    if (!ctx.tools_active)
      gen.stop_tokens.insert(gen.stop_tokens.end(), tool_marker_ids.begin(), tool_marker_ids.end());
  }
  if (ctx.tools_active) {
    gen.keep_special_tokens = tool_marker_ids;
    if (options.constrain_tool_names) {
      for (const ToolDefinition& t : cr.tools) {
        gen.tool_names.push_back(t.name);
        gen.tool_schemas.push_back(
            ToolArgsSchema::from_json_schema(t.parameters_json).value_or(ToolArgsSchema{}));
      }
      if (cr.tool_choice == ToolChoice::kNamed)
        gen.tool_args_of = cr.tool_choice_name;  // prefix ends at the fence
      gen.tool_name_selection = options.tool_name_selection;
      gen.tool_head_weight = options.tool_head_weight;
      gen.tool_name_first = cr.tool_choice == ToolChoice::kRequired;  // prefix ends at <｜tool▁sep｜>
    }
  }
  if (options.enable_test_hooks) {
    std::optional<std::string> text;
    if (body.contains("fathom_test_output") && body["fathom_test_output"].is_string()) {
      text = body["fathom_test_output"].get<std::string>();
    } else {
      std::lock_guard<std::mutex> lock(mu);
      if (next_test_output < options.test_outputs.size()) text = options.test_outputs[next_test_output++];
    }
    if (text) {
      auto forced = model->tokenizer().encode(*text);
      if (!forced.ok()) return send_error(res, api_error_from_status(forced.status(), "fathom_test_output"));
      gen.forced_output = std::move(*forced);
    }
  }
  const int64_t room = model->max_context() - static_cast<int64_t>(gen.prompt.size());
  gen.max_tokens = cr.max_tokens ? std::min<int64_t>(*cr.max_tokens, std::max<int64_t>(room, 1)) : std::max<int64_t>(room, 1);
  ctx.id = new_request_id("chatcmpl");
  ctx.created = unix_now();
  ctx.include_usage = cr.include_usage;
  ctx.logprobs = gen.sampling.logprobs;
  if (Status st = validate_logit_bias(gen.sampling, model->config().vocab_size); !st.ok())
    return send_error(res, api_error_from_status(st, "logit_bias"));
  auto stream = engine->submit(std::move(gen));
  if (!stream.ok()) return send_error(res, api_error_from_status(stream.status(), "messages"));
  if (cr.stream) return stream_chat(res, *stream, ctx);
  const Collected c = collect(*stream);
  if (c.finish == FinishReason::kError) return send_error(res, api_error_from_status(c.error));
  const ChatOutcome o = chat_outcome(ctx, c);
  json message = {{"role", "assistant"}, {"content", o.content.empty() && !o.tool_calls.empty() ? json(nullptr) : json(o.content)}};
  if (!o.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& t : o.tool_calls) {
      calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    }
    message["tool_calls"] = calls;
  }
  json choice = {{"index", 0}, {"message", message}, {"finish_reason", o.finish}, {"logprobs", nullptr}};
  if (ctx.logprobs) {
    json content = json::array();
    for (const auto& lp : c.logprobs) content.push_back(token_logprob_json(lp));
    choice["logprobs"] = {{"content", content}};
  }
  json out = {{"id", ctx.id},           {"object", "chat.completion"}, {"created", ctx.created},
              {"model", model_name},    {"system_fingerprint", fingerprint}, {"choices", json::array({choice})},
              {"usage", usage_json(c.usage)}};
  res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void Server::Impl::stream_chat(httplib::Response& res, std::shared_ptr<RequestStream> stream, ChatContext ctx) {
  auto state = std::make_shared<StreamState>();
  state->stream = std::move(stream);
  state->ctx = std::move(ctx);
  if (!state->ctx.forced_prefix.empty()) (void)state->parser.push(state->ctx.forced_prefix);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t, httplib::DataSink& sink) { return stream_step(*state, sink, /*chat=*/true); },
      [state](bool success) {
        if (!success) state->stream->cancel();  // the client went away: free its pages now
      });
}

json Server::Impl::chunk(const StreamState& st, json delta, json finish, bool chat) const {
  json choice = chat ? json{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}}
                     : json{{"index", 0}, {"text", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
  json c = {{"id", st.ctx.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", st.ctx.created},
            {"model", model_name},
            {"system_fingerprint", fingerprint},
            {"choices", json::array({choice})}};
  if (st.ctx.include_usage) c["usage"] = nullptr;
  return c;
}

// One call of the content provider: waits for the next event and writes its chunks.
bool Server::Impl::stream_step(StreamState& st, httplib::DataSink& sink, bool chat) {
  auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
  if (!st.started) {
    st.started = true;
    if (chat && !write(sse(chunk(st, json{{"role", "assistant"}, {"content", ""}}, nullptr, true)))) return cancel(st);
  }
  std::optional<GenerationEvent> ev;
  while (!(ev = st.stream->next(100))) {
    if (!sink.is_writable()) return cancel(st);
  }
  if (ev->finish == FinishReason::kError) {
    ApiError e = api_error_from_status(ev->error);
    write(sse(e.to_json()));
    write("data: [DONE]\n\n");
    sink.done();
    return true;
  }
  if (chat) {
    if (!write_chat_deltas(st, *ev, write)) return cancel(st);
  } else if (!ev->text.empty() || !ev->tokens.empty()) {
    // A chunk per engine step that made tokens, even when they add no text yet (a character's
    // first bytes, a special token), as vLLM's completions stream does: clients time every token
    // and get every token's log-probabilities.
    json c = chunk(st, ev->text, nullptr, false);
    if (st.ctx.logprobs) c["choices"][0]["logprobs"] = completion_logprobs(ev->logprobs, st.text_offset);
    if (!write(sse(c))) return cancel(st);
  }
  st.text_offset += static_cast<int64_t>(ev->text.size());
  if (ev->finish == FinishReason::kNone) return true;
  std::string finish(finish_reason_name(ev->finish));
  if (chat && st.ctx.tools_active && st.n_calls > 0 && ev->finish == FinishReason::kStop) finish = "tool_calls";
  if (ev->finish == FinishReason::kCancelled) finish = "stop";
  if (!write(sse(chunk(st, chat ? json::object() : json(""), finish, chat)))) return cancel(st);
  if (st.ctx.include_usage) {
    json u = {{"id", st.ctx.id},         {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", st.ctx.created}, {"model", model_name}, {"system_fingerprint", fingerprint},
              {"choices", json::array()}, {"usage", usage_json(ev->usage)}};
    if (!write(sse(u))) return cancel(st);
  }
  write("data: [DONE]\n\n");
  sink.done();
  return true;
}

bool Server::Impl::cancel(StreamState& st) {
  st.stream->cancel();
  return false;
}

template <typename Write>
bool Server::Impl::write_chat_deltas(StreamState& st, const GenerationEvent& ev, Write& write) {
  // With logprobs, the event's tokens' entries ride on its content chunk (an empty content when
  // its tokens add none), so the streamed entries are the non-streamed reply's, token for token.
  bool logprobs_sent = !st.ctx.logprobs || ev.logprobs.empty();
  auto emit_content = [&](const std::string& text) {
    if (text.empty() && logprobs_sent) return true;
    json c = chunk(st, json{{"content", text}}, nullptr, true);
    if (!logprobs_sent) {
      json content = json::array();
      for (const auto& lp : ev.logprobs) content.push_back(token_logprob_json(lp));
      c["choices"][0]["logprobs"] = {{"content", std::move(content)}};
      logprobs_sent = true;
    }
    return write(sse(c));
  };
  std::string content;
  std::vector<ToolCallDelta> calls;
  if (st.ctx.tools_active) {
    ParserDelta d = st.parser.push(ev.text);
    if (ev.finish != FinishReason::kNone) {
      ParserDelta tail = st.parser.finish();
      d.content += tail.content;
      d.tool_calls.insert(d.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
    }
    content = without_markers(d.content);
    calls = d.tool_calls;
  } else {
    content = without_markers(ev.text);
  }
  if (!emit_content(content)) return false;
  // Tool-call deltas are held until their call is complete, so a call cut off by max_tokens can
  // still come back as plain text.
  for (auto& c : calls) {
    if (c.index >= static_cast<int32_t>(st.pending_calls.size())) st.pending_calls.resize(static_cast<size_t>(c.index) + 1);
    st.pending_calls[static_cast<size_t>(c.index)].push_back(c);
  }
  const bool end = ev.finish != FinishReason::kNone;
  const bool truncated = end && !st.parser.error().ok();
  // Every call but the last is complete; the last one too once the output ended cleanly.
  const size_t n_pending = st.pending_calls.size();
  const size_t complete = end && !truncated ? n_pending : (n_pending == 0 ? 0 : n_pending - 1);
  for (; st.n_calls < complete; ++st.n_calls) {
    for (const auto& d : st.pending_calls[st.n_calls]) {
      json tc = {{"index", d.index}};
      if (!d.id.empty()) tc["id"] = d.id;
      if (!d.name.empty()) {
        tc["type"] = "function";
        tc["function"] = {{"name", d.name}, {"arguments", d.arguments}};
      } else {
        tc["function"] = {{"arguments", d.arguments}};
      }
      if (!write(sse(chunk(st, json{{"tool_calls", json::array({tc})}}, nullptr, true)))) return false;
    }
  }
  if (truncated && !st.pending_calls.empty()) {
    std::string text;
    for (const auto& d : st.pending_calls.back()) text += d.name.empty() ? d.arguments : d.name + "\n" + d.arguments;
    if (!emit_content(without_markers(text))) return false;
  }
  return true;
}

json Server::Impl::completion_logprobs(const std::vector<SampleResult>& lps, int64_t offset) const {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const auto& r : lps) {
    const std::string t = model->tokenizer().token_bytes(r.token).value_or("");
    tokens.push_back(t);
    token_logprobs.push_back(r.logprob);
    json alt = json::object();
    for (const auto& a : r.top) alt[model->tokenizer().token_bytes(a.token).value_or("")] = a.logprob;
    top.push_back(alt);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.size());
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

void Server::Impl::handle_completion(const httplib::Request& req, httplib::Response& res) {
  json body;
  if (!parse_body(req, res, &body)) return;
  ApiError err;
  auto parsed = parse_completion_request(body, &err);
  if (!parsed.ok()) return send_error(res, err);
  CompletionRequest& cr = *parsed;
  if (!check_model(cr.model, res)) return;
  GenerationRequest gen = std::move(cr.gen);
  if (cr.prompt_text) {
    // A raw completion prompt is the caller's own text: tokenized as a whole (BOS as configured).
    auto ids = model->tokenizer().encode(*cr.prompt_text, {.add_special = true, .untrusted = true});
    if (!ids.ok()) return send_error(res, api_error_from_status(ids.status(), "prompt"));
    gen.prompt = std::move(*ids);
  } else {
    gen.prompt = cr.prompt_tokens;
  }
  const int64_t room = model->max_context() - static_cast<int64_t>(gen.prompt.size());
  gen.max_tokens = std::min<int64_t>(*cr.max_tokens, std::max<int64_t>(room, 1));
  StreamState ctx_holder;
  ChatContext ctx;
  ctx.id = new_request_id("cmpl");
  ctx.created = unix_now();
  ctx.include_usage = cr.include_usage;
  ctx.logprobs = gen.sampling.logprobs;
  if (Status st = validate_logit_bias(gen.sampling, model->config().vocab_size); !st.ok())
    return send_error(res, api_error_from_status(st, "logit_bias"));
  auto stream = engine->submit(std::move(gen));
  if (!stream.ok()) return send_error(res, api_error_from_status(stream.status(), "prompt"));
  if (cr.stream) {
    auto state = std::make_shared<StreamState>();
    state->stream = *stream;
    state->ctx = ctx;
    state->started = true;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, state](size_t, httplib::DataSink& sink) { return stream_step(*state, sink, false); },
        [state](bool success) {
          if (!success) state->stream->cancel();
        });
    return;
  }
  const Collected c = collect(*stream);
  if (c.finish == FinishReason::kError) return send_error(res, api_error_from_status(c.error));
  std::string text = c.text;
  if (cr.echo && cr.prompt_text) text = *cr.prompt_text + text;
  json choice = {{"index", 0}, {"text", text}, {"finish_reason", finish_reason_name(c.finish)}, {"logprobs", nullptr}};
  if (ctx.logprobs) choice["logprobs"] = completion_logprobs(c.logprobs, 0);
  json out = {{"id", ctx.id},        {"object", "text_completion"}, {"created", ctx.created},
              {"model", model_name}, {"system_fingerprint", fingerprint}, {"choices", json::array({choice})},
              {"usage", usage_json(c.usage)}};
  res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void Server::Impl::handle_models(httplib::Response& res) {
  json data = json::array();
  for (const std::string& id : {model_name, std::string("default")}) {
    data.push_back({{"id", id}, {"object", "model"}, {"created", started}, {"owned_by", "fathom"},
                    {"max_model_len", model->max_context()}});
  }
  res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { stop(); }
int Server::port() const { return impl_->bound_port; }
const std::string& Server::model_name() const { return impl_->model_name; }

void Server::stop() {
  if (impl_ && impl_->http) impl_->http->stop();
}

// Pending connections the listening socket queues (ServerOptions::http_threads serve them).
constexpr int kListenBacklog = 1024;

Status Server::bind() {
  Impl& m = *impl_;
  // Debian's compiled cpp-httplib listens with a backlog of 5: 32 clients connecting at once
  // overflowed it while both cores ran the engine, and with SYN cookies some connections were
  // reset after the client had sent its request ("Read error" in `bench serve --url` at 32
  // clients). The socket is taken here, as httplib creates it, and listen() called again with
  // kListenBacklog, which Linux applies to a socket already listening (capped by somaxconn).
  int listen_fd = -1;
  m.http->set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = static_cast<int>(sock);
  });
  if (m.options.port == 0) {
    m.bound_port = m.http->bind_to_any_port(m.options.host);
  } else {
    m.bound_port = m.http->bind_to_port(m.options.host, m.options.port) ? m.options.port : -1;
  }
  m.http->set_socket_options(httplib::default_socket_options);  // the callback above holds a local
  if (m.bound_port <= 0) return unavailable("cannot listen on {}:{} (in use, or not an address of this machine)", m.options.host, m.options.port);
  if (listen_fd >= 0 && ::listen(listen_fd, kListenBacklog) != 0) {
    log_warn("listen backlog {} not applied: {}", kListenBacklog, std::strerror(errno));
  }
  return {};
}

Status Server::serve() {
  if (!impl_->http->listen_after_bind()) return io_error("the HTTP server stopped with an error");
  return {};
}

Result<std::unique_ptr<Server>> Server::create(Engine& engine, const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->engine = &engine;
  impl->model = &engine.model();
  impl->options = options;
  impl->model_name = options.served_model_name;
  impl->started = unix_now();
  impl->fingerprint = "fathom-0.1.0";
  impl->builder = std::make_unique<ChatPromptBuilder>(TRY(ChatPromptBuilder::create(impl->model->tokenizer())));
  const ChatTokenIds& ct = impl->model->tokenizer().chat_tokens();
  for (int32_t id : {ct.tool_calls_begin, ct.tool_calls_end, ct.tool_call_begin, ct.tool_call_end, ct.tool_sep}) {
    if (id != kNoToken) impl->tool_marker_ids.push_back(id);
  }
  const Tokenizer& tok = impl->model->tokenizer();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.token_type(id) != TokenType::kControl || tok.is_special(id) || id == tok.eos_id()) continue;
    if (std::find(impl->tool_marker_ids.begin(), impl->tool_marker_ids.end(), id) !=
        impl->tool_marker_ids.end())
      continue;
    impl->turn_end_ids.push_back(id);
  }
  for (const auto* ids : {&impl->tool_marker_ids, &impl->turn_end_ids}) {
    for (int32_t id : *ids)
      if (auto text = tok.token_bytes(id); text.ok() && !text->empty()) impl->marker_texts.push_back(*text);
  }
  impl->install_routes();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::Impl::install_routes() {
  http = std::make_unique<httplib::Server>();
  const int threads = options.http_threads;
  http->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http->set_payload_max_length(options.max_body_bytes);
  http->set_read_timeout(options.read_timeout_s, 0);
  http->set_write_timeout(options.write_timeout_s, 0);
  http->set_keep_alive_timeout(5);
  http->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string want = "Bearer " + options.api_key;
    if (req.get_header_value("Authorization") != want) {
      send_error(res, ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                               "invalid_request_error", "", "invalid_api_key"});
      count(req.path, 401);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto route = [this](const std::string& path, auto fn) {
    return [this, path, fn](const httplib::Request& req, httplib::Response& res) {
      fn(req, res);
      count(path, res.status == -1 ? 200 : res.status);  // -1: not set yet, httplib sends 200
    };
  };
  http->Post("/v1/chat/completions", route("/v1/chat/completions", [this](const auto& q, auto& r) { handle_chat(q, r); }));
  http->Post("/v1/completions", route("/v1/completions", [this](const auto& q, auto& r) { handle_completion(q, r); }));
  http->Get("/v1/models", route("/v1/models", [this](const auto&, auto& r) { handle_models(r); }));
  http->Get("/health", route("/health", [](const auto&, auto& r) { r.set_content("{\"status\":\"ok\"}", "application/json"); }));
  http->Get("/metrics", route("/metrics", [this](const auto&, auto& r) { r.set_content(metrics_text(), "text/plain; version=0.0.4"); }));
  http->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.http_status = res.status;
    switch (res.status) {
      case 404: e.message = fmt::format("no route {} {}", req.method, req.path); e.type = "not_found_error"; break;
      case 405: e.message = fmt::format("{} is not allowed on {}", req.method, req.path); break;
      case 413: e.message = fmt::format("the request body exceeds {} bytes", options.max_body_bytes); e.code = "request_too_large"; break;
      default: e.message = fmt::format("HTTP {}", res.status); break;
    }
    send_error(res, e);
    count(req.path, res.status);
  });
  http->set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    log_error("handler for {} threw: {}", req.path, what);
    send_error(res, ApiError{500, "internal error: " + what, "server_error"});
    count(req.path, 500);
  });
}

}  // namespace fathom
