// Incremental parser of DeepSeek tool calls in generated text -> OpenAI tool_calls. A small
// state machine over an input buffer; anything that may still turn into a marker is held back,
// everything else is emitted at once (content, call headers, argument text). Malformed headers
// fall back to content; calls cut off keep what arrived and set error().
#include <nlohmann/json.hpp>

#include <random>

#include "base/rng.h"
#include "tokenizer/chat_template.h"

namespace fathom {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr size_t kLongestMarker = std::max({kCallsBegin.size(), kCallsEnd.size(), kCallBegin.size(), kCallEnd.size(),
                                            kSep.size(), kEos.size()});

// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
size_t held_suffix(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    const size_t max = std::min(s.size(), m.size() - 1);
    for (size_t k = max; k > best; --k) {
      if (s.substr(s.size() - k) == m.substr(0, k)) {
        best = k;
        break;
      }
    }
  }
  return best;
}

// The earliest occurrence of any marker: (position, marker), npos when none.
std::pair<size_t, std::string_view> find_first(std::string_view s,
                                               std::initializer_list<std::string_view> markers) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (std::string_view m : markers) {
    const size_t p = s.find(m);
    if (p < best.first) best = {p, m};
  }
  return best;
}

// Bytes at the end of s that start a UTF-8 sequence not complete yet (held back so that every
// delta is whole characters).
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[s.size() - k]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return len > k ? k : 0;
  }
  return 0;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

ToolCallParser::ToolCallParser(const ToolCallParserOptions& options) : options_(options) {
  rng_ = options.id_seed != 0 ? options.id_seed
                              : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
}

std::string ToolCallParser::next_id() {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) {
    rng_ = splitmix64(rng_);
    id.push_back(kAlphabet[rng_ % 62]);
  }
  return id;
}

void ToolCallParser::note_error(Status s) {
  if (error_.ok()) error_ = std::move(s);
}

void ToolCallParser::emit_content(std::string_view text, ParserDelta* out) {
  if (text.empty()) return;
  out->content.append(text);
  content_.append(text);
}

void ToolCallParser::emit_args(std::string_view text, ParserDelta* out) {
  if (text.empty()) return;
  ToolCall& call = calls_.back();
  call.arguments.append(text);
  const int32_t index = static_cast<int32_t>(calls_.size() - 1);
  if (!out->tool_calls.empty() && out->tool_calls.back().index == index) {
    out->tool_calls.back().arguments.append(text);
  } else {
    out->tool_calls.push_back({index, "", "", std::string(text)});
  }
}

void ToolCallParser::close_call(bool complete, ParserDelta* /*out*/) {
  ToolCall& call = calls_.back();
  const size_t index = calls_.size() - 1;
  if (!complete) {
    note_error(invalid_argument("tool call {} ('{}') is cut off before its end marker", index, call.name));
  } else {
    auto j = nlohmann::json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      note_error(
          invalid_argument("tool call {} ('{}'): the arguments are not a JSON object", index, call.name));
    }
  }
  state_ = State::kBetweenCalls;
}

bool ToolCallParser::step_content(bool at_end, ParserDelta* out) {
  auto [p, marker] = find_first(buf_, {kCallsBegin, kCallBegin});
  if (p == std::string::npos) {
    const size_t hold =
        at_end ? 0 : std::max(held_suffix(buf_, {kCallsBegin, kCallBegin}), incomplete_utf8_tail(buf_));
    emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
    buf_.erase(0, buf_.size() - hold);
    return false;
  }
  emit_content(std::string_view(buf_).substr(0, p), out);
  buf_.erase(0, p + marker.size());
  state_ = marker == kCallsBegin ? State::kBetweenCalls : State::kHeader;
  return true;
}

bool ToolCallParser::step_between(bool at_end, ParserDelta* /*out*/) {
  size_t i = 0;
  while (i < buf_.size() && is_space(buf_[i])) ++i;
  std::string_view rest = std::string_view(buf_).substr(i);
  if (rest.starts_with(kCallBegin)) {
    buf_.erase(0, i + kCallBegin.size());
    state_ = State::kHeader;
    return true;
  }
  if (rest.starts_with(kCallsEnd)) {
    buf_.erase(0, i + kCallsEnd.size());
    state_ = State::kContent;
    return true;
  }
  const bool maybe_marker = kCallBegin.starts_with(rest) || kCallsEnd.starts_with(rest);
  if (!at_end && maybe_marker) return false;  // wait for more (rest may be empty)
  if (at_end && rest.empty()) {  // the block was never closed; DeepSeek-V3 often ends right after a call
    buf_.clear();
    return false;
  }
  // Text between calls that is no marker: the calls block is over; the rest is content.
  state_ = State::kContent;
  return true;
}

void ToolCallParser::malformed_header(size_t n, std::string_view why, ParserDelta* out) {
  note_error(invalid_argument("malformed tool call header: {}; passed through as text", why));
  std::string raw(kCallBegin);
  raw.append(buf_, 0, n);
  emit_content(raw, out);
  buf_.erase(0, n);
  state_ = State::kContent;
}

