// Unit tests for the native DeepSeek-V3 chat template (its quirks included), the tools section,
// the OpenAI JSON adapters and the incremental tool-call parser (streaming == one-shot on random
// chunkings, truncated and malformed input).
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <chrono>

#include "base/rng.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace fathom {
namespace {

uint64_t fresh_seed() {
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

ChatMessage msg(std::string role, std::optional<std::string> content) {
  return ChatMessage{std::move(role), std::move(content), {}, {}};
}

ChatMessage calls(std::vector<ToolCall> c) {
  ChatMessage m{"assistant", std::nullopt, std::move(c), {}};
  return m;
}

const std::string kBos = "<｜begin▁of▁sentence｜>";

TEST(ChatTemplate, RendersTurnsLikeDeepSeekV3sTemplate) {
  const ChatTemplate t = ChatTemplate::deepseek_v3();
  std::vector<ChatMessage> m = {msg("system", "S1"), msg("user", "hi"),  msg("assistant", "hello"),
                                msg("system", "S2"), msg("user", "bye"), msg("developer", "ignored")};
  EXPECT_EQ(
      t.render(m).value(),
      kBos + "S1\n\nS2<｜User｜>hi<｜Assistant｜>hello<｜end▁of▁sentence｜><｜User｜>bye<｜Assistant｜>");
  EXPECT_EQ(t.render(m, {}, {.add_generation_prompt = false, .add_bos = false}).value(),
            "S1\n\nS2<｜User｜>hi<｜Assistant｜>hello<｜end▁of▁sentence｜><｜User｜>bye");
}

TEST(ChatTemplate, RendersToolCallsAndOutputsWithTheTemplatesQuirks) {
  const ChatTemplate t = ChatTemplate::deepseek_v3();
  std::vector<ChatMessage> m = {msg("user", "q"), calls({{"c1", "function", "f", "{\"a\":1}"}}),
                                msg("tool", "r"), msg("assistant", "done")};
  // One call: the template never writes <｜tool▁calls▁end｜> (only its later calls close the block).
  EXPECT_EQ(t.render(m).value(), kBos +
                                     "<｜User｜>q<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
                                     "function<｜tool▁sep｜>f\n```json\n"
                                     "{\"a\":1}\n```<｜tool▁call▁end｜><｜tool▁outputs▁begin｜><"
                                     "｜tool▁output▁begin｜>r<｜tool▁output▁end｜>"
                                     "<｜tool▁outputs▁end｜>done<｜end▁of▁sentence｜><｜Assistant｜>");
  // Open tool outputs: closed, and no generation prompt follows.
  std::vector<ChatMessage> open = {msg("user", "q"),
                                   calls({{"c1", "function", "f", "{}"}, {"c2", "function", "g", "{}"}}),
                                   msg("tool", "r1"), msg("tool", "r2")};
  EXPECT_EQ(
      t.render(open).value(),
      kBos +
          "<｜User｜>q<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```"
          "json\n{}\n```"
          "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```<"
          "｜tool▁call▁end｜>"
          "<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>r1"
          "<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>r2<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
  // An assistant message with content renders the content, not its tool calls (as the template does).
  ChatMessage both{"assistant", "text", {{"c", "function", "f", "{}"}}, {}};
  EXPECT_EQ(t.render(std::vector<ChatMessage>{both}, {}, {.add_generation_prompt = false}).value(),
            kBos + "<｜Assistant｜>text<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, NullContentWhereTheTemplateNeedsTextIsAnError) {
  const ChatTemplate t = ChatTemplate::deepseek_v3();
  auto r = t.render(std::vector<ChatMessage>{msg("user", "a"), msg("user", std::nullopt)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("messages[1] (user) has null content"), std::string::npos);
}

TEST(ChatTemplate, RefusesForeignTemplatesUnlessForced) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  EXPECT_TRUE(ChatTemplate::for_tokenizer(**tok).ok());
  auto json = builtin_tokenizer_config_json();
  const std::string marker = "\"chat_template\":";
  const size_t at = json.find(marker);
  ASSERT_NE(at, std::string::npos);
  const std::string foreign = json.substr(0, at) + "\"chat_template\": \"{{ messages }}\"\n}\n";
  auto other = Tokenizer::from_json(builtin_tokenizer_json(), foreign);
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_EQ(ChatTemplate::for_tokenizer(**other).status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(ChatTemplate::for_tokenizer(**other, ChatFormat::kDeepSeekV3).ok());
}

TEST(ChatTemplate, ToolsPromptIsStableAndValidatesSchemas) {
  EXPECT_EQ(render_tools_prompt({}).value(), "");
  std::vector<ToolDefinition> tools = {
      {"get_weather", "Weather now.", R"({ "type" : "object", "properties": {"city": {"type": "string"}} })"},
      {"ping", "", "{}"}};
  const std::string p = render_tools_prompt(tools).value();
  EXPECT_EQ(p, render_tools_prompt(tools).value());
  EXPECT_NE(p.find("### get_weather\nDescription: Weather now.\nParameters: "
                   "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}\n"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("### ping\nParameters: {}\n"), std::string::npos);
  tools[1].parameters_json = "{broken";
  auto bad = render_tools_prompt(tools);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tools[1] ('ping').parameters"), std::string::npos);
  // Tools follow the system prompt (or are the system prompt).
  const ChatTemplate t = ChatTemplate::deepseek_v3();
  tools.pop_back();
  const std::string with_system =
      t.render(std::vector<ChatMessage>{msg("system", "S"), msg("user", "u")}, tools).value();
  EXPECT_EQ(with_system.find(kBos + "S\n\n## Tools"), 0u);
  const std::string alone = t.render(std::vector<ChatMessage>{msg("user", "u")}, tools).value();
  EXPECT_EQ(alone.find(kBos + "## Tools"), 0u);
}

TEST(ChatJson, ParsesOpenAIMessagesAndTools) {
  auto m = parse_chat_messages(R"([
    {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "out"},
    {"role": "assistant"}])");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->size(), 4u);
  EXPECT_EQ((*m)[0].content, "a\nb");
  EXPECT_FALSE((*m)[1].content.has_value());
  EXPECT_EQ((*m)[1].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ((*m)[2].tool_call_id, "call_1");
  EXPECT_FALSE((*m)[3].content.has_value());
  EXPECT_NE(parse_chat_messages("{}").status().message().find("must be an array"), std::string::npos);
  EXPECT_NE(parse_chat_messages(R"([{"content": "x"}])").status().message().find("messages[0].role"),
            std::string::npos);
  EXPECT_EQ(parse_chat_messages(R"([{"role": "user", "content": [{"type": "image_url"}]}])").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_NE(parse_chat_messages(R"([{"role": "assistant", "tool_calls": [{"function": {}}]}])")
                .status()
                .message()
                .find("tool_calls[0].function.name"),
            std::string::npos);
  auto tools = parse_tool_definitions(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}])");
  ASSERT_TRUE(tools.ok());
  EXPECT_EQ((*tools)[0].parameters_json, R"({"b":1,"a":2})");  // key order kept
  EXPECT_FALSE(parse_tool_definitions(R"([{"type": "function", "function": {"name": ""}}])").ok());
  EXPECT_EQ(parse_tool_definitions(R"([{"type": "retrieval"}])").status().code(), StatusCode::kUnimplemented);
}

// ---- tool-call parser ----

const std::string kCallsBegin = "<｜tool▁calls▁begin｜>", kCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kCallBegin = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>",
                  kSep = "<｜tool▁sep｜>";

std::string v3_call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}

TEST(ToolCallParser, ParsesDeepSeekV3CallsIntoOpenAIToolCalls) {
  const std::string text = "Let me check." + kCallsBegin + v3_call("get_weather", R"({"city": "Paris"})") +
                           "\n" + v3_call("get_time", R"({"tz": "CET"})") + kCallsEnd +
                           "<｜end▁of▁sentence｜>";
  ParsedToolCalls p = parse_tool_calls(text, {.id_seed = 7});
  EXPECT_TRUE(p.error.ok()) << p.error.to_string();
  EXPECT_EQ(p.content, "Let me check.<｜end▁of▁sentence｜>");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(p.tool_calls[0].type, "function");
  EXPECT_EQ(p.tool_calls[1].name, "get_time");
  EXPECT_EQ(p.tool_calls[0].id.size(), 29u);
  EXPECT_EQ(p.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_NE(p.tool_calls[0].id, p.tool_calls[1].id);
  EXPECT_EQ(parse_tool_calls(text, {.id_seed = 7}).tool_calls[1].id,
            p.tool_calls[1].id);  // seeded ids repeat
}

TEST(ToolCallParser, AcceptsV31FormAndUnclosedBlocks) {
  ParsedToolCalls p =
      parse_tool_calls(kCallsBegin + kCallBegin + "search" + kSep + R"({"q": "x"})" + kCallEnd);
  EXPECT_TRUE(p.error.ok()) << p.error.to_string();
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].name, "search");
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"q": "x"})");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCallParser, TruncatedAndMalformedCallsNeverCrash) {
  // Cut off inside the arguments: the call keeps what arrived, error() says so.
  ParsedToolCalls cut =
      parse_tool_calls(kCallsBegin + kCallBegin + "function" + kSep + "f\n```json\n{\"a\": ");
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].arguments, "{\"a\": ");
  EXPECT_NE(cut.error.message().find("cut off"), std::string::npos);
  // Cut off in the header: plain content.
  ParsedToolCalls header = parse_tool_calls("hi" + kCallsBegin + kCallBegin + "funct");
  EXPECT_TRUE(header.tool_calls.empty());
  EXPECT_EQ(header.content, "hi" + kCallBegin + "funct");
  EXPECT_FALSE(header.error.ok());
  // A marker where the name should be: plain content; parsing continues after it.
  ParsedToolCalls bad = parse_tool_calls(kCallBegin + "function" + kCallEnd + "tail" + kCallBegin + "g" +
                                         kSep + "{}" + kCallEnd);
  ASSERT_EQ(bad.tool_calls.size(), 1u);
  EXPECT_EQ(bad.tool_calls[0].name, "g");
  EXPECT_NE(bad.content.find("function"), std::string::npos);
  // Arguments that are not a JSON object: the call stays, with an error.
  ParsedToolCalls notjson = parse_tool_calls(kCallsBegin + v3_call("f", "not json") + kCallsEnd);
  ASSERT_EQ(notjson.tool_calls.size(), 1u);
  EXPECT_EQ(notjson.tool_calls[0].arguments, "not json");
  EXPECT_NE(notjson.error.message().find("not a JSON object"), std::string::npos);
  // Marker-like text that never completes is content.
  ParsedToolCalls partial = parse_tool_calls("a <｜tool▁ca b");
  EXPECT_EQ(partial.content, "a <｜tool▁ca b");
  EXPECT_TRUE(partial.error.ok());
}

