// Unit tests of the agent's pure parts: argument schemas, unified diffs, policies, the SSE/JSON
// chat parser (random fragmentation, seed printed), workspace confinement, manifests.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "agent/chat_client.h"
#include "agent/patch.h"
#include "agent/plugin_host.h"
#include "agent/policy.h"
#include "agent/schema.h"
#include "agent/trajectory.h"
#include "agent/workspace_fs.h"
#include "base/rng.h"

namespace fathom::agent {
namespace {

using json = nlohmann::json;

std::string temp_dir() {
  std::string t = "/tmp/fathom-agent-unit-XXXXXX";
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

TEST(Schema, AcceptsValidArgumentsAndNamesEachViolation) {
  json s = {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}}},
              {"n", {{"type", "integer"}, {"minimum", 1}}},
              {"mode", {{"enum", {"a", "b"}}}},
              {"tags", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
            {"required", {"path"}},
            {"additionalProperties", false}};
  EXPECT_TRUE(validate_json(s, {{"path", "x"}, {"n", 2}, {"mode", "a"}, {"tags", {"u"}}}).ok());
  EXPECT_NE(validate_json(s, json::object()).message().find("missing required property 'path'"),
            std::string::npos);
  EXPECT_NE(validate_json(s, {{"path", 1}}).message().find("arguments.path: expected string"),
            std::string::npos);
  EXPECT_NE(validate_json(s, {{"path", "x"}, {"n", 0}}).message().find("below the minimum"),
            std::string::npos);
  EXPECT_NE(validate_json(s, {{"path", "x"}, {"mode", "c"}}).message().find("not one of"), std::string::npos);
  EXPECT_NE(validate_json(s, {{"path", "x"}, {"tags", {1}}}).message().find("arguments.tags[0]"),
            std::string::npos);
  EXPECT_NE(validate_json(s, {{"path", "x"}, {"pth", 1}}).message().find("unknown property 'pth'"),
            std::string::npos);
}

TEST(Patch, AppliesHunksAtShiftedPositionsAndRejectsWhatDoesNotMatch) {
  const std::string orig = "a\nb\nc\nd\ne\nf\n";
  auto files =
      parse_unified_diff("--- a/x\n+++ b/x\n@@ -2,2 +2,2 @@\n b\n-c\n+C\n@@ -5,1 +5,2 @@\n e\n+e2\n");
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  auto out = apply_hunks("z\n" + orig, (*files)[0]);  // one line earlier in the file than the diff says
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "z\na\nb\nC\nd\ne\ne2\nf\n");
  auto bad = apply_hunks("q\nr\n", (*files)[0]);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hunk 1"), std::string::npos);
  EXPECT_FALSE(parse_unified_diff("@@ -1 +1 @@\n-a\n+b\n").ok());                    // no file header
  EXPECT_FALSE(parse_unified_diff("--- a/x\n+++ b/x\n@@ -1,2 +1,1 @@\n-a\n").ok());  // counts disagree
}

TEST(Patch, RandomEditsRoundTrip) {
  const uint64_t seed = static_cast<uint64_t>(::getpid()) * 7919u;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string> lines;
    for (int i = 0; i < 30; ++i)
      lines.push_back("line " + std::to_string(i) + " " + std::to_string(rng.below(1000)));
    const int at = static_cast<int>(rng.below(27));
    std::string diff = "--- a/f\n+++ b/f\n" + fmt::format("@@ -{},3 +{},3 @@\n", at + 1, at + 1);
    diff += " " + lines[at] + "\n-" + lines[at + 1] + "\n+changed\n " + lines[at + 2] + "\n";
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    auto files = parse_unified_diff(diff);
    ASSERT_TRUE(files.ok());
    auto out = apply_hunks(text, (*files)[0]);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    lines[at + 1] = "changed";
    std::string want;
    for (const auto& l : lines) want += l + "\n";
    EXPECT_EQ(*out, want) << "trial " << trial;
  }
}

