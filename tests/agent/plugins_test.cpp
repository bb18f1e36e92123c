// Plugins with real peers: the npm MCP servers (filesystem, memory, everything), Fathom's own
// servers driven by the official SDK client, a deliberately broken server (crash, invalid
// JSON-RPC, oversized message, hang), hot-swap through a watched plugins directory, and the MCP
// client's pagination, progress, cancellation and ping against `fathom mcp echo`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "agent/command_runner.h"
#include "agent/mcp_client.h"
#include "agent/plugin_host.h"
#include "agent/process.h"
#include "base/fs.h"
#include "e2e_util.h"

namespace fathom::agent::test {
namespace {

class Plugins : public ::testing::Test {
 protected:
  void SetUp() override { set_self_executable(fathom_bin()); }

  std::unique_ptr<PluginHost> host(const std::string& ws, const std::vector<std::string>& specs,
                                   const std::string& dir = "", int64_t timeout_ms = 20000,
                                   std::map<std::string, std::string> env = {}) {
    std::vector<PluginManifest> ms;
    for (const auto& s : specs) ms.push_back(manifest_from_command_line(s, ws).value());
    for (auto& m : ms) m.env.insert(env.begin(), env.end());
    PluginHostOptions o{
        .workspace = ws, .plugins_dir = dir, .sandbox = {.workspace = ws}, .tool_timeout_ms = timeout_ms};
    auto h = PluginHost::create(o, ms);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return std::move(*h);
  }

  static bool has_tool(PluginHost& h, const std::string& name) {
    for (const auto& t : h.tools())
      if (t.name == name) return true;
    return false;
  }

