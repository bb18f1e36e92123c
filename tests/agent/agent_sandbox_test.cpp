// Attacks through the agent's tools: each must be contained, reported to the model as a tool
// error and logged, and the agent must keep going. The runs go through outer_limit.sh (a pids
// cgroup and a hard timeout around the whole agent) so a failure cannot take the machine down.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "e2e_util.h"

namespace fathom::agent::test {
namespace {

struct Attack {
  std::string ws, outside;
};

Attack setup(const std::string& tag) {
  Attack a{make_temp_dir(tag), make_temp_dir(tag + "-outside")};
  write_text(a.outside + "/secret.txt", "TOP-SECRET\n");
  ::symlink(a.outside.c_str(), (a.ws + "/link").c_str());
  return a;
}

RunResult run_agent(ScriptedEndpoint& ep, const Attack& a, std::vector<std::string> extra = {},
                    std::vector<std::string> env = {}) {
  std::vector<std::string> args = {"agent",
                                   "--endpoint",
                                   ep.url(),
                                   "--model",
                                   "scripted",
                                   "--workspace",
                                   a.ws,
                                   "--plugin",
                                   "fathom mcp files",
                                   "--plugin",
                                   "fathom mcp shell --timeout 5 --output-cap 65536",
                                   "--tool-timeout",
                                   "30",
                                   "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("attack");
  return run_fathom(args, env, 150, source_dir() + "/tests/agent/outer_limit.sh");
}

std::vector<std::string> results_of(ScriptedEndpoint& ep, size_t request) {
  auto reqs = ep.requests();
  EXPECT_GT(reqs.size(), request);
  return reqs.size() > request ? tool_messages(reqs[request]) : std::vector<std::string>{};
}

TEST(AgentSandbox, FileToolsCannotLeaveTheWorkspace) {
  Attack a = setup("fs-escape");
  ScriptedEndpoint ep(
      {reply(tool_calls_message(
           {{"files__read_file",
             R"({"path":"../)" + a.outside.substr(a.outside.rfind('/') + 1) + R"(/secret.txt"})"},
            {"files__read_file", R"({"path":"link/secret.txt"})"},
            {"files__write_file", R"({"path":"link/planted.txt","content":"x"})"},
            {"files__write_file", R"({"path":"/etc/fathom-planted","content":"x"})"},
            {"files__list_directory", R"({"path":"link"})"},
            {"files__read_file", R"({"path":"/proc/self/root/etc/hostname"})"}})),
       reply(text_message("contained"))});
  RunResult r = run_agent(ep, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto res = results_of(ep, 1);
  ASSERT_EQ(res.size(), 6u);
  for (const auto& t : res) {
    EXPECT_EQ(t.rfind("Error:", 0), 0u) << t;
    EXPECT_EQ(t.find("TOP-SECRET"), std::string::npos) << t;
  }
  EXPECT_NE(res[0].find("escapes the workspace"), std::string::npos) << res[0];
  EXPECT_NE(res[1].find("escapes the workspace"), std::string::npos) << res[1];
  EXPECT_NE(res[3].find("outside the workspace"), std::string::npos) << res[3];
  EXPECT_FALSE(std::ifstream(a.outside + "/planted.txt").good());
  EXPECT_FALSE(std::ifstream("/etc/fathom-planted").good());
  EXPECT_NE(r.err.find("escapes the workspace"), std::string::npos);  // logged
}

TEST(AgentSandbox, ShellSeesOnlyTheWorkspaceAndCannotWriteElsewhere) {
  Attack a = setup("sh-escape");
  const std::string conf = make_temp_dir("agent-conf");
  write_text(conf + "/policy.json", R"({"rule":[]})");
  const std::string cmd = "cat " + a.outside + "/secret.txt; cat link/secret.txt; cat " + conf +
                          "/policy.json; ls /root /home " + source_dir() +
                          "; env; echo x > /etc/fathom-planted; "
                          "echo x > /usr/fathom-planted; id -u; echo done";
  ScriptedEndpoint ep({reply(tool_calls_message({{"shell__run", json{{"command", cmd}}.dump()}})),
                       reply(text_message("ok"))});
  RunResult r = run_agent(ep, a, {"--policy", conf + "/policy.json", "--api-key-env", "FATHOM_TEST_API_KEY"},
                          {"FATHOM_TEST_API_KEY=sk-test-DO-NOT-LEAK"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto res = results_of(ep, 1);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].find("TOP-SECRET"), std::string::npos) << res[0];
  EXPECT_EQ(res[0].find("sk-test-DO-NOT-LEAK"), std::string::npos) << res[0];
  EXPECT_EQ(res[0].find("\"rule\""), std::string::npos) << res[0];  // the agent's policy file is not visible
  EXPECT_NE(res[0].find("Read-only file system"), std::string::npos) << res[0];
  EXPECT_NE(res[0].find("\n65534\n"), std::string::npos) << res[0];  // an unprivileged uid
  EXPECT_NE(res[0].find("done"), std::string::npos);
  EXPECT_FALSE(std::ifstream("/etc/fathom-planted").good());
  EXPECT_FALSE(std::ifstream("/usr/fathom-planted").good());
  // The API key went to the endpoint only.
  EXPECT_NE(r.err.find("sandbox active"), std::string::npos);
}

TEST(AgentSandbox, NoNetworkNotEvenTheLocalInferenceServer) {
  Attack a = setup("net");
  ScriptedEndpoint ep({}, ScriptedEndpoint::Mode::kSse);
  const std::string js = "require('net').connect(" + std::to_string(ep.port()) +
                         ",'127.0.0.1').on('connect',()=>{console.log('CONNECTED');process.exit(0)})"
                         ".on('error',e=>{console.log('blocked: '+e.code);process.exit(1)})";
  ScriptedEndpoint ep2(
      {reply(tool_calls_message({{"shell__run", json{{"command", "node -e \"" + js + "\""}}.dump()}})),
       reply(text_message("ok"))});
  RunResult r = run_agent(ep2, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto res = results_of(ep2, 1);
  ASSERT_EQ(res.size(), 1u);
  EXPECT_EQ(res[0].find("CONNECTED"), std::string::npos) << res[0];
  EXPECT_NE(res[0].find("blocked: E"), std::string::npos) << res[0];
  EXPECT_TRUE(ep.requests().empty());  // nothing reached the server
}

TEST(AgentSandbox, ForkBombHangAndFloodAreContained) {
  // The bomb runs in a turn of its own: the shell plugin's commands share its sandbox's pids
  // budget, so a hang started beside the bomb could find no pid left and fail with "Cannot fork"
  // instead of timing out (seen once under a loaded make test).
  Attack a = setup("bomb");
  ScriptedEndpoint ep({reply(tool_calls_message({{"shell__run", R"({"command":"b(){ b|b& }; b; sleep 30"})"}})),
                       reply(tool_calls_message({{"shell__run", R"({"command":"sleep 1000"})"},
                                                 {"shell__run", R"({"command":"yes flood"})"}})),
                       reply(tool_calls_message({{"shell__run", R"({"command":"echo still-works"})"}})),
                       reply(text_message("survived"))});
  RunResult r = run_agent(ep, a);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto res = results_of(ep, 1);
  ASSERT_EQ(res.size(), 1u);
  // The bomb is contained either way: stopped at the time limit, or earlier by the output cap when
  // the pids limit makes its shells print "Cannot fork" fast enough to fill it (seen on a Xeon VM).
  EXPECT_TRUE(res[0].find("timed out") != std::string::npos ||
              res[0].find("output exceeded the cap") != std::string::npos)
      << res[0].substr(0, 500);
  res = results_of(ep, 2);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_NE(res[1].find("timed out"), std::string::npos) << res[1].substr(0, 500);
  EXPECT_NE(res[2].find("output exceeded the cap"), std::string::npos) << res[2].substr(0, 300);
  EXPECT_LT(res[2].size(), 70000u);
  auto later = results_of(ep, 3);
  ASSERT_EQ(later.size(), 4u);
  EXPECT_NE(later[3].find("still-works"), std::string::npos) << later[3];
}

TEST(AgentSandbox, ProbeReportsTheActiveProtections) {
  const std::string ws = make_temp_dir("probe");
  RunResult r = run_fathom({"agent", "probe", "--workspace", ws, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j =
      json::parse(r.out.substr(r.out.rfind('{', r.out.rfind("\"active\"")) == std::string::npos ? 0 : 0));
  ASSERT_TRUE(j.contains("active"));
  // Whatever the host allows is stated plainly; these hold on any Linux the harness supports.
  EXPECT_TRUE(j["active"]["no_new_privs"].get<bool>());
  EXPECT_TRUE(j["active"]["seccomp filter"].get<bool>());
  EXPECT_TRUE(j["active"]["rlimits"].get<bool>());
  EXPECT_TRUE(j["active"]["workspace writable"].get<bool>());
  std::cerr << "probe: " << j.dump() << "\n";
}

}  // namespace
}  // namespace fathom::agent::test
