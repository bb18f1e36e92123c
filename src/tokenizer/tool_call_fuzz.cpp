// Fuzz target: the tool-call parser on arbitrary bytes. Streaming in chunks chosen by the input
// must give exactly what the one-shot parse gives, and never crash or lose bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/check.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const fathom::ParsedToolCalls whole = fathom::parse_tool_calls(text, {.id_seed = 1});
  fathom::ToolCallParser p({.id_seed = 1});
  std::string content;
  std::vector<fathom::ToolCall> calls;
  auto absorb = [&](const fathom::ParserDelta& d) {
    content += d.content;
    for (const fathom::ToolCallDelta& c : d.tool_calls) {
      if (c.index == static_cast<int32_t>(calls.size())) calls.push_back({c.id, "function", c.name, ""});
      CHECK(c.index >= 0 && c.index < static_cast<int32_t>(calls.size()));
      calls[c.index].arguments += c.arguments;
    }
  };
  for (size_t pos = 0; pos < text.size(); pos += chunk) absorb(p.push(text.substr(pos, chunk)));
  absorb(p.finish());
  CHECK(content == whole.content);
  CHECK(calls.size() == whole.tool_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].id == whole.tool_calls[i].id);
    CHECK(calls[i].name == whole.tool_calls[i].name);
    CHECK(calls[i].arguments == whole.tool_calls[i].arguments);
  }
  CHECK(p.error().ok() == whole.error.ok());
  return 0;
}