// The header must end (after <｜tool▁sep｜>, and for V3 after the newline that ends the name)
// within max_header_bytes. Every decision depends only on those bytes and on markers that start
// among them, and is taken only once the buffer holds them and a whole marker more: streamed in
// any chunks, a header parses exactly as in one piece.
bool ToolCallParser::step_header(bool at_end, ParserDelta* out) {
  const size_t limit = options_.max_header_bytes;
  auto [stop, marker] = find_first(buf_, {kCallEnd, kCallBegin, kCallsEnd, kCallsBegin, kEos});
  const size_t sep = buf_.find(kSep);
  size_t end = std::string::npos;  // one past the header
  bool v3 = false;
  if (sep != std::string::npos && sep < stop) {
    v3 = trim(std::string_view(buf_).substr(0, sep)) == "function";
    if (!v3) {
      end = sep + kSep.size();
    } else if (const size_t nl = buf_.find('\n', sep + kSep.size()); nl != std::string::npos && nl < stop) {
      end = nl + 1;
    }
  }
  if (end == std::string::npos || end > limit) {
    if (stop < limit) return malformed_header(stop, "a marker before the end of the header", out), true;
    if (buf_.size() >= limit + kLongestMarker) {  // cut before a character the limit would split
      const size_t cut = limit - incomplete_utf8_tail(std::string_view(buf_).substr(0, limit));
      return malformed_header(cut, fmt::format("no header end within {} bytes", limit), out), true;
    }
    if (at_end) return malformed_header(buf_.size(), "cut off", out), true;
    return false;
  }
  std::string name;
  if (v3) {  // V3: function<｜tool▁sep｜>NAME\n```json\nARGS\n```
    name = std::string(trim(std::string_view(buf_).substr(sep + kSep.size(), end - 1 - sep - kSep.size())));
  } else {  // V3.1: NAME<｜tool▁sep｜>ARGS
    name = std::string(trim(std::string_view(buf_).substr(0, sep)));
  }
  if (name.empty()) return malformed_header(end, "bad tool name", out), true;
  buf_.erase(0, end);
  ToolCall call;
  call.id = next_id();
  call.name = name;
  calls_.push_back(call);
  out->tool_calls.push_back({static_cast<int32_t>(calls_.size() - 1), call.id, call.name, ""});
  args_fence_checked_ = false;
  args_fenced_ = false;
  state_ = State::kArgs;
  return true;
}

bool ToolCallParser::step_args(bool at_end, ParserDelta* out) {
  if (!args_fence_checked_) {
    for (std::string_view fence : {std::string_view("```json\n"), std::string_view("```\n")}) {
      if (buf_.starts_with(fence)) {
        buf_.erase(0, fence.size());
        args_fenced_ = true;
        args_fence_checked_ = true;
        break;
      }
    }
    if (!args_fence_checked_) {
      const bool maybe =
          std::string_view("```json\n").starts_with(buf_) || std::string_view("```\n").starts_with(buf_);
      if (maybe && !at_end) return false;
      args_fence_checked_ = true;
    }
  }
  auto [p, marker] = find_first(buf_, {kCallEnd, kCallBegin, kCallsEnd, kCallsBegin, kEos});
  if (p == std::string::npos) {
    static const std::string kFenceEnd = std::string("\n```") + std::string(kCallEnd);
    static const std::string kFenceEnd2 = std::string("```") + std::string(kCallEnd);
    const size_t hold = at_end ? 0
                               : std::max(held_suffix(buf_, {kFenceEnd, kFenceEnd2, kCallEnd, kCallBegin,
                                                             kCallsEnd, kCallsBegin, kEos}),
                                          incomplete_utf8_tail(buf_));
    emit_args(std::string_view(buf_).substr(0, buf_.size() - hold), out);
    buf_.erase(0, buf_.size() - hold);
    if (at_end) close_call(/*complete=*/false, out);
    return false;
  }
  std::string_view args = std::string_view(buf_).substr(0, p);
  const bool complete = marker == kCallEnd;
  if (complete && args.ends_with("\n```")) {  // the closing fence (held back while streaming)
    args.remove_suffix(4);
  } else if (complete && args.ends_with("```")) {
    args.remove_suffix(3);
  }
  emit_args(args, out);
  buf_.erase(0, complete ? p + marker.size() : p);  // other markers are parsed by the next state
  close_call(complete, out);
  if (marker == kCallsBegin || marker == kEos) state_ = State::kContent;
  return true;
}

ParserDelta ToolCallParser::push(std::string_view text) {
  ParserDelta out;
  buf_.append(text);
  bool progress = true;
  while (progress) {
    switch (state_) {
      case State::kContent:
        progress = step_content(false, &out);
        break;
      case State::kBetweenCalls:
        progress = step_between(false, &out);
        break;
      case State::kHeader:
        progress = step_header(false, &out);
        break;
      case State::kArgs:
        progress = step_args(false, &out);
        break;
    }
  }
  return out;
}

ParserDelta ToolCallParser::finish() {
  ParserDelta out;
  bool progress = true;
  while (progress) {
    switch (state_) {
      case State::kContent:
        progress = step_content(true, &out);
        break;
      case State::kBetweenCalls:
        progress = step_between(true, &out);
        break;
      case State::kHeader:
        progress = step_header(true, &out);
        break;
      case State::kArgs:
        progress = step_args(true, &out);
        break;
    }
  }
  return out;
}

ParsedToolCalls parse_tool_calls(std::string_view text, const ToolCallParserOptions& options) {
  ToolCallParser p(options);
  p.push(text);
  p.finish();
  return {p.content(), p.tool_calls(), p.error()};
}

}  // namespace fathom
