// Tests of the corpus encoding (against the server's own prompt builder and tool-call parser),
// the UTF-8 and JSONL error paths, the unigram baseline and the tool-reply scorer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/fs.h"
#include "eval/eval.h"
#include "server/openai.h"

namespace fathom::eval {
namespace {

using nlohmann::json;

const Tokenizer& builtin() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::from_builtin();
    EXPECT_TRUE(t.ok()) << t.status().message();
    return std::move(*t);
  }();
  return *tok;
}

json tool(const std::string& name, const std::string& desc) {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"description", desc},
            {"parameters",
             {{"type", "object"},
              {"properties", {{"city", {{"type", "string"}, {"description", "City name"}}}}},
              {"required", {"city"}}}}}}};
}

// A conversation as scripts/corpus/gen_chat.py writes it, with random words in the user turn.
json random_conversation(std::mt19937_64& rng) {
  static const char* words[] = {"weather",     "Paris", "please", "what's", "Tokyo", "file",
                                "notes/a.txt", "ok",    "é",      "日本",   "  ",    "\n",
                                "{x}",         "```",   "42",     "Hey,"};
  std::string user;
  for (int i = 0, n = 1 + static_cast<int>(rng() % 12); i < n; ++i)
    user += std::string(words[rng() % 16]) + " ";
  const std::string name = rng() % 2 ? "get_weather" : "fetchCurrentWeather";
  json messages = json::array();
  if (rng() % 2) messages.push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  messages.push_back({{"role", "user"}, {"content", user}});
  messages.push_back({{"role", "assistant"},
                      {"content", nullptr},
                      {"tool_calls",
                       {{{"id", "call_0"},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", R"({"city":"Paris"})"}}}}}}});
  messages.push_back({{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", R"({"temperature": 21})"}});
  messages.push_back({{"role", "assistant"}, {"content", "It is 21 degrees in Paris."}});
  json tools = json::array({tool(name, "Get the weather."), tool("lookup-contact", "Find a person.")});
  return {{"messages", messages}, {"tools", tools}};
}

std::vector<int32_t> server_ids(const json& request) {
  ApiError err;
  auto req = parse_chat_request(request, &err);
  EXPECT_TRUE(req.ok()) << err.message;
  auto builder = ChatPromptBuilder::create(builtin());
  EXPECT_TRUE(builder.ok());
  auto ids = builder->build(*req);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return *ids;
}

TEST(Corpus, RenderedChatEncodesExactlyAsTheServerBuildsThePrompt) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  for (int iter = 0; iter < 50; ++iter) {
    json conv = random_conversation(rng);
    auto doc = parse_document(conv.dump(), tmpl, "test");
    ASSERT_TRUE(doc.ok()) << doc.status().message();
    ASSERT_EQ(doc->kind, DocKind::kChat);
    std::vector<TokenId> ours;
    ASSERT_TRUE(encode_document(builtin(), *doc, &ours).ok());
    // The server renders the same messages and then opens a new assistant turn.
    json request = {{"model", "m"}, {"messages", conv["messages"]}, {"tools", conv["tools"]}};
    std::vector<TokenId> expected = server_ids(request);
    ASSERT_FALSE(expected.empty());
    EXPECT_EQ(expected.back(), builtin().chat_tokens().assistant);
    expected.pop_back();
    ASSERT_EQ(ours, expected) << "seed " << seed << " conversation " << conv.dump();
    // The prompt the server builds for the user turn alone is a prefix of the training document.
    json first = {{"model", "m"}, {"messages", json::array()}, {"tools", conv["tools"]}};
    for (const auto& m : conv["messages"]) {
      first["messages"].push_back(m);
      if (m["role"] == "user") break;
    }
    const std::vector<TokenId> prompt = server_ids(first);
    ASSERT_LE(prompt.size(), ours.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), ours.begin())) << "seed " << seed;
  }
}

TEST(Corpus, ToolCallCompletionIsTheServersPromptPlusAReplyItsParserReads) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  for (int iter = 0; iter < 20; ++iter) {
    json conv = random_conversation(rng);
    json upto = json::array();
    for (const auto& m : conv["messages"]) {
      upto.push_back(m);
      if (m.contains("tool_calls")) break;
    }
    const json call = upto.back()["tool_calls"][0]["function"];
    json line = {{"messages", upto}, {"tools", conv["tools"]}, {"render", "tool_call_completion"}};
    auto doc = parse_document(line.dump(), tmpl, "test");
    ASSERT_TRUE(doc.ok()) << doc.status().message();
    std::vector<TokenId> ours;
    ASSERT_TRUE(encode_document(builtin(), *doc, &ours).ok());
    json prompt_req = {{"model", "m"}, {"messages", upto}, {"tools", conv["tools"]}};
    prompt_req["messages"].erase(prompt_req["messages"].size() - 1);
    const std::vector<TokenId> prompt = server_ids(prompt_req);
    ASSERT_LT(prompt.size(), ours.size());
    ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), ours.begin())) << "seed " << seed;
    EXPECT_EQ(ours.back(), builtin().eos_id());
    // The reply, as the server would decode it (control tokens kept), parses into the same call.
    auto reply = builtin().decode(
        std::span<const TokenId>(ours).subspan(prompt.size(), ours.size() - prompt.size() - 1));
    ASSERT_TRUE(reply.ok());
    const ParsedToolCalls p = parse_tool_calls(*reply);
    EXPECT_TRUE(p.error.ok()) << p.error.message();
    ASSERT_EQ(p.tool_calls.size(), 1u) << *reply;
    EXPECT_EQ(p.tool_calls[0].name, call["name"].get<std::string>());
    EXPECT_EQ(json::parse(p.tool_calls[0].arguments), json::parse(call["arguments"].get<std::string>()));
    EXPECT_EQ(p.content, "") << *reply;
  }
  auto bad = parse_document(
      R"({"messages":[{"role":"user","content":"hi"}],"render":"tool_call_completion"})", tmpl, "f:3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f:3"), std::string::npos);
}