// A header that does not end within max_header_bytes is content, decided on the same bytes
// however the text is chunked (a fuzzer found the one-shot parse accepting a separator beyond the
// limit that the streaming parse had already given up on).
TEST(ToolCallParser, HeadersLongerThanTheLimitParseAlikeInAnyChunking) {
  const ToolCallParserOptions o{.id_seed = 7, .max_header_bytes = 24};
  const std::string tail = kSep + "{}" + kCallEnd + " after";
  const std::vector<std::string> texts = {
      kCallBegin + "function" + kSep + "a_name_that_is_far_too_long_for_the_limit\n```json\n{}\n```" + kCallEnd,
      kCallBegin + "name_longer_than_twenty_four_bytes" + tail,
      kCallBegin + "中文中文中文中文中文" + tail,  // the limit falls inside a character
      kCallBegin + "short" + tail,              // within the limit: a call
      kCallBegin + "function" + kSep + "f\n{}" + kCallEnd + kCallBegin + std::string(40, 'x') + kCallEnd,
  };
  for (const std::string& text : texts) {
    const ParsedToolCalls whole = parse_tool_calls(text, o);
    for (size_t chunk = 1; chunk <= 24; ++chunk) {
      ToolCallParser p(o);
      std::string content;
      size_t n_calls = 0;
      auto absorb = [&](const ParserDelta& d) {
        ASSERT_EQ(tok::utf8_valid_prefix(d.content), d.content.size()) << "a delta split a character";
        content += d.content;
        for (const ToolCallDelta& c : d.tool_calls) n_calls = std::max(n_calls, static_cast<size_t>(c.index) + 1);
      };
      for (size_t pos = 0; pos < text.size(); pos += chunk) absorb(p.push(std::string_view(text).substr(pos, chunk)));
      absorb(p.finish());
      ASSERT_EQ(content, whole.content) << "chunk " << chunk << " text " << text;
      ASSERT_EQ(n_calls, whole.tool_calls.size()) << "chunk " << chunk;
      ASSERT_EQ(p.error().ok(), whole.error.ok()) << "chunk " << chunk;
    }
  }
  EXPECT_TRUE(parse_tool_calls(texts[1], o).tool_calls.empty());
  EXPECT_NE(parse_tool_calls(texts[1], o).error.message().find("within 24 bytes"), std::string::npos);
  ASSERT_EQ(parse_tool_calls(texts[3], o).tool_calls.size(), 1u);
  EXPECT_EQ(parse_tool_calls(texts[3], o).tool_calls[0].name, "short");
}