// Files the agent reads (a policy, a trajectory to replay) that nest JSON 200000 levels deep are
// errors naming the file and the depth, not a stack overflow.
TEST(Policy, DeeplyNestedPolicyAndTrajectoryFilesAreErrors) {
  const std::string dir = temp_dir();
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  {
    std::ofstream(dir + "/policy.json") << R"({"rule": )" << deep << "}";
    std::ofstream(dir + "/t.jsonl") << R"({"type":"meta","version":1,"x":)" << deep << "}\n";
  }
  auto p = Policy::load(dir + "/policy.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("levels deep"), std::string::npos) << p.status().message();
  auto t = read_trajectory(dir + "/t.jsonl");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 1 nests JSON"), std::string::npos) << t.status().message();
  std::filesystem::remove_all(dir);
}

TEST(Policy, FirstMatchingRuleWinsThenThePluginDefault) {
  auto p = Policy::from_json(
      {{"rule",
        {{{"tool", "shell__run"},
          {"args", {{"command", "*rm -rf*"}}},
          {"decision", "deny"},
          {"reason", "no"}},
         {{"tool", "shell__*"}, {"args", {{"command", "re:^git (status|log)"}}}, {"decision", "allow"}},
         {{"tool", "files__write_*"}, {"decision", "ask"}}}}},
      "test");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->decide("shell__run", {{"command", "cd x && rm -rf /"}}, "allow").decision, Decision::kDeny);
  EXPECT_EQ(p->decide("shell__run", {{"command", "git status"}}, "deny").decision, Decision::kAllow);
  EXPECT_EQ(p->decide("shell__run", {{"command", "make"}}, "deny").decision,
            Decision::kDeny);  // plugin default
  EXPECT_EQ(p->decide("files__write_file", json::object(), "allow").decision, Decision::kAsk);
  EXPECT_NE(p->decide("shell__run", {{"command", "rm -rf x"}}, "allow").why.find("rule 1 (no)"),
            std::string::npos);
  EXPECT_FALSE(Policy::from_json({{"rule", {{{"tool", "x"}, {"decision", "perhaps"}}}}}, "t").ok());
  EXPECT_FALSE(
      Policy::from_json({{"rule", {{{"tool", "x"}, {"args", {{"a", "re:("}}}, {"decision", "deny"}}}}}, "t")
          .ok());
}

TEST(ChatStream, ReassemblesFragmentedSseAndPlainJson) {
  const std::string sse =
      "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n"
      "data: "
      "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"a__b\","
      "\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n"
      "data: "
      "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"c__d\","
      "\"arguments\":\"{}\"}}]}}]}\n\n"
      "data: "
      "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},"
      "\"finish_reason\":\"tool_calls\"}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n"
      "data: [DONE]\n\n";
  const uint64_t seed = static_cast<uint64_t>(::time(nullptr));
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 100; ++trial) {
    std::string text;
    ChatStreamParser p([&](const std::string& t) { text += t; });
    for (size_t i = 0; i < sse.size();) {
      const size_t n = 1 + rng.below(40);
      ASSERT_TRUE(p.feed(std::string_view(sse).substr(i, n)).ok());
      i += n;
    }
    auto r = p.finish(true);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(text, "Hello");
    ASSERT_EQ(r->message["tool_calls"].size(), 2u);
    EXPECT_EQ(r->message["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
    EXPECT_EQ(r->message["tool_calls"][1]["function"]["name"], "c__d");
    EXPECT_EQ(r->finish_reason, "tool_calls");
    EXPECT_EQ(r->usage["prompt_tokens"], 5);
  }
  ChatStreamParser plain({});
  ASSERT_TRUE(
      plain.feed(R"({"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]})")
          .ok());
  auto r = plain.finish(false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->streamed);
  EXPECT_EQ(r->message["content"], "hi");
  ChatStreamParser garbage({});
  ASSERT_TRUE(garbage.feed("<html>bad gateway</html>").ok());
  EXPECT_FALSE(garbage.finish(false).ok());
  ChatStreamParser bad_event({});
  EXPECT_FALSE(bad_event.feed("data: {not json}\n\n").ok());
  // An endpoint's event or body nested 200000 levels deep is an error naming the depth (the tool
  // calls and usage it would carry are copied and dumped, which recursed per level).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  ChatStreamParser deep_event({});
  const Status st = deep_event.feed(R"(data: {"usage":)" + deep + "}\n\n");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("levels deep"), std::string::npos) << st.message().substr(0, 200);
  ChatStreamParser deep_body({});
  ASSERT_TRUE(deep_body.feed(R"({"choices":[{"message":{"role":"assistant","content":)" + deep + "}}]}").ok());
  EXPECT_FALSE(deep_body.finish(false).ok());
}

TEST(ChatStream, TypeConfusedEventsAreErrorsNotCrashes) {
  const std::vector<std::string> events = {R"({"choices":[5]})",
                                           R"({"choices":[{"delta":{"tool_calls":[7]}}]})",
                                           R"({"choices":[{"delta":{"content":5}}]})",
                                           R"({"choices":[{"delta":{"tool_calls":[{"index":"x"}]}}]})",
                                           R"({"choices":[{"delta":"text"}]})",
                                           R"({"choices":[{"finish_reason":3,"delta":{}}]})",
                                           R"({"usage":7,"choices":[]})",
                                           R"([1,2])",
                                           R"("str")"};
  for (const auto& e : events) {
    ChatStreamParser p({});
    Status s = p.feed("data: " + e + "\n\n");
    if (s.ok()) (void)p.finish(true);  // either an error or a response: never an exception
  }
  const uint64_t seed = static_cast<uint64_t>(::time(nullptr)) ^ 0x5eed;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Rng rng(seed);
  const std::vector<std::string> atoms = {"{",
                                          "}",
                                          "[",
                                          "]",
                                          ",",
                                          ":",
                                          "\"choices\"",
                                          "\"delta\"",
                                          "\"tool_calls\"",
                                          "\"index\"",
                                          "\"function\"",
                                          "\"arguments\"",
                                          "\"content\"",
                                          "1",
                                          "null",
                                          "\"x\"",
                                          "true",
                                          "-1",
                                          "99999999999"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string body;
    const int n = 1 + static_cast<int>(rng.below(30));
    for (int i = 0; i < n; ++i) body += atoms[rng.below(atoms.size())];
    ChatStreamParser sse({});
    if (sse.feed("data: " + body + "\n\n").ok()) (void)sse.finish(true);
    ChatStreamParser plain({});
    (void)plain.feed(body);
    (void)plain.finish(false);
  }
}