// The scored tokens of a document, in order (mask byte 1).
std::vector<TokenId> scored(const std::vector<TokenId>& ids, const std::vector<uint8_t>& mask) {
  std::vector<TokenId> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i]) out.push_back(ids[i]);
  return out;
}

TEST(Corpus, LossMaskScoresExactlyWhatTheAssistantWrites) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  const ChatTokenIds& c = builtin().chat_tokens();
  for (int iter = 0; iter < 20; ++iter) {
    json conv = random_conversation(rng);
    const json call = conv["messages"][conv["messages"].size() - 3]["tool_calls"][0]["function"];
    auto doc = parse_document(conv.dump(), tmpl, "test");
    ASSERT_TRUE(doc.ok());
    std::vector<TokenId> ids;
    ASSERT_TRUE(encode_document(builtin(), *doc, &ids).ok());
    std::vector<uint8_t> mask = {7};  // appended after what is there
    loss_mask(builtin(), DocKind::kChat, ids, &mask);
    ASSERT_EQ(mask.size(), ids.size() + 1);
    EXPECT_EQ(mask[0], 7);
    mask.erase(mask.begin());
    // The whole prompt of the first user turn, as the server builds it, is context.
    json first = {{"model", "m"}, {"messages", json::array()}, {"tools", conv["tools"]}};
    for (const auto& m : conv["messages"]) {
      first["messages"].push_back(m);
      if (m["role"] == "user") break;
    }
    const std::vector<TokenId> prompt = server_ids(first);
    for (size_t i = 0; i < prompt.size(); ++i) ASSERT_EQ(mask[i], 0) << "prompt token " << i;
    // What is scored: the call (closed by the template's <｜tool▁outputs▁begin｜>), then the answer and EOS.
    const std::string want = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>" +
                             call["name"].get<std::string>() + "\n```json\n" +
                             call["arguments"].get<std::string>() +
                             "\n```<｜tool▁call▁end｜><｜tool▁outputs▁begin｜>It is 21 degrees in Paris.";
    const std::vector<TokenId> got = scored(ids, mask);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.back(), builtin().eos_id());
    auto text = builtin().decode(std::span<const TokenId>(got).first(got.size() - 1));
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, want) << "seed " << seed;
    // The tool output and the markers the server writes are never scored.
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == c.assistant || ids[i] == c.user || ids[i] == c.tool_outputs_end ||
          ids[i] == c.tool_output_begin || ids[i] == builtin().bos_id()) {
        EXPECT_EQ(mask[i], 0) << i;
      }
    }
  }
  // Plain text: every token but BOS.
  auto doc = parse_document(R"({"text": "Plain words, <｜User｜> stays text."})", tmpl, "t");
  ASSERT_TRUE(doc.ok());
  std::vector<TokenId> ids;
  ASSERT_TRUE(encode_document(builtin(), *doc, &ids).ok());
  std::vector<uint8_t> mask;
  loss_mask(builtin(), DocKind::kText, ids, &mask);
  ASSERT_EQ(mask.size(), ids.size());
  EXPECT_EQ(mask[0], 0);
  EXPECT_EQ(std::count(mask.begin(), mask.end(), uint8_t{1}), static_cast<ptrdiff_t>(ids.size() - 1));
}

