// `fathom tokenize` and `fathom tokenizer` as a user runs them: stdin byte for byte, flags,
// --decode, and every bad-input case of the issue (invalid UTF-8, malformed tokenizer.json,
// ids out of range) giving a clear error and exit status 1, never a crash.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

using nlohmann::json;
using test::ProcessResult;
using test::run_process;

ProcessResult tokenize(const std::vector<std::string>& flags, const std::string& input) {
  std::vector<std::string> argv = {test::fathom_bin(), "tokenize"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return run_process(argv, input);
}

std::vector<TokenId> parse_ids(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream in(line);
  TokenId id;
  while (in >> id) ids.push_back(id);
  return ids;
}

TEST(TokenizeCli, EncodesStdinByteForByteWithoutAddingSpecialTokens) {
  auto tok = Tokenizer::from_builtin();
  ASSERT_TRUE(tok.ok());
  for (const std::string& text : {std::string("hello world"), std::string("hello world\n"),
                                  std::string("  \n\n x \t"), std::string("<｜User｜>hi"), std::string()}) {
    const ProcessResult r = tokenize({"--tokenizer", "builtin"}, text);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(parse_ids(r.out), (*tok)->encode(text).value()) << test::escape(text);
    const ProcessResult j = tokenize({"--tokenizer", "builtin", "--json"}, text);
    ASSERT_EQ(j.exit_code, 0) << j.err;
    EXPECT_EQ(json::parse(j.out).get<std::vector<TokenId>>(), (*tok)->encode(text).value());
  }
  const ProcessResult special = tokenize({"--tokenizer", "builtin", "--json", "--add-special"}, "hi");
  EXPECT_EQ(json::parse(special.out)[0].get<TokenId>(), (*tok)->bos_id());
  const ProcessResult trusted = tokenize({"--tokenizer", "builtin", "--json"}, "<｜User｜>");
  EXPECT_EQ(json::parse(trusted.out).get<std::vector<TokenId>>(),
            std::vector<TokenId>{(*tok)->chat_tokens().user});
  const ProcessResult untrusted = tokenize({"--tokenizer", "builtin", "--json", "--untrusted"}, "<｜User｜>");
  EXPECT_GT(json::parse(untrusted.out).size(), 1u);
}

TEST(TokenizeCli, DecodesAJsonArrayBackToTheExactText) {
  const std::string text = "Round trip: 🙂 中文 \r\n tabs\t and <｜Assistant｜>\n";
  const ProcessResult enc = tokenize({"--tokenizer", "builtin", "--json"}, text);
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  const ProcessResult dec = tokenize({"--tokenizer", "builtin", "--decode"}, enc.out);
  ASSERT_EQ(dec.exit_code, 0) << dec.err;
  EXPECT_EQ(dec.out, text);
}

void expect_error(const ProcessResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("Aborted"), std::string::npos) << r.err;
}

TEST(TokenizeCli, BadInputGetsAClearErrorNamingTheProblem) {
  expect_error(tokenize({"--tokenizer", "builtin"}, "valid then \xF0\x28\x8C\xBC"),
               "stdin: encode: invalid UTF-8 at byte offset 11");
  expect_error(tokenize({"--tokenizer", "builtin", "--decode"}, "[1, 2, 99999]"), "id 99999 at position 2");
  expect_error(tokenize({"--tokenizer", "builtin", "--decode"}, "[-5]"), "id -5");
  expect_error(tokenize({"--tokenizer", "builtin", "--decode"}, "[1, \"x\"]"), "element 1 is not an integer");
  expect_error(tokenize({"--tokenizer", "builtin", "--decode"}, "not json"), "JSON array of token ids");
  expect_error(tokenize({}, "x"), "--tokenizer is required");
  expect_error(tokenize({"--tokenizer", "/no/such/dir"}, "x"), "'/no/such/dir' does not exist");
}

TEST(TokenizeCli, MalformedTokenizerJsonFilesAreErrorsNotCrashes) {
  const json good = json::parse(builtin_tokenizer_json());
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"missing model", [](json& j) { j.erase("model"); }, "missing 'model'"},
      {"unknown pre-tokenizer",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Sentencepiece"; },
       "pre_tokenizer.pretokenizers[1].type 'Sentencepiece' is not supported"},
      {"merges naming unknown tokens", [](json& j) { j["model"]["merges"][5] = "Ġ qqqqqq"; },
       "model.merges[5] 'Ġ qqqqqq': token 'qqqqqq' is not in the vocabulary"},
      {"truncated file", [](json& j) { j = json(j.dump().substr(0, 1000)); }, "top level must be an object"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    json j = good;
    c.mutate(j);
    test::write_text(dir.path + "/tokenizer.json", j.is_string() ? j.get<std::string>() : j.dump());
    const ProcessResult r = tokenize({"--tokenizer", dir.path}, "hello");
    SCOPED_TRACE(c.what);
    if (j.is_string()) {
      expect_error(r, "not valid JSON");
    } else {
      expect_error(r, c.expect);
      EXPECT_NE(r.err.find(dir.path + "/tokenizer.json"), std::string::npos)
          << "the error names the file: " << r.err;
    }
  }
}

TEST(TokenizerCli, TrainsInfoAndRejectsBadArguments) {
  test::TempDir dir;
  const std::string corpus = test::source_dir() + "/tests/tokenizer/corpus/english.txt";
  ProcessResult r = run_process({test::fathom_bin(), "tokenizer", "train", "--vocab-size", "400", "--out",
                                 dir.path + "/tokenizer.json", "--json", corpus});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json summary = json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(summary["vocab_size"].get<int>(), 400);
  r = run_process({test::fathom_bin(), "tokenizer", "info", dir.path, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["pre"].get<std::string>(), "deepseek-v3");
  expect_error(
      run_process({test::fathom_bin(), "tokenizer", "train", "--out", dir.path + "/t.json", "/no/file.txt"}),
      "/no/file.txt");
  expect_error(run_process({test::fathom_bin(), "tokenizer", "train", "--vocab-size", "10", "--out",
                            dir.path + "/t.json", corpus}),
               "--vocab-size 10 is below");
  expect_error(run_process({test::fathom_bin(), "tokenizer", "train", "--out", dir.path + "/t.json"}),
               "no input files");
  EXPECT_EQ(run_process({test::fathom_bin(), "tokenizer", "bogus"}).exit_code, 2);
}

}  // namespace
}  // namespace fathom