TEST(Workspace, ConfinesDotDotSymlinksAndAbsolutePaths) {
  const std::string ws = temp_dir(), outside = temp_dir();
  std::ofstream(outside + "/secret") << "s";
  ASSERT_EQ(::symlink(outside.c_str(), (ws + "/out").c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (ws + "/pw").c_str()), 0);
  auto w = Workspace::open(ws);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->write("a/b/c.txt", "hello").ok());
  EXPECT_EQ(w->read(ws + "/a/b/c.txt", 100).value_or(""), "hello");
  for (const std::string& bad :
       std::vector<std::string>{"../x", "a/../../x", "out/secret", "pw", "/etc/passwd", outside + "/secret"})
    EXPECT_FALSE(w->read(bad, 100).ok()) << bad;
  EXPECT_FALSE(w->write("out/planted", "x").ok());
  EXPECT_FALSE(w->write("../planted", "x").ok());
  EXPECT_FALSE(std::ifstream(outside + "/planted").good());
  EXPECT_NE(w->read("out/secret", 100).status().message().find("escapes the workspace"), std::string::npos);
  std::filesystem::remove_all(ws);
  std::filesystem::remove_all(outside);
}

TEST(ToolSpecs, KeepSchemaOrderAndCutLongDescriptionsAtACharacterBoundary) {
  // A 3-byte character straddles byte 2000: the description is cut before it, so the request still
  // serialises (half a UTF-8 sequence would make dump() throw).
  std::string desc = std::string(1999, 'a') + "\xe2\x82\xac" + std::string(50, 'b');
  nlohmann::ordered_json schema = {
      {"type", "object"}, {"properties", {{"zeta", {{"type", "string"}}}, {"alpha", {{"type", "string"}}}}}};
  std::vector<ToolEntry> tools = {{.name = "p__long", .description = desc, .input_schema = schema},
                                  {.name = "p__bare", .description = "no schema"}};
  const nlohmann::ordered_json specs = openai_tool_specs(tools);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0]["function"]["description"].get<std::string>(), std::string(1999, 'a'));
  EXPECT_NO_THROW((void)specs.dump());
  EXPECT_EQ(specs[0]["function"]["parameters"]["properties"].begin().key(), "zeta");  // declared order
  EXPECT_EQ(specs[1]["function"]["parameters"], nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_EQ(specs[1]["function"]["name"], "p__bare");
}

TEST(Manifest, ParsesTomlAndRejectsBadFieldsByName) {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/files.toml")
      << "command = \"fathom\"\nargs = [\"mcp\", \"files\", \"--workspace\", \"${workspace}\"]\n"
         "tool_timeout_s = 5\n[sandbox]\nnetwork = true\npids_max = 64\n"
         "[permissions]\ndefault = \"deny\"\ntools = { read_file = \"allow\" }\n";
  auto m = load_manifest(dir + "/files.toml", "/work/x");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->name, "files");
  EXPECT_EQ(m->args.back(), "/work/x");
  EXPECT_TRUE(m->sandbox.network);
  EXPECT_EQ(m->sandbox.limits.pids_max, 64);
  EXPECT_EQ(m->tool_timeout_ms, 5000);
  EXPECT_EQ(m->permission_tools["read_file"], "allow");
  std::ofstream(dir + "/bad.json") << R"({"command":"x","comand":"y"})";
  auto bad = load_manifest(dir + "/bad.json", "/w");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown field 'comand'"), std::string::npos);
  std::ofstream(dir + "/perm.json") << R"({"command":"x","permissions":{"default":"sometimes"}})";
  EXPECT_FALSE(load_manifest(dir + "/perm.json", "/w").ok());
  EXPECT_EQ(namespaced_tool_name("fs", "read.file/v2"), "fs__read_file_v2");
  EXPECT_LE(namespaced_tool_name("p", std::string(100, 'x')).size(), 64u);
  auto cli = manifest_from_command_line("mine=node 'a b.js' --flag", "/w");
  ASSERT_TRUE(cli.ok());
  EXPECT_EQ(cli->name, "mine");
  EXPECT_EQ(cli->args[0], "a b.js");
  EXPECT_EQ(cli->permission_default, "allow");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fathom::agent