TEST(Corpus, PlainTextIsUntrustedAndEndsWithEos) {
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  auto doc = parse_document(R"({"text": "a <｜Assistant｜> b"})", tmpl, "t");
  ASSERT_TRUE(doc.ok());
  std::vector<TokenId> ids;
  ASSERT_TRUE(encode_document(builtin(), *doc, &ids).ok());
  EXPECT_EQ(ids.front(), builtin().bos_id());
  EXPECT_EQ(ids.back(), builtin().eos_id());
  for (size_t i = 1; i + 1 < ids.size(); ++i) EXPECT_NE(ids[i], builtin().chat_tokens().assistant);
}

std::string temp_dir() {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("fathom-eval-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(Corpus, NonUtf8InputNamesTheFileAndByteOffset) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/bad.jsonl";
  ASSERT_TRUE(write_file_atomic(path, "{\"text\": \"ok\"}\n{\"text\": \"caf\xe9\"}\n").ok());
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  auto docs = read_documents(path, tmpl);
  ASSERT_FALSE(docs.ok());
  EXPECT_NE(docs.status().message().find(path), std::string::npos) << docs.status().message();
  EXPECT_NE(docs.status().message().find("byte offset 28"), std::string::npos) << docs.status().message();
  auto r = tokenize_corpus(builtin(), {.inputs = {path}, .out_dir = dir});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("byte offset 28"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir + "/train.bin"));
  std::filesystem::remove_all(dir);
}

