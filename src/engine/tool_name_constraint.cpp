// Tool-name constraint (see tool_name_constraint.h): a scan of the vocabulary per constrained step.
// Names are few and short and a name takes a handful of steps, so a flat scan (V x names prefix
// compares, ~1 ms at V = 129k) costs less than building a trie per request.
#include "engine/tool_name_constraint.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/tokenizer.h"

namespace fathom {

namespace {

// The schema of the tool called `name`, or null (no such tool, or a schema without keys).
const ToolArgsSchema* find_schema(std::string_view name, std::span<const std::string> names,
                                  std::span<const ToolArgsSchema> schemas) {
  for (size_t i = 0; i < names.size() && i < schemas.size(); ++i) {
    if (names[i] == name && !schemas[i].keys.empty()) return &schemas[i];
  }
  return nullptr;
}

}  // namespace

void ToolNameState::feed(int32_t token, std::string_view bytes, int32_t sep,
                         std::span<const std::string> names, std::span<const ToolArgsSchema> schemas) {
  end_pending = false;
  if (token == sep) {
    active = true;
    prefix.clear();
    args_active = false;
    return;
  }
  if (args_active) {
    feed_args(bytes);
    return;
  }
  if (!active) return;
  const size_t nl = bytes.find('\n');
  if (nl == std::string_view::npos) {
    prefix += bytes;
    return;
  }
  prefix += bytes.substr(0, nl + 1);
  active = false;
  args_active = true;
  args = ToolArgsMatcher(find_schema(std::string_view(prefix).substr(0, prefix.find('\n')), names, schemas));
  feed_args(bytes.substr(nl + 1));
}

void ToolNameState::start_args(std::string_view name, std::span<const std::string> names,
                               std::span<const ToolArgsSchema> schemas) {
  active = false;
  end_pending = false;
  args_active = true;
  args = ToolArgsMatcher(find_schema(name, names, schemas));
  (void)args.feed(ToolArgsMatcher::kFence);
}

void ToolNameState::start_name() {
  active = true;
  prefix.clear();
  args_active = false;
  end_pending = false;
}

void ToolNameState::feed_args(std::string_view bytes) {
  for (char c : bytes) {
    if (!args.feed(static_cast<uint8_t>(c))) {
      args_active = false;
      return;
    }
  }
  if (args.complete()) {
    args_active = false;
    end_pending = true;
  }
}

std::unique_ptr<ToolNameVocab> ToolNameVocab::create(const Tokenizer& tok, int32_t vocab_size) {
  auto v = std::unique_ptr<ToolNameVocab>(new ToolNameVocab());
  v->bytes_.resize(static_cast<size_t>(std::max(vocab_size, 0)));
  const int32_t n = std::min(vocab_size, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = tok.token_type(id);
    if (type == TokenType::kControl || type == TokenType::kUnused || tok.is_special(id)) continue;
    auto bytes = tok.token_bytes(id);
    if (bytes.ok()) v->bytes_[static_cast<size_t>(id)] = std::move(*bytes);
  }
  return v;
}

bool ToolNameVocab::mask(std::string_view prefix, std::span<const std::string> names, uint64_t* allowed) const {
  std::memset(allowed, 0, mask_words() * sizeof(uint64_t));
  // What is left of each name (with its "\n") that the prefix still leads to.
  std::vector<std::string> rest;
  for (const std::string& name : names) {
    const std::string full = name + "\n";
    if (full.size() > prefix.size() && full.compare(0, prefix.size(), prefix) == 0)
      rest.push_back(full.substr(prefix.size()));
  }
  if (rest.empty()) return false;
  bool any = false;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    for (const std::string& r : rest) {
      // b continues the name, or completes it (its "\n" included) and goes on past it into the
      // arguments ("\n```"), where what follows must start them as the template does.
      const bool ok = b.size() <= r.size() ? r.compare(0, b.size(), b) == 0
                                           : b.compare(0, r.size(), r) == 0 &&
                                                 ToolArgsMatcher().feed(std::string_view(b).substr(r.size()));
      if (ok) {
        allowed[id / 64] |= uint64_t{1} << (id % 64);
        any = true;
        break;
      }
    }
  }
  return any;
}

}  // namespace fathom