// Random generated output (content, well-formed calls, damaged calls) fed in random chunks:
// the deltas add up to exactly what the one-shot parse returns.
TEST(ToolCallParser, StreamingDeltasAddUpToTheOneShotParseOnRandomChunkings) {
  Rng rng(fresh_seed());
  const std::vector<std::string> atoms = {"Sure. ",
                                          "中文 ",
                                          "🙂",
                                          "```code```",
                                          kCallsBegin,
                                          kCallsEnd,
                                          kCallBegin,
                                          kCallEnd,
                                          kSep,
                                          "function",
                                          "\n",
                                          "```json\n",
                                          "\n```",
                                          R"({"a": [1, 2, {"b": "x"}]})",
                                          "get_weather",
                                          "<｜tool▁",
                                          "<｜end▁of▁sentence｜>",
                                          " "};
  for (int round = 0; round < 400; ++round) {
    std::string text;
    const uint64_t n = rng.below(30);
    for (uint64_t i = 0; i < n; ++i) {
      if (rng.below(3) == 0) {
        text += kCallsBegin + v3_call("f" + std::to_string(rng.below(9)),
                                      R"({"k": )" + std::to_string(rng.below(1000)) + "}");
      } else {
        text += atoms[rng.below(atoms.size())];
      }
    }
    const ParsedToolCalls whole = parse_tool_calls(text, {.id_seed = 99});
    ToolCallParser p({.id_seed = 99});
    std::string content;
    std::vector<ToolCall> calls;
    auto absorb = [&](const ParserDelta& d) {
      ASSERT_EQ(tok::utf8_valid_prefix(d.content), d.content.size()) << "a delta split a character";
      content += d.content;
      for (const ToolCallDelta& c : d.tool_calls) {
        if (c.index == static_cast<int32_t>(calls.size())) {
          ASSERT_FALSE(c.id.empty());
          calls.push_back(ToolCall{c.id, "function", c.name, ""});
        }
        ASSERT_LT(c.index, static_cast<int32_t>(calls.size()));
        ASSERT_EQ(tok::utf8_valid_prefix(c.arguments), c.arguments.size()) << "a delta split a character";
        calls[c.index].arguments += c.arguments;
      }
    };
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t len = std::min(text.size() - pos, static_cast<size_t>(1 + rng.below(12)));
      absorb(p.push(std::string_view(text).substr(pos, len)));
      pos += len;
    }
    absorb(p.finish());
    ASSERT_EQ(content, whole.content) << "round " << round;
    ASSERT_EQ(calls.size(), whole.tool_calls.size()) << "round " << round;
    for (size_t i = 0; i < calls.size(); ++i) {
      ASSERT_EQ(calls[i].id, whole.tool_calls[i].id);
      ASSERT_EQ(calls[i].name, whole.tool_calls[i].name);
      ASSERT_EQ(calls[i].arguments, whole.tool_calls[i].arguments) << "round " << round;
    }
    ASSERT_EQ(p.error().ok(), whole.error.ok()) << "round " << round;
    // Nothing of the input is lost: content + call text accounts for every non-marker byte.
    ASSERT_EQ(tok::utf8_valid_prefix(content), content.size());
  }
}

}  // namespace
}  // namespace fathom