TEST(Corpus, BadLinesAreErrorsNamingFileAndLine) {
  const std::string dir = temp_dir();
  const ChatTemplate tmpl = ChatTemplate::deepseek_v3(builtin().bos_token());
  const std::pair<std::string, std::string> cases[] = {
      {"{\"text\": \"ok\"}\n[1, 2]\n", ":2: not a JSON object"},
      {"{\"text\": 5}\n", ":1: \"text\" must be a string"},
      {"{\"other\": 1}\n", ":1: the object has neither"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n", ":1"},
  };
  for (const auto& [content, want] : cases) {
    ASSERT_TRUE(write_file_atomic(dir + "/c.jsonl", content).ok());
    auto docs = read_documents(dir + "/c.jsonl", tmpl);
    ASSERT_FALSE(docs.ok()) << content;
    EXPECT_NE(docs.status().message().find(want), std::string::npos) << docs.status().message();
  }
  std::filesystem::remove_all(dir);
}

TEST(Corpus, TokenizeWritesBosStartedDocumentsDeterministically) {
  const std::string dir = temp_dir();
  std::string jsonl;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    jsonl +=
        (i % 3 ? random_conversation(rng) : json({{"text", "plain document " + std::to_string(i)}})).dump() +
        "\n";
  }
  ASSERT_TRUE(write_file_atomic(dir + "/in.jsonl", jsonl).ok());
  auto r1 = tokenize_corpus(builtin(),
                            {.inputs = {dir + "/in.jsonl"}, .out_dir = dir, .val_fraction = 0.1, .loss_mask = true});
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  const std::string train1 = *read_file(dir + "/train.bin"), val1 = *read_file(dir + "/val.bin");
  auto r2 = tokenize_corpus(builtin(),
                            {.inputs = {dir + "/in.jsonl"}, .out_dir = dir, .val_fraction = 0.1, .loss_mask = true});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(train1, *read_file(dir + "/train.bin"));
  EXPECT_EQ(val1, *read_file(dir + "/val.bin"));
  EXPECT_EQ(r1->n_train_docs + r1->n_val_docs, 200);
  EXPECT_GT(r1->n_val_docs, 0);
  // uint32 little-endian ids (the trainer's loader, which validates them, is tested in trainer_test.cpp)
  auto ids = [](const std::string& bytes) {
    std::vector<uint32_t> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), v.size() * 4);
    return v;
  };
  const std::vector<uint32_t> train = ids(train1), val = ids(val1);
  EXPECT_EQ(train1.size() % 4, 0u);
  EXPECT_EQ(static_cast<int64_t>(train.size()), r1->n_train_tokens);
  EXPECT_EQ(train[0], static_cast<uint32_t>(builtin().bos_id()));
  EXPECT_EQ(val[0], static_cast<uint32_t>(builtin().bos_id()));
  EXPECT_EQ(std::count(train.begin(), train.end(), uint32_t(builtin().bos_id())), r1->n_train_docs);
  auto meta = json::parse(*read_file(dir + "/meta.json"));
  EXPECT_EQ(meta["format"], "fathom-tokens-v1");
  EXPECT_EQ(meta["vocab_size"], builtin().vocab_size());
  EXPECT_EQ(meta["bos_id"], builtin().bos_id());
  EXPECT_EQ(meta["n_val_tokens"], r1->n_val_tokens);
  // The masks: one byte per token, their counts in meta.json; a wrong-sized or non-0/1 mask is refused.
  EXPECT_EQ(meta["loss_mask"], "uint8");
  // (Mask files are read and refused when malformed by the trainer's loader: trainer_test.cpp.)
  const std::string train_mask = *read_file(dir + "/train.mask");
  EXPECT_EQ(static_cast<int64_t>(train_mask.size()), r1->n_train_tokens);
  EXPECT_EQ(std::count(train_mask.begin(), train_mask.end(), '\1'), r1->n_train_targets);
  EXPECT_EQ(std::count(train_mask.begin(), train_mask.end(), '\0') + r1->n_train_targets, r1->n_train_tokens);
  EXPECT_EQ(meta["n_train_targets"], r1->n_train_targets);
  EXPECT_GT(r1->n_train_targets, 0);
  EXPECT_LT(r1->n_train_targets, r1->n_train_tokens);
  // Without --loss-mask: no mask files (stale ones removed), no mask fields.
  auto r3 = tokenize_corpus(builtin(), {.inputs = {dir + "/in.jsonl"}, .out_dir = dir, .val_fraction = 0.1});
  ASSERT_TRUE(r3.ok());
  EXPECT_FALSE(path_exists(dir + "/train.mask"));
  EXPECT_FALSE(json::parse(*read_file(dir + "/meta.json")).contains("loss_mask"));
  std::filesystem::remove_all(dir);
}

