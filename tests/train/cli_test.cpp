// `fathom train` and `fathom export` as a user runs them: a run interrupted by SIGINT saves a
// checkpoint and exits 130, --resume continues it (log steps contiguous), the export loads in
// `fathom generate` (HF bf16, HF fp8, GGUF), and bad input exits 1 naming the problem.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

std::string fathom_bin() {
  const char* b = std::getenv("FATHOM_BIN");
  return b && *b ? b : FATHOM_TEST_BIN;
}

struct Proc {
  pid_t pid = -1;
  std::string out_path;
};

// Starts fathom with args, stdout+stderr to a file.
Proc spawn(const std::vector<std::string>& args, const std::string& out_path) {
  std::vector<std::string> argv = {fathom_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  Proc p{fork(), out_path};
  if (p.pid == 0) {
    const int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    setenv("FATHOM_NO_PROGRESS", "1", 1);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return p;
}

int wait_exit(const Proc& p) {
  int status = 0;
  waitpid(p.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct CliResult {
  int code;
  std::string out;
};
CliResult run_cli(const std::vector<std::string>& args, const std::string& dir) {
  const Proc p = spawn(args, dir + "/out.txt");
  const int code = wait_exit(p);
  return {code, slurp(dir + "/out.txt")};
}

std::vector<nlohmann::json> log_rows(const std::string& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run_dir + "/log.jsonl");
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

void write_u32(const std::string& path, const std::vector<uint32_t>& ids) {
  std::ofstream out(path, std::ios::binary);
  for (uint32_t v : ids) {
    const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 24)};
    out.write(b, 4);
  }
}

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/train_cli_" + std::to_string(getpid());
    fs::remove_all(dir_);
    data_ = dir_ + "/data";
    fs::create_directories(data_);
    auto tok = Tokenizer::from_builtin();
    ASSERT_TRUE(tok.ok());
    vocab_ = ((*tok)->vocab_size() + 63) / 64 * 64;
    // Counting documents (learnable), the built-in tokenizer's files beside them.
    std::vector<uint32_t> train, val;
    uint32_t a = 0;
    for (int d = 0; d < 240; ++d) {
      auto& t = d < 200 ? train : val;
      t.push_back(1);
      for (int i = 0; i < 20 + d % 17; ++i) t.push_back(4 + (a++ % 64));
      t.push_back(2);
    }
    write_u32(data_ + "/train.bin", train);
    write_u32(data_ + "/val.bin", val);
    std::ofstream(data_ + "/meta.json") << nlohmann::json{{"format", "fathom-tokens-v1"},
                                                          {"vocab_size", vocab_},
                                                          {"bos_id", 1},
                                                          {"eos_id", 2},
                                                          {"n_train_tokens", train.size()},
                                                          {"n_val_tokens", val.size()}}
                                               .dump();
    std::ofstream(data_ + "/tokenizer.json") << builtin_tokenizer_json();
    std::ofstream(data_ + "/tokenizer_config.json") << builtin_tokenizer_config_json();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> train_args(const std::string& out, int steps) const {
    return {"train",
            "--data",
            data_,
            "--preset",
            "tiny",
            "--layers",
            "2",
            "--experts",
            "8",
            "--mtp",
            "--out",
            out,
            "--steps",
            std::to_string(steps),
            "--seq-len",
            "16",
            "--batch",
            "2",
            "--eval-every",
            "4",
            "--eval-batches",
            "1",
            "--save-every",
            "0",
            "--no-peak",
            "--threads",
            "1"};
  }

  std::string dir_, data_;
  int64_t vocab_ = 0;
};

TEST_F(TrainCli, SigintCheckpointsResumeContinuesAndTheExportGenerates) {
  const std::string out = dir_ + "/run";
  const Proc p = spawn(train_args(out, 100000), dir_ + "/train.txt");
  // Wait for a few logged steps, then interrupt.
  for (int i = 0; i < 600 && (!fs::exists(out + "/log.jsonl") || log_rows(out).size() < 3); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(log_rows(out).size(), 3u) << slurp(dir_ + "/train.txt");
  kill(p.pid, SIGINT);
  EXPECT_EQ(wait_exit(p), 130) << slurp(dir_ + "/train.txt");
  ASSERT_TRUE(fs::exists(out + "/checkpoint.bin"));
  EXPECT_TRUE(fs::exists(out + "/loss.svg"));
  const int64_t done = static_cast<int64_t>(log_rows(out).size());

  // Resume to done + 3: the log's steps run 1..done+3 without a gap or a repeat.
  std::vector<std::string> args = train_args(out, static_cast<int>(done + 3));
  args.push_back("--resume");
  args.push_back("--json");
  const CliResult r = run_cli(args, dir_);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = log_rows(out);
  ASSERT_EQ(static_cast<int64_t>(rows.size()), done + 3);
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(rows[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
  EXPECT_TRUE(rows.back().contains("val_loss"));

  for (const auto& [format, dtype, path] :
       {std::tuple<std::string, std::string, std::string>{"hf", "bf16", dir_ + "/m-bf16"},
        {"hf", "fp8", dir_ + "/m-fp8"},
        {"gguf", "bf16", dir_ + "/m.gguf"}}) {
    const CliResult e =
        run_cli({"export", "--run", out, "--out", path, "--format", format, "--dtype", dtype}, dir_);
    ASSERT_EQ(e.code, 0) << e.out;
    const CliResult g = run_cli(
        {"generate", "--model", path, "--prompt", "hello", "--max-tokens", "4", "--threads", "1"}, dir_);
    EXPECT_EQ(g.code, 0) << path << ": " << g.out;
  }
}

TEST_F(TrainCli, BadInputExitsOneNamingTheProblem) {
  auto expect_error = [&](std::vector<std::string> args, const std::string& needle) {
    const CliResult r = run_cli(args, dir_);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  };
  // A config whose vocabulary differs from the data's; one whose experts do not split into groups.
  nlohmann::json cfg = nlohmann::json::parse(slurp(FATHOM_TEST_SOURCE_DIR "/tests/train/tiny_config.json"));
  cfg["vocab_size"] = vocab_ + 64;
  std::ofstream(dir_ + "/c1.json") << cfg.dump();
  expect_error({"train", "--data", data_, "--config", dir_ + "/c1.json", "--out", dir_ + "/r1", "--no-peak"},
               "differs from the config's vocab_size");
  cfg["vocab_size"] = vocab_;
  cfg["n_group"] = 3;
  std::ofstream(dir_ + "/c2.json") << cfg.dump();
  expect_error({"train", "--data", data_, "--config", dir_ + "/c2.json", "--out", dir_ + "/r2", "--no-peak"},
               "n_group");
  expect_error({"train", "--data", dir_ + "/nope", "--out", dir_ + "/r3", "--no-peak"},
               "meta.json is missing");
  expect_error({"train", "--data", data_, "--out", dir_ + "/r4", "--resume", "--no-peak"}, "does not exist");
  expect_error({"export", "--run", dir_ + "/r5", "--out", dir_ + "/m"}, "run.json is missing");
}

}  // namespace
}  // namespace fathom
