// The agent loop end to end: the fathom binary against the scripted endpoint (test double) with
// Fathom's built-in plugins. Structured so that a real endpoint (`fathom serve`) is one URL more:
// see AgentAgainstRealEndpoint at the bottom.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "e2e_util.h"

namespace fathom::agent::test {
namespace {

std::vector<std::string> agent_args(const ScriptedEndpoint& ep, const std::string& ws,
                                    const std::string& task) {
  return {"agent",
          "--endpoint",
          ep.url(),
          "--model",
          "scripted",
          "--workspace",
          ws,
          "--plugin",
          "fathom mcp files",
          "--plugin",
          "fathom mcp shell --timeout 20",
          "--json",
          task};
}

json last_json_line(const std::string& out) {
  auto p = out.rfind("\n{");
  return json::parse(p == std::string::npos ? out : out.substr(p + 1), nullptr, false);
}

TEST(AgentLoop, WritesReadsAndAnswersThroughStreamedToolCalls) {
  const std::string ws = make_temp_dir("loop");
  ScriptedEndpoint ep({reply(tool_calls_message(
                           {{"files__write_file", R"({"path":"notes/hello.txt","content":"hi there\n"})"}})),
                       reply(tool_calls_message({{"files__read_file", R"({"path":"notes/hello.txt"})"}})),
                       reply(text_message("The file says hi there."))});
  const std::string traj = ws + "/../" + ws.substr(ws.rfind('/') + 1) + ".traj.jsonl";
  auto args = agent_args(ep, ws, "write a greeting and read it back");
  args.insert(args.end() - 1, {"--trajectory", traj});
  RunResult r = run_fathom(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("The file says hi there."), std::string::npos)
      << r.out;  // streamed text reaches stdout
  EXPECT_EQ(read_text(ws + "/notes/hello.txt"), "hi there\n");
  auto reqs = ep.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_TRUE(reqs[0]["stream"].get<bool>());
  bool has_files_tool = false;
  for (const auto& t : reqs[0]["tools"]) has_files_tool |= t["function"]["name"] == "files__write_file";
  EXPECT_TRUE(has_files_tool);
  EXPECT_EQ(reqs[0].value("temperature", -1.0), 0.0);  // greedy by default
  // The definitions sent are those `fathom agent tools --json` prints as openai_tools (what the
  // default model's corpus trains on, scripts/corpus/agent_tasks.py), in the same order.
  RunResult listed = run_fathom({"agent", "tools", "--workspace", ws, "--plugin", "fathom mcp files",
                                 "--plugin", "fathom mcp shell --timeout 20", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(last_json_line(listed.out)["openai_tools"], reqs[0]["tools"]);
  auto tools2 = tool_messages(reqs[2]);
  ASSERT_EQ(tools2.size(), 2u);
  EXPECT_NE(tools2[1].find("hi there"), std::string::npos);
  json result = last_json_line(r.out);
  EXPECT_EQ(result["status"], "final");
  EXPECT_EQ(result["tool_calls"], 2);
  auto events = read_jsonl(traj);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["type"], "meta");
  int responses = 0, results = 0;
  for (const auto& e : events) {
    responses += e["type"] == "model_response";
    results += e["type"] == "tool_result";
    EXPECT_TRUE(e.contains("t_ms"));
  }
  EXPECT_EQ(responses, 3);
  EXPECT_EQ(results, 2);

  // Replay without a model: the same tool calls give the same results...
  RunResult same = run_fathom({"agent", "replay", traj, "--json"});
  EXPECT_EQ(same.exit_code, 0) << same.err << same.out;
  json rep = last_json_line(same.out);
  EXPECT_EQ(rep["identical"], 2);
  EXPECT_EQ(rep["differed"], 0);
  // ...and a workspace where the tools now behave differently is reported (here "notes" is a
  // file, so the write and the read fail).
  const std::string other = make_temp_dir("replay");
  write_text(other + "/notes", "a file, not a directory\n");
  RunResult diff = run_fathom({"agent", "replay", traj, "--json", "--workspace", other});
  EXPECT_EQ(diff.exit_code, 4) << diff.err;
  json rep2 = last_json_line(diff.out);
  EXPECT_EQ(rep2["tool_calls"], 2);
  EXPECT_EQ(rep2["differed"], 2);
  EXPECT_EQ(rep2["differences"].size(), 2u);
  ::unlink(traj.c_str());
}

TEST(AgentLoop, HandlesAPlainJsonAnswerToAStreamingRequest) {
  const std::string ws = make_temp_dir("plain");
  ScriptedEndpoint ep(
      {reply(tool_calls_message({{"shell__run", R"({"command":"echo plain-ok > out.txt"})"}})),
       reply(text_message("done"))},
      ScriptedEndpoint::Mode::kPlainJson);
  auto args = agent_args(ep, ws, "run it");
  args.insert(args.end() - 1, {"--temperature", "server"});  // none sent: the endpoint's default
  RunResult r = run_fathom(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(ws + "/out.txt"), "plain-ok\n");
  for (const auto& q : ep.requests()) EXPECT_FALSE(q.contains("temperature"));
  EXPECT_TRUE(ep.requests()[0]["stream"].get<bool>());  // asked for a stream, got JSON, coped
}

TEST(AgentLoop, RunsParallelToolCallsConcurrently) {
  // Each command waits for the other's file: run one after the other, both would time out.
  const std::string ws = make_temp_dir("parallel");
  const std::string a =
      R"({"command":"touch a; i=0; while [ ! -f b ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -f b && echo A-saw-B"})";
  const std::string b =
      R"({"command":"touch b; i=0; while [ ! -f a ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -f a && echo B-saw-A"})";
  ScriptedEndpoint ep(
      {reply(tool_calls_message({{"shell__run", a}, {"shell__run", b}})), reply(text_message("ok"))});
  RunResult r = run_fathom(agent_args(ep, ws, "rendezvous"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto reqs = ep.requests();
  ASSERT_EQ(reqs.size(), 2u);
  auto results = tool_messages(reqs[1]);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_NE(results[0].find("A-saw-B"), std::string::npos) << results[0];
  EXPECT_NE(results[1].find("B-saw-A"), std::string::npos) << results[1];
}

TEST(AgentLoop, ReportsBadToolCallsToTheModelAndKeepsGoing) {
  const std::string ws = make_temp_dir("bad");
  ScriptedEndpoint ep(
      {reply(tool_calls_message({{"files__read_file", R"({"path": "x.txt", )"},          // malformed JSON
                                 {"nosuch__tool", R"({})"},                              // unknown tool
                                 {"files__read_file", R"({"path": 42})"},                // schema: type
                                 {"files__read_file", R"({"file": "x"})"},               // schema: required
                                 {"files__read_file", R"({"path": "missing.txt"})"}})),  // tool error
       reply(text_message("recovered"))});
  RunResult r = run_fathom(agent_args(ep, ws, "try things"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto results = tool_messages(ep.requests()[1]);
  ASSERT_EQ(results.size(), 5u);
  EXPECT_NE(results[0].find("not valid JSON"), std::string::npos) << results[0];
  EXPECT_NE(results[1].find("unknown tool 'nosuch__tool'"), std::string::npos) << results[1];
  EXPECT_NE(results[1].find("files__read_file"), std::string::npos);  // lists what exists
  EXPECT_NE(results[2].find("expected string"), std::string::npos) << results[2];
  EXPECT_NE(results[3].find("missing required property 'path'"), std::string::npos) << results[3];
  EXPECT_NE(results[4].find("Error:"), std::string::npos) << results[4];
  EXPECT_EQ(last_json_line(r.out)["tool_errors"], 5);
}

TEST(AgentLoop, SurvivesTypeConfusedToolCallsFromTheModel) {
  const std::string ws = make_temp_dir("confused");
  json weird = {
      {"role", "assistant"},
      {"content", nullptr},
      {"tool_calls",
       json::array({{{"id", 5}, {"type", "function"}, {"function", "files__list_directory"}},
                    {{"id", "ok"}, {"function", {{"name", 42}, {"arguments", 7}}}},
                    {{"id", "args-object"},
                     {"function", {{"name", "files__list_directory"}, {"arguments", json::object()}}}}})}};
  ScriptedEndpoint ep({reply(weird), reply(text_message("still here"))}, ScriptedEndpoint::Mode::kPlainJson);
  RunResult r = run_fathom(agent_args(ep, ws, "go"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto results = tool_messages(ep.requests()[1]);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_NE(results[0].find("unknown tool ''"), std::string::npos) << results[0];
  EXPECT_NE(results[1].find("unknown tool ''"), std::string::npos) << results[1];
  EXPECT_EQ(results[2].find("Error"), std::string::npos)
      << results[2];  // an object for arguments is accepted
}

TEST(AgentLoop, APluginCrashingMidCallIsAToolErrorAndTheRunGoesOn) {
  const std::string ws = make_temp_dir("crash");
  ScriptedEndpoint ep({reply(tool_calls_message({{"bad__crash", "{}"}, {"files__list_directory", "{}"}})),
                       reply(text_message("carried on"))});
  auto args = agent_args(ep, ws, "crash it");
  args.insert(args.end() - 1,
              {"--plugin", "bad=node " + source_dir() + "/tests/agent/fixtures/bad_server.mjs"});
  RunResult r = run_fathom(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto results = tool_messages(ep.requests()[1]);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_NE(results[0].find("exited with status 3"), std::string::npos) << results[0];
  EXPECT_NE(results[0].find("crashing now"), std::string::npos) << results[0];  // its stderr tail
  EXPECT_EQ(results[1].find("Error"), std::string::npos) << results[1];         // the other plugin was fine
  EXPECT_NE(r.out.find("carried on"), std::string::npos);
}

TEST(AgentLoop, StopsAtTheStepLimit) {
  const std::string ws = make_temp_dir("steps");
  std::vector<ScriptedEndpoint::Step> forever(10,
                                              reply(tool_calls_message({{"files__list_directory", "{}"}})));
  ScriptedEndpoint ep(forever);
  auto args = agent_args(ep, ws, "loop");
  args.insert(args.end() - 1, {"--max-steps", "3"});
  RunResult r = run_fathom(args);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_EQ(ep.requests().size(), 3u);
  EXPECT_EQ(last_json_line(r.out)["status"], "step_limit");
}

TEST(AgentLoop, StopsAtTheTokenBudget) {
  const std::string ws = make_temp_dir("budget");
  std::vector<ScriptedEndpoint::Step> forever(10,
                                              reply(tool_calls_message({{"files__list_directory", "{}"}})));
  ScriptedEndpoint ep(forever);  // usage: a quarter of the request size
  auto args = agent_args(ep, ws, "loop");
  args.insert(args.end() - 1, {"--max-tokens-total", "6000"});
  RunResult r = run_fathom(args);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_GE(ep.requests().size(), 2u);
  EXPECT_LT(ep.requests().size(), 10u);
  EXPECT_EQ(last_json_line(r.out)["status"], "budget_limit");
}

TEST(AgentLoop, CutsOversizedToolOutputsAtCharacterBoundaries) {
  // 150,000 bytes of a 3-byte character: the output cap (100,000 bytes, half kept at each end) falls
  // inside a character on both sides. The cut must keep the text valid UTF-8 — the request, the
  // context estimate and the trajectory all serialise it — and the run must go on.
  const std::string ws = make_temp_dir("utf8cut");
  std::string euros;
  for (int i = 0; i < 50000; ++i) euros += "\xe2\x82\xac";
  write_text(ws + "/euros.txt", euros);
  // Arguments that are not JSON are quoted back to the model (300 bytes): here byte 300 falls
  // inside a character too. And a later request cuts the older outputs to fit --context-tokens.
  ScriptedEndpoint ep({reply(tool_calls_message({{"files__read_file", "x" + euros.substr(0, 600)}})),
                       reply(tool_calls_message({{"files__read_file", R"({"path":"euros.txt"})"}})),
                       reply(tool_calls_message({{"files__read_file", R"({"path":"euros.txt"})"}})),
                       reply(text_message("a lot of euros"))});
  const std::string traj = ws + ".utf8.jsonl";
  auto args = agent_args(ep, ws, "read euros.txt");
  args.insert(args.end() - 1,
              {"--trajectory", traj, "--context-tokens", "40000", "--reserve-tokens", "1000"});
  RunResult r = run_fathom(args);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  auto reqs = ep.requests();
  ASSERT_EQ(reqs.size(), 4u);
  auto outs = tool_messages(reqs[2]);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_NE(outs[0].find("not valid JSON"), std::string::npos) << outs[0];
  EXPECT_NE(outs[1].find("cut by fathom"), std::string::npos);
  auto last = tool_messages(reqs[3]);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_NE(last[1].find("removed by fathom to fit the context window"), std::string::npos);
  for (const auto& o : last)
    EXPECT_EQ(o.find("\xef\xbf\xbd"), std::string::npos) << "a character was split (U+FFFD in the output)";
  EXPECT_EQ(last_json_line(r.out)["status"], "final");
  EXPECT_FALSE(read_jsonl(traj).empty());
  ::unlink(traj.c_str());
}

// Runs the agent on one call of bad_server.mjs's `tool` followed by a final answer; returns the
// tool result the model got on its second request ("" after a failed expectation).
std::string misbehaving_plugin_result(const std::string& tool) {
  const std::string ws = make_temp_dir(tool);
  ScriptedEndpoint ep({reply(tool_calls_message({{"bad__" + tool, "{}"}})), reply(text_message("noted"))});
  auto args = agent_args(ep, ws, "call it");
  args.insert(args.end() - 1,
              {"--plugin", "bad=node " + source_dir() + "/tests/agent/fixtures/bad_server.mjs"});
  RunResult r = run_fathom(args);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_EQ(last_json_line(r.out)["status"], "final");
  auto reqs = ep.requests();
  EXPECT_EQ(reqs.size(), 2u);
  if (reqs.size() != 2) return "";
  auto outs = tool_messages(reqs[1]);
  EXPECT_EQ(outs.size(), 1u);
  return outs.size() == 1 ? outs[0] : "";
}

TEST(AgentLoop, APluginWritingInvalidUtf8IsAToolErrorNotACrash) {
  // The plugin answers a call with a line of invalid UTF-8; the client's error quotes it, so the
  // tool result the model gets holds bytes that are not UTF-8. Sizing and sending the conversation
  // must not throw on them (the request carries U+FFFD instead).
  const std::string out = misbehaving_plugin_result("badutf8");
  EXPECT_NE(out.find("Error:"), std::string::npos) << out;
}

TEST(AgentLoop, APluginAnsweringWithDeeplyNestedJsonIsAToolErrorNotACrash) {
  // 200000 nested arrays in a 400 KB result line: nlohmann parses them iteratively, but copying
  // or dumping them recursed once per level and overflowed the stack (SIGSEGV). The line is now
  // refused before it is parsed, as a protocol error that names the depth.
  const std::string out = misbehaving_plugin_result("deep");
  EXPECT_NE(out.find("Error:"), std::string::npos) << out.substr(0, 300);
  EXPECT_NE(out.find("levels deep"), std::string::npos) << out.substr(0, 300);
  EXPECT_LT(out.size(), 20000u);
}

TEST(AgentLoop, CallArgumentsNestedTooDeepAreAToolErrorNotACrash) {
  // The endpoint's reply is flat JSON, but a call's arguments string holds 200000 nested arrays:
  // parsed, then dumped for the plugin, it overflowed the stack. Refused with the depth named.
  const std::string ws = make_temp_dir("deepargs");
  const std::string deep = R"({"path":)" + std::string(200000, '[') + std::string(200000, ']') + "}";
  ScriptedEndpoint ep({reply(tool_calls_message({{"files__read_file", deep}})), reply(text_message("noted"))});
  RunResult r = run_fathom(agent_args(ep, ws, "read it"));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  auto reqs = ep.requests();
  ASSERT_EQ(reqs.size(), 2u);
  auto outs = tool_messages(reqs[1]);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_NE(outs[0].find("levels deep"), std::string::npos) << outs[0].substr(0, 300);
  EXPECT_EQ(last_json_line(r.out)["status"], "final");
}

TEST(AgentLoop, TruncatesOlderToolOutputsToFitTheContextAndLogsIt) {
  const std::string ws = make_temp_dir("context");
  std::string big(30000, 'x');
  write_text(ws + "/big.txt", big + "\n");
  ScriptedEndpoint ep({reply(tool_calls_message({{"files__read_file", R"({"path":"big.txt"})"}})),
                       reply(tool_calls_message({{"files__read_file", R"({"path":"big.txt"})"}})),
                       reply(tool_calls_message({{"files__read_file", R"({"path":"big.txt"})"}})),
                       reply(text_message("read it thrice"))});
  const std::string traj = ws + ".ctx.jsonl";
  auto args = agent_args(ep, ws, "read big.txt");
  args.insert(args.end() - 1,
              {"--context-tokens", "16000", "--reserve-tokens", "1000", "--trajectory", traj});
  RunResult r = run_fathom(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto reqs = ep.requests();
  ASSERT_EQ(reqs.size(), 4u);
  // The newest tool output is intact; older ones were cut, and the requests stay bounded.
  auto last = tool_messages(reqs[3]);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_GT(last[2].size(), 30000u);
  EXPECT_NE(last[0].find("removed by fathom to fit the context window"), std::string::npos);
  EXPECT_LT(reqs[3]["messages"].dump().size(), 60000u);
  EXPECT_NE(r.err.find("context: cut"), std::string::npos) << r.err;
  int logged = 0;
  for (const auto& e : read_jsonl(traj)) logged += e["type"] == "context";
  EXPECT_GE(logged, 1);
  ::unlink(traj.c_str());
}

TEST(AgentLoop, AppliesThePolicyAndAuditsEveryDecision) {
  const std::string ws = make_temp_dir("policy");
  const std::string dir = make_temp_dir("policy-conf");
  write_text(dir + "/policy.toml", R"(
[[rule]]
tool = "shell__run"
args = { command = "*rm *" }
decision = "deny"
reason = "no deletes"

[[rule]]
tool = "files__write_file"
decision = "ask"
)");
  write_text(ws + "/keep.txt", "keep\n");
  auto script = [] {
    return std::vector<ScriptedEndpoint::Step>{
        reply(tool_calls_message({{"shell__run", R"({"command":"rm -f keep.txt"})"},
                                  {"files__write_file", R"({"path":"new.txt","content":"x"})"},
                                  {"shell__run", R"({"command":"echo allowed"})"}})),
        reply(text_message("ok"))};
  };
  {
    ScriptedEndpoint ep(script());
    auto args = agent_args(ep, ws, "try");
    args.insert(args.end() - 1, {"--policy", dir + "/policy.toml", "--audit-log", dir + "/audit.jsonl"});
    RunResult r = run_fathom(args);  // no terminal and no --yes: ask denies
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto results = tool_messages(ep.requests()[1]);
    ASSERT_EQ(results.size(), 3u);
    EXPECT_NE(results[0].find("denied"), std::string::npos) << results[0];
    EXPECT_NE(results[0].find("no deletes"), std::string::npos);
    EXPECT_NE(results[1].find("pass --yes"), std::string::npos) << results[1];
    EXPECT_NE(results[2].find("allowed"), std::string::npos) << results[2];
    EXPECT_TRUE(std::ifstream(ws + "/keep.txt").good());
    EXPECT_FALSE(std::ifstream(ws + "/new.txt").good());
  }
  {
    ScriptedEndpoint ep(script());
    auto args = agent_args(ep, ws, "try");
    args.insert(args.end() - 1,
                {"--policy", dir + "/policy.toml", "--audit-log", dir + "/audit.jsonl", "--yes"});
    RunResult r = run_fathom(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(std::ifstream(ws + "/new.txt").good());   // ask -> allow with --yes
    EXPECT_TRUE(std::ifstream(ws + "/keep.txt").good());  // deny stays deny
  }
  auto audit = read_jsonl(dir + "/audit.jsonl");
  ASSERT_EQ(audit.size(), 6u);
  int denied = 0;
  for (const auto& a : audit) denied += a["decision"].get<std::string>().find("deny") != std::string::npos;
  EXPECT_EQ(denied, 3);
}

TEST(AgentLoop, RejectsABadPolicyFileByName) {
  const std::string dir = make_temp_dir("badpolicy");
  write_text(dir + "/p.json", R"({"rule":[{"tool":"x","decision":"maybe"}]})");
  ScriptedEndpoint ep({});
  RunResult r = run_fathom({"agent", "--endpoint", ep.url(), "--model", "m", "--workspace", dir, "--policy",
                            dir + "/p.json", "t"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rule 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'maybe'"), std::string::npos) << r.err;
}

TEST(AgentLoop, ReportsAnEndpointThatIsDown) {
  const std::string ws = make_temp_dir("down");
  int port;
  {
    ScriptedEndpoint gone({});
    port = gone.port();
  }
  RunResult r = run_fathom({"agent", "--endpoint", "http://127.0.0.1:" + std::to_string(port) + "/v1",
                            "--model", "m", "--workspace", ws, "hello"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("endpoint"), std::string::npos) << r.err;
}

// The same loop against a real OpenAI-compatible server, when one is named:
//   FATHOM_AGENT_E2E_ENDPOINT=http://127.0.0.1:8080/v1 FATHOM_AGENT_E2E_MODEL=name
// (`fathom serve` once it exists; any vLLM/llama.cpp server works too). A real model's answers
// are not scripted, so this checks the protocol: the run ends cleanly, tools were offered.
TEST(AgentLoop, AgentAgainstRealEndpoint) {
  const char* url = std::getenv("FATHOM_AGENT_E2E_ENDPOINT");
  if (!url) GTEST_SKIP() << "set FATHOM_AGENT_E2E_ENDPOINT to run against a real server";
  const char* model = std::getenv("FATHOM_AGENT_E2E_MODEL");
  const std::string ws = make_temp_dir("real");
  RunResult r = run_fathom(
      {"agent", "--endpoint", url, "--model", model ? model : "default", "--workspace", ws, "--plugin",
       "fathom mcp files", "--max-steps", "4", "--json", "List the files in the workspace, then say done."},
      {}, 600);
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.err;
  json result = last_json_line(r.out);
  EXPECT_TRUE(result["status"] == "final" || result["status"] == "step_limit");
}

}  // namespace
}  // namespace fathom::agent::test