TEST(Unigram, MatchesHandComputedCrossEntropyWithAddOneSmoothing) {
  const std::vector<int32_t> train = {0, 0, 1}, val = {0, 1, 2, 2};
  auto r = unigram_baseline(train, val, 3);
  ASSERT_TRUE(r.ok());
  // p = (count + 1) / (3 + 3): p0 = 1/2, p1 = 1/3, p2 = 1/6.
  const double want = -(std::log(0.5) + std::log(1.0 / 3) + 2 * std::log(1.0 / 6)) / 4;
  EXPECT_NEAR(r->cross_entropy_nats, want, 1e-12);
  EXPECT_NEAR(r->val_entropy_nats, -(2 * 0.25 * std::log(0.25) + 0.5 * std::log(0.5)), 1e-12);
  EXPECT_EQ(r->n_val_unseen, 2);
  EXPECT_FALSE(unigram_baseline(train, {}, 3).ok());
  EXPECT_FALSE(unigram_baseline(train, std::vector<int32_t>{5}, 3).ok());
  EXPECT_FALSE(unigram_baseline(train, std::vector<int32_t>{-1}, 3).ok());
  // Masked: only scored tokens count on both sides. train {0, _, 1}, val {_, 1, 2, _}:
  // p = (count + 1) / (2 + 3): p1 = 2/5, p2 = 1/5.
  const std::vector<uint8_t> tm = {1, 0, 1}, vm = {0, 1, 1, 0};
  auto m = unigram_baseline(train, val, 3, tm, vm);
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR(m->cross_entropy_nats, -(std::log(0.4) + std::log(0.2)) / 2, 1e-12);
  EXPECT_EQ(m->n_train, 2);
  EXPECT_EQ(m->n_val, 2);
  EXPECT_FALSE(unigram_baseline(train, val, 3, tm, std::vector<uint8_t>{1}).ok());
  EXPECT_FALSE(unigram_baseline(train, val, 3, tm, std::vector<uint8_t>{0, 0, 0, 0}).ok());
}

TEST(ToolScore, ClassifiesRepliesByTheirFirstToolCall) {
  auto msg = [](const std::string& name, const std::string& args) {
    return json{{"role", "assistant"},
                {"content", nullptr},
                {"tool_calls",
                 {{{"id", "c"}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}}}}};
  };
  std::string d;
  EXPECT_EQ(score_tool_reply(msg("get_weather", R"({"city":"Oslo"})"), "get_weather", &d),
            ToolOutcome::kCorrect);
  EXPECT_EQ(score_tool_reply(msg("get_weather", "{}"), "get_weather", &d), ToolOutcome::kCorrect);
  EXPECT_EQ(score_tool_reply(msg("get_weather", R"({"city":)"), "get_weather", &d), ToolOutcome::kBadArgs);
  EXPECT_EQ(score_tool_reply(msg("get_weather", "[1]"), "get_weather", &d), ToolOutcome::kBadArgs);
  EXPECT_EQ(score_tool_reply(msg("get_forecast", "{}"), "get_weather", &d), ToolOutcome::kWrongTool);
  EXPECT_NE(d.find("get_forecast"), std::string::npos);
  EXPECT_EQ(score_tool_reply({{"role", "assistant"}, {"content", "It is sunny."}}, "get_weather", &d),
            ToolOutcome::kNoToolCall);
  EXPECT_NE(d.find("It is sunny."), std::string::npos);
  EXPECT_EQ(
      score_tool_reply({{"role", "assistant"}, {"content", "x"}, {"tool_calls", json::array()}}, "a", &d),
      ToolOutcome::kNoToolCall);
  EXPECT_EQ(score_tool_reply(json("garbage"), "a", &d), ToolOutcome::kNoToolCall);
}

TEST(ToolScore, HeldoutSetErrorsNameTheLine) {
  const std::string dir = temp_dir();
  ASSERT_TRUE(write_file_atomic(dir + "/h.jsonl",
                                "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{}],"
                                "\"expected_tool\":\"a\"}\n{\"messages\":[]}\n")
                  .ok());
  auto r = read_heldout(dir + "/h.jsonl");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("h.jsonl:2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(read_heldout(dir + "/missing.jsonl").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fathom::eval