  // Polls until pred holds (at most ~20 s): restarts and file watching are asynchronous.
  template <typename F>
  static bool eventually(F pred) {
    for (int i = 0; i < 400; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

TEST_F(Plugins, NpmServersWorkAsSandboxedPlugins) {
  const std::string ws = make_temp_dir("npm");
  auto h = host(ws,
                {"node " + npm_server("server-filesystem") + " " + ws, "node " + npm_server("server-memory"),
                 "node " + npm_server("server-everything")},
                "", 20000,
                {{"MEMORY_FILE_PATH", ws + "/memory.jsonl"}});  // its default is its (read-only) install dir
  ASSERT_TRUE(has_tool(*h, "filesystem__write_file"));
  ASSERT_TRUE(has_tool(*h, "memory__create_entities"));
  ASSERT_TRUE(has_tool(*h, "everything__echo"));
  auto w = h->call("filesystem__write_file", {{"path", ws + "/from-npm.txt"}, {"content", "npm wrote this"}},
                   20000, {}, nullptr);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_FALSE(w->is_error) << w->text();
  EXPECT_EQ(read_text(ws + "/from-npm.txt"), "npm wrote this");
  auto outside = h->call("filesystem__read_text_file", {{"path", "/etc/passwd"}}, 20000, {}, nullptr);
  ASSERT_TRUE(outside.ok());
  EXPECT_TRUE(outside->is_error) << outside->text();  // its own allow-list, inside our sandbox
  auto e =
      h->call("memory__create_entities",
              {{"entities",
                json::array({{{"name", "fathom"}, {"entityType", "project"}, {"observations", {"agent"}}}})}},
              20000, {}, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_FALSE(e->is_error) << e->text();
  auto g = h->call("memory__read_graph", json::object(), 20000, {}, nullptr);
  ASSERT_TRUE(g.ok());
  EXPECT_NE(g->text().find("fathom"), std::string::npos) << g->text();
  auto echo = h->call("everything__echo", {{"message", "hello mcp"}}, 20000, {}, nullptr);
  ASSERT_TRUE(echo.ok());
  EXPECT_NE(echo->text().find("hello mcp"), std::string::npos);
  std::atomic<int> progress{0};
  auto lr = h->call(
      "everything__trigger-long-running-operation", {{"duration", 1}, {"steps", 3}}, 20000,
      [&](double, double, const std::string&) { progress++; }, nullptr);
  ASSERT_TRUE(lr.ok()) << lr.status().to_string();
  EXPECT_GE(progress.load(), 2);  // progress notifications reached the caller
}

TEST_F(Plugins, FathomServersAnswerTheOfficialSdkClient) {
  const std::string ws = make_temp_dir("sdk");
  write_text(ws + "/a.txt", "alpha\nbeta\n");
  const std::string script = source_dir() + "/tests/agent/fixtures/sdk_client.mjs";
  auto run_sdk = [&](const json& calls, std::vector<std::string> server) {
    CommandSpec spec;
    spec.argv = {"node", script, calls.dump(), fathom_bin()};
    spec.argv.insert(spec.argv.end(), server.begin(), server.end());
    spec.env = environment_subset({"PATH", "HOME"});
    spec.sandbox.mode = "off";
    spec.output_cap_bytes = 1 << 20;
    auto r = run_command(spec, nullptr, {});
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(r->exit_status, 0) << r->err;
    return json::parse(r->out.substr(r->out.rfind("\n{") == std::string::npos ? 0 : r->out.rfind("\n{") + 1),
                       nullptr, false);
  };
  json files =
      run_sdk(json::array({{{"name", "read_file"}, {"arguments", {{"path", "a.txt"}, {"start_line", 2}}}},
                           {{"name", "edit_file"},
                            {"arguments", {{"path", "a.txt"}, {"old_text", "x"}, {"new_text", "y"}}}}}),
              {"mcp", "files", "--workspace", ws, "--page-size", "2"});
  ASSERT_FALSE(files.is_discarded());
  EXPECT_EQ(files["pages"], 3);  // 6 tools, 2 per page: the SDK followed nextCursor
  EXPECT_EQ(files["tools"].size(), 6u);
  EXPECT_NE(files["calls"][0]["text"].get<std::string>().find("beta"), std::string::npos);
  EXPECT_EQ(files["calls"][0]["text"].get<std::string>().find("alpha"), std::string::npos);
  EXPECT_TRUE(files["calls"][1]["isError"].get<bool>());
  EXPECT_TRUE(files["ping"].get<bool>());

  json shell =
      run_sdk(json::array({{{"name", "run"}, {"arguments", {{"command", "sleep 1.5; echo from-sdk"}}}}}),
              {"mcp", "shell", "--workspace", ws});
  EXPECT_NE(shell["calls"][0]["text"].get<std::string>().find("from-sdk"), std::string::npos);
  EXPECT_GE(shell["progress"].get<int>(), 1);

  CommandSpec mk;  // a database to query
  mk.argv = {"sqlite3", ws + "/d.db",
             "create table t(x int, y text); insert into t values (1,'one'),(2,'two');"};
  mk.env = environment_subset({"PATH"});
  mk.sandbox.mode = "off";
  ASSERT_TRUE(run_command(mk, nullptr, {}).ok());
  json sql = run_sdk(json::array({{{"name", "query"}, {"arguments", {{"sql", "select * from t order by x"}}}},
                                  {{"name", "query"}, {"arguments", {{"sql", "delete from t"}}}},
                                  {{"name", "describe_table"}, {"arguments", {{"table", "t"}}}}}),
                     {"mcp", "sqlite", "--workspace", ws, "--db", "d.db"});
  EXPECT_NE(sql["calls"][0]["text"].get<std::string>().find("| 2 | two |"), std::string::npos) << sql.dump();
  EXPECT_TRUE(sql["calls"][1]["isError"].get<bool>());
  EXPECT_NE(sql["calls"][1]["text"].get<std::string>().find("read-only"), std::string::npos);

  write_text(ws + "/bad.c", "int main() { return x; }\n");
  json build = run_sdk(json::array({{{"name", "run_compile"}, {"arguments", json::object()}}}),
                       {"mcp", "build", "--workspace", ws, "--command", "compile=cc -c bad.c -o /tmp/bad.o"});
  EXPECT_TRUE(build["calls"][0]["isError"].get<bool>());
  EXPECT_NE(build["calls"][0]["text"].get<std::string>().find("1 error(s)"), std::string::npos)
      << build.dump();
}

TEST_F(Plugins, BrokenServersFailTheirCallsAndAreRestarted) {
  const std::string ws = make_temp_dir("broken");
  auto h = host(ws, {"bad=node " + source_dir() + "/tests/agent/fixtures/bad_server.mjs"}, "", 1500);
  ASSERT_TRUE(has_tool(*h, "bad__crash"));
  struct Case {
    std::string tool, expect;
  };
  for (const Case& c : {Case{"bad__crash", "exited with status 3"}, Case{"bad__garbage", "not JSON"},
                        Case{"bad__huge", "byte limit"}, Case{"bad__hang", "timed out"}}) {
    ASSERT_TRUE(eventually([&] { return has_tool(*h, c.tool); })) << "not restarted before " << c.tool;
    auto r = h->call(c.tool, json::object(), c.tool == "bad__hang" ? 1500 : 20000, {}, nullptr);
    ASSERT_FALSE(r.ok()) << c.tool;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.tool << ": " << r.status().message();
  }
  ASSERT_TRUE(eventually([&] { return has_tool(*h, "bad__ok"); }));
  auto ok = h->call("bad__ok", json::object(), 5000, {}, nullptr);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->text(), "fine");
  int restarts = 0;
  for (const auto& s : h->status()) restarts += s.restarts;
  EXPECT_GE(restarts, 3);
}

// A plugin that exits right after writing to stderr: its last lines reach the call's error even
// when the stderr thread reads them after the process is gone (here it is held up on the first
// line; the client used to compose the error without waiting for the rest).
TEST_F(Plugins, ACrashedPluginsLastStderrLinesReachTheError) {
  const std::string ws = make_temp_dir("lastwords");
  McpClientOptions o;
  o.name = "bad";
  o.on_stderr = [](const std::string& line) {
    if (line.find("about to crash") != std::string::npos)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  auto c = McpClient::start({"node", source_dir() + "/tests/agent/fixtures/bad_server.mjs"},
                            environment_subset({"PATH"}), ws, o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto r = (*c)->call_tool("crash", json::object(), 20000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("exited with status 3"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("crashing now"), std::string::npos) << r.status().message();
}

TEST_F(Plugins, HotSwapsManifestsWithoutDisturbingOtherCalls) {
  const std::string ws = make_temp_dir("hotswap");
  const std::string dir = make_temp_dir("plugins");
  write_text(dir + "/slow.toml",
             "command = \"fathom\"\nargs = [\"mcp\", \"echo\"]\n[permissions]\ndefault = \"allow\"\n");
  auto h = host(ws, {}, dir);
  ASSERT_TRUE(has_tool(*h, "slow__sleep"));
  std::atomic<bool> done{false};
  Result<McpToolResult> slow_result = internal_error("not run");
  std::thread slow([&] {
    slow_result = h->call("slow__sleep", {{"ms", 2500}}, 20000, {}, nullptr);
    done = true;
  });
  // Add, edit and remove another plugin while the slow call runs.
  write_text(dir + "/quick.json", R"({"command":"fathom","args":["mcp","echo"]})");
  ASSERT_TRUE(eventually([&] { return has_tool(*h, "quick__echo"); }));
  auto r = h->call("quick__echo", {{"text", "v1"}}, 5000, {}, nullptr);
  ASSERT_TRUE(r.ok());
  write_text(dir + "/quick.json",
             R"({"command":"fathom","args":["mcp","files","--workspace","${workspace}"]})");
  ASSERT_TRUE(eventually([&] { return has_tool(*h, "quick__read_file") && !has_tool(*h, "quick__echo"); }));
  ::unlink((dir + "/quick.json").c_str());
  ASSERT_TRUE(eventually([&] { return !has_tool(*h, "quick__read_file"); }));
  write_text(dir + "/broken.toml",
             "command = [not toml");  // a bad manifest is reported, nothing else changes
  h->poll_now();
  slow.join();
  ASSERT_TRUE(slow_result.ok()) << slow_result.status().to_string();
  EXPECT_EQ(slow_result->text(), "slept 2500 ms");
  EXPECT_TRUE(has_tool(*h, "slow__echo"));
}

TEST_F(Plugins, ClientPaginatesReportsProgressCancelsAndPings) {
  const std::string ws = make_temp_dir("client");
  auto c = McpClient::start({fathom_bin(), "mcp", "echo", "--page-size", "1"}, environment_subset({"PATH"}),
                            ws, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->protocol_version(), "2025-11-25");
  auto tools = (*c)->list_tools();
  ASSERT_TRUE(tools.ok());
  EXPECT_EQ(tools->size(), 2u);  // two pages of one
  int progress = 0;
  auto s = (*c)->call_tool("sleep", {{"ms", 300}}, 5000, [&](double, double total, const std::string&) {
    progress++;
    EXPECT_EQ(total, 300);
  });
  ASSERT_TRUE(s.ok());
  EXPECT_GE(progress, 2);
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  auto cancelled = (*c)->call_tool("sleep", {{"ms", 60000}}, 120000, {}, &cancel);
  canceller.join();
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), StatusCode::kCancelled);
  EXPECT_TRUE((*c)->ping().ok());  // the server dropped the call and still answers
  auto timed_out = (*c)->call_tool("sleep", {{"ms", 60000}}, 200, {}, nullptr);
  // Progress extends a timeout up to 10x, then the call gives up.
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimeout);
  EXPECT_TRUE((*c)->ping().ok());
}

// Tool schemas keep the order their server declared the properties in, through tools/list and the
// client (a model sees them in that order, and the first one starts the call head a server may
// score): the files plugin declares write_file's path before content, search's pattern first.
TEST_F(Plugins, ToolSchemasKeepTheirDeclaredPropertyOrder) {
  const std::string ws = make_temp_dir("order");
  auto c = McpClient::start({fathom_bin(), "mcp", "files", "--workspace", ws}, environment_subset({"PATH"}),
                            ws, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto tools = (*c)->list_tools();
  ASSERT_TRUE(tools.ok()) << tools.status().to_string();
  std::map<std::string, std::vector<std::string>> order;
  for (const McpTool& t : *tools) {
    for (const auto& [key, value] : t.input_schema["properties"].items()) order[t.name].push_back(key);
  }
  EXPECT_EQ(order["write_file"], (std::vector<std::string>{"path", "content"}));
  EXPECT_EQ(order["search"], (std::vector<std::string>{"pattern", "path", "regex", "max_results"}));
  EXPECT_EQ(order["read_file"], (std::vector<std::string>{"path", "start_line", "end_line"}));
}

TEST_F(Plugins, BuiltinServerSurvivesMalformedRequests) {
  const std::string ws = make_temp_dir("malformed");
  auto p = ChildProcess::spawn(
      {.argv = {fathom_bin(), "mcp", "echo"}, .env = environment_subset({"PATH"}), .cwd = ws});
  ASSERT_TRUE(p.ok());
  const std::vector<std::string> lines = {
      "not json",
      "[1,2,3]",
      R"({"jsonrpc":"1.0","id":1,"method":"ping"})",
      R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})",
      R"({"jsonrpc":"2.0","id":2,"method":"initialize","params":5})",
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":7}})",
      R"({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":"str"}})",
      R"({"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"cursor":"zz"}})",
      R"({"jsonrpc":"2.0","id":6,"method":"nope"})",
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":[]})",
      // arguments nested 200000 levels deep: refused before parsing (dumps recurse per level)
      R"({"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"a":)" +
          std::string(200000, '[') + std::string(200000, ']') + "}}}",
      R"({"jsonrpc":"2.0","id":7,"method":"ping"})"};
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  ASSERT_TRUE(write_all((*p)->stdin_fd(), all.data(), all.size(), "stdin").ok());
  std::string out;
  char buf[4096];
  while (out.find(R"("id":7)") == std::string::npos) {
    ssize_t n = ::read((*p)->stdout_fd(), buf, sizeof(buf));
    ASSERT_GT(n, 0) << "server died; output so far: " << out;
    out.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(out.find("-32700"), std::string::npos);  // parse error
  EXPECT_NE(out.find("levels deep"), std::string::npos) << out;
  EXPECT_NE(out.find("-32600"), std::string::npos);  // invalid request
  EXPECT_NE(out.find("-32601"), std::string::npos);  // method not found
  EXPECT_NE(out.find("-32602"), std::string::npos);  // invalid params
  EXPECT_NE(out.find(R"({"id":7,"jsonrpc":"2.0","result":{}})"), std::string::npos)
      << out;  // still answering
}

TEST_F(Plugins, ToolListChangesReachTheHostMidConversation) {
  const std::string ws = make_temp_dir("listchanged");
  write_text(ws + "/build.toml", "[[command]]\nname = \"test\"\nrun = \"echo testing\"\n");
  auto h = host(ws, {"fathom mcp build --config " + ws + "/build.toml"});
  ASSERT_TRUE(has_tool(*h, "build__run_test"));
  const uint64_t v = h->tools_version();
  write_text(ws + "/build.toml",
             "[[command]]\nname = \"test\"\nrun = \"echo testing\"\n[[command]]\nname = \"lint\"\nrun = "
             "\"echo linting\"\n");
  ASSERT_TRUE(eventually([&] { return has_tool(*h, "build__run_lint"); }));
  EXPECT_GT(h->tools_version(), v);
  auto r = h->call("build__run_lint", json::object(), 10000, {}, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->text().find("linting"), std::string::npos);
}

}  // namespace
}  // namespace fathom::agent::test
