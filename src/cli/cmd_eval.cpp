// `fathom eval tools|unigram`: the model's two headline figures (docs/MODEL.md). `tools` sends a
// held-out set of tool-use requests to an OpenAI-compatible endpoint and scores the replies;
// `unigram` gives the baseline a trained model's validation loss must beat.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/fs.h"
#include "cli/args.h"
#include "cli/command.h"
#include "eval/eval.h"
#include "train/trainer.h"

namespace fathom::cli {
namespace {

struct ToolsOptions {
  std::string url;
  std::string model = "default";
  std::string set;
  std::string api_key;
  int64_t limit = 0;
  int64_t max_tokens = 256;
  int64_t examples = 10;
  bool json = false;
};

Status tools(const ToolsOptions& o) {
  if (o.set.empty()) return invalid_argument("--set is required (a heldout_tools.jsonl)");
  std::vector<eval::HeldoutRequest> requests = TRY(eval::read_heldout(o.set));
  if (o.limit > 0 && static_cast<size_t>(o.limit) < requests.size())
    requests.resize(static_cast<size_t>(o.limit));
  const auto r = TRY(eval::evaluate_tools(
      requests, {.url = o.url,
                 .model = o.model,
                 .api_key = o.api_key,
                 .max_tokens = o.max_tokens,
                 .examples_max = static_cast<size_t>(std::max<int64_t>(o.examples, 0))}));
  if (!o.json) {
    std::printf("%lld requests in %.1f s\n", static_cast<long long>(r.n), r.seconds);
    std::printf("  right tool, arguments parse: %.1f%% (%lld)\n", 100 * r.correct_fraction(),
                static_cast<long long>(r.n_correct));
    std::printf("  any tool call:               %.1f%% (%lld)\n", 100 * r.any_call_fraction(),
                static_cast<long long>(r.n_any_call));
    std::printf("  failures: wrong tool %lld, bad arguments %lld, no tool call %lld (request errors %lld)\n",
                static_cast<long long>(r.n_wrong_tool), static_cast<long long>(r.n_bad_args),
                static_cast<long long>(r.n_no_call), static_cast<long long>(r.n_errors));
    for (const auto& e : r.examples) {
      std::printf("  - [%s] %s\n    expected %s: %s\n", e["outcome"].get<std::string>().c_str(),
                  e["request"].get<std::string>().c_str(), e["expected_tool"].get<std::string>().c_str(),
                  e["detail"].get<std::string>().c_str());
    }
  }
  if (o.json) {
    nlohmann::json j = {{"n", r.n},
                        {"correct", r.n_correct},
                        {"correct_fraction", r.correct_fraction()},
                        {"any_tool_call", r.n_any_call},
                        {"any_tool_call_fraction", r.any_call_fraction()},
                        {"wrong_tool", r.n_wrong_tool},
                        {"bad_arguments", r.n_bad_args},
                        {"no_tool_call", r.n_no_call},
                        {"request_errors", r.n_errors},
                        {"seconds", r.seconds},
                        {"examples", r.examples}};
    print_json_line(j);
  }
  return {};
}

int run_tools(int argc, char** argv) {
  ToolsOptions o;
  Args args(argv[0],
            "Score tool calls on held-out requests against an OpenAI-compatible endpoint (temperature 0).");
  args.usage("--url URL --set heldout_tools.jsonl [--model NAME] [--limit N] [--json]");
  args.option("--url", &o.url, "base URL of the API, e.g. http://127.0.0.1:8000/v1", "URL");
  args.option("--model", &o.model, "model name sent with each request", "NAME");
  args.option("--set", &o.set, "held-out requests: JSONL of {messages, tools, expected_tool}", "FILE");
  args.option("--api-key", &o.api_key, "Bearer token, when the endpoint needs one", "KEY");
  args.option("--limit", &o.limit, "score only the first N requests (0: all)");
  args.option("--max-tokens", &o.max_tokens, "max_tokens of each request");
  args.option("--examples", &o.examples, "failure examples to print");
  args.flag("--json", &o.json, "print one JSON object");
  args.epilog(
      "A reply is correct when its first tool call names the expected tool and its arguments parse as a\n"
      "JSON object; failed requests count as failures.");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = tools(o); !s.ok()) return fail(args.command(), s);
  return 0;
}

Status unigram(const std::string& dir, bool json) {
  if (dir.empty()) return invalid_argument("--data DIR is required (holding meta.json, train.bin, val.bin)");
  // The trainer's loader: the same validation of meta.json, token ids and loss masks.
  const train::TokenData d = TRY(train::load_token_data(dir, 1));
  const int64_t vocab = d.meta.vocab_size;
  // With loss masks the baseline counts the tokens the trainer scores (its validation loss is over
  // those); the all-token figure is printed beside it.
  const bool masked = d.meta.loss_mask;
  const auto r = TRY(eval::unigram_baseline(d.train, d.val, vocab, d.train_mask, d.val_mask));
  const auto all = masked ? TRY(eval::unigram_baseline(d.train, d.val, vocab)) : r;
  if (json) {
    print_json_line(nlohmann::json({{"unigram_nats", r.cross_entropy_nats},
                                    {"val_unigram_entropy_nats", r.val_entropy_nats},
                                    {"perplexity", std::exp(r.cross_entropy_nats)},
                                    {"n_train", r.n_train},
                                    {"n_val", r.n_val},
                                    {"n_val_unseen", r.n_val_unseen},
                                    {"masked", masked},
                                    {"unigram_nats_all_tokens", all.cross_entropy_nats},
                                    {"vocab_size", vocab}})
                        .dump());
  } else {
    std::printf("unigram cross-entropy of val under train: %.4f nats/token (perplexity %.1f)%s\n",
                r.cross_entropy_nats, std::exp(r.cross_entropy_nats),
                masked ? " over the tokens the loss masks score" : "");
    if (masked) std::printf("over every token: %.4f nats/token\n", all.cross_entropy_nats);
    std::printf(
        "val's own unigram entropy: %.4f nats/token; %lld train, %lld val tokens (%lld unseen in train)\n",
        r.val_entropy_nats, static_cast<long long>(r.n_train), static_cast<long long>(r.n_val),
        static_cast<long long>(r.n_val_unseen));
  }
  return {};
}

int run_unigram(int argc, char** argv) {
  std::string dir;
  bool json = false;
  Args args(
      argv[0],
      "Unigram baseline: cross-entropy (nats/token) of val.bin under train.bin's unigram distribution.");
  args.option("--data", &dir, "directory with meta.json, train.bin, val.bin (fathom-tokens-v1)", "DIR");
  args.flag("--json", &json, "print one JSON object");
  args.epilog("Add-one smoothing over the vocabulary keeps ids unseen in train finite.");
  auto parsed = args.parse(argc, argv);
  if (!parsed.ok()) return fail(args.command(), parsed.status());
  if (!*parsed) return 0;
  if (Status s = unigram(dir, json); !s.ok()) return fail(args.command(), s);
  return 0;
}

int run_eval(int argc, char** argv) {
  const char* usage =
      "usage: fathom eval tools --url URL --set heldout_tools.jsonl [--model NAME] [--limit N] [--json]\n"
      "       fathom eval unigram --data DIR [--json]\n";
  return run_subcommands(argc, argv, usage, {{"tools", run_tools}, {"unigram", run_unigram}});
}

}  // namespace

FATHOM_COMMAND("eval", "Evaluate a model: tool-use score on held-out requests, unigram baseline", run_eval);

}  // namespace fathom::cli
